"""Trainer-side guards: count skipped updates, stop at a limit, report gradient and KL spikes.

The update step itself skips any optimiser step whose gradient is not finite and reports the
fraction skipped as ``guard/nonfinite`` (``jaxagent.rl.guards``). ``UpdateGuard.check`` turns
that into a count per iteration (``guard/skipped_updates``) and a run total
(``guard/skipped_total``, rebuilt from ``metrics.jsonl`` on resume) and the steps skipped
for having no loss token into ``guard/no_token_updates`` (not a fault: never counted towards
the limit), flags iterations whose
gradient norm or approximate KL is a multiple of its running median (``guard/grad_norm_spike``,
``guard/kl_spike``, one line each through ``echo``), judges the run's learning health
(``learning_health``: train success falling over a window, entropy or KL running away; one
``[health]`` line per symptom, the sentences in ``summary.json``), and after the metrics are
logged
``stop_if_needed`` ends the run with ``TrainingStopped`` once the total exceeds
``guards.max_skipped_updates``; the checkpoint before is intact, so nothing is lost.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Callable

from jaxagent.errors import FROZEN, check_positive

_WINDOW = 20  # iterations in the running median
_HEALTH_KEYS = ("step", "train/success", "entropy/mean", "kl/approx_old_new")


@dataclasses.dataclass(**FROZEN)
class GuardSection:
    """Limits on a run's health (``guards.<field>`` in a config)."""

    # stop the run once more optimiser steps than this were skipped for a non-finite loss or
    # gradient, in total over the run (each skip leaves params and optimiser state untouched)
    max_skipped_updates: int = 10
    # report an iteration whose mean gradient norm exceeds this multiple of the running
    # median of the previous ones (0 = off)
    grad_norm_spike: float = 10.0
    kl_spike: float = 10.0  # the same for the approximate KL(old || new) (0 = off)
    # learning health (``learning_health``): iterations in each of the two windows compared
    # (the first ``health_window`` iterations against the latest; 0 = off)
    health_window: int = 5
    # report when the mean train success of the latest window is this much (absolute) below
    # the first window's, the drop being also 2 standard errors, or when held-out success fell
    # at two consecutive evaluations by this much in all
    health_drop: float = 0.15
    # report when the latest window's mean token entropy or approximate KL(old || new) exceeds
    # this multiple of the first window's (0 = off)
    health_entropy_factor: float = 3.0
    health_kl_factor: float = 10.0

    def __post_init__(self):
        check_positive("guards.max_skipped_updates", self.max_skipped_updates, allow_zero=True)
        check_positive("guards.grad_norm_spike", self.grad_norm_spike, allow_zero=True)
        check_positive("guards.kl_spike", self.kl_spike, allow_zero=True)
        check_positive("guards.health_window", self.health_window, allow_zero=True)
        check_positive("guards.health_drop", self.health_drop)
        check_positive("guards.health_entropy_factor", self.health_entropy_factor, allow_zero=True)
        check_positive("guards.health_kl_factor", self.health_kl_factor, allow_zero=True)


class TrainingStopped(RuntimeError):
    """The run stopped on a guard; the message says why and what to change."""


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


class UpdateGuard:
    """Per-run guard state. ``metrics_path``: the run's metrics.jsonl (read on resume)."""

    def __init__(
        self,
        section: GuardSection,
        metrics_path: str | Path | None = None,
        echo: Callable[[str], None] = print,
    ):
        self.section, self.echo = section, echo
        self.metrics_path = Path(metrics_path) if metrics_path else None
        self.total: int | None = None  # loaded lazily: the logger truncates on resume first
        self.history: dict[str, list[float]] = {"grad_norm": [], "kl": []}
        self.records: list[dict] = []  # what ``learning_health`` reads, one row an iteration
        self.reported: set[str] = set()  # the health symptoms echoed so far
        self._stop_message: str | None = None

    def _load(self, before: int) -> None:
        self.total = 0
        if self.metrics_path is None or not self.metrics_path.exists():
            return
        from jaxagent.train.metrics_log import read_jsonl

        for record in read_jsonl(self.metrics_path):
            if int(record.get("step", -1)) < before:
                self.total += int(record.get("guard/skipped_updates", 0) or 0)
                if int(record["step"]) >= 1:
                    self.records.append({k: record[k] for k in _HEALTH_KEYS if k in record})
                for key, name in (("optim/grad_norm", "grad_norm"), ("kl/approx_old_new", "kl")):
                    v = record.get(key)
                    if isinstance(v, (int, float)) and math.isfinite(v):
                        self.history[name].append(float(v))

    def check(self, iteration: int, m: dict) -> dict:
        """Adds the guard metrics to ``m`` (the iteration's metrics, changed in place)."""
        if self.total is None:
            self._load(iteration)
        steps = float(m.get("optim/steps", 0.0) or 0.0)
        frac = m.get("guard/nonfinite", 0.0)
        skipped = steps if not math.isfinite(frac) else round(frac * steps)
        self.total += int(skipped)
        m["guard/skipped_updates"] = int(skipped)
        m["guard/skipped_total"] = self.total
        # steps skipped for want of a loss token (every row of the minibatch dropped): normal
        # in LOOP / DAPO runs, counted apart and never towards the limit
        empty = m.get("guard/no_tokens", 0.0)
        m["guard/no_token_updates"] = int(round(empty * steps)) if math.isfinite(empty) else 0
        if skipped:
            self.echo(
                f"[guard] iteration {iteration}: {int(skipped)} of {int(steps)} optimiser steps "
                f"skipped (non-finite loss or gradient); {self.total} in this run, limit "
                f"guards.max_skipped_updates={self.section.max_skipped_updates}"
            )
        s = self.section
        for key, name, factor in (
            ("optim/grad_norm", "grad_norm", s.grad_norm_spike),
            ("kl/approx_old_new", "kl", s.kl_spike),
        ):
            m[f"guard/{name}_spike"] = 0.0
            value, past = m.get(key), self.history[name]
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                continue
            base = _median(past[-_WINDOW:]) if len(past) >= 3 else None
            if factor and base and base > 0 and value > factor * base:
                m[f"guard/{name}_spike"] = value / base
                self.echo(
                    f"[guard] iteration {iteration}: {key}={value:.4g} is {value / base:.1f}x "
                    f"the running median {base:.4g} (guards.{name}_spike={factor})"
                )
            past.append(float(value))
        self.records.append({k: m[k] for k in _HEALTH_KEYS if k in m} | {"step": iteration})
        health = learning_health(self.records, [], s)
        m["guard/health"] = len(health)
        for kind, sentence in health.items():
            if kind not in self.reported:
                self.reported.add(kind)
                self.echo(f"[health] iteration {iteration}: {sentence}")
        limit = s.max_skipped_updates
        if self.total > limit:
            self._stop_message = (
                f"training stopped after iteration {iteration}: {self.total} optimiser steps "
                f"were skipped for a non-finite loss or gradient, over "
                f"guards.max_skipped_updates={limit}; params and optimiser state are those of "
                "the last finite step and the previous checkpoint is intact. Lower "
                "rl.optim.learning_rate or rl.optim.max_grad_norm, check rewards for NaN/inf, "
                "or raise guards.max_skipped_updates"
            )
        return m

    def stop_if_needed(self) -> None:
        """Raises ``TrainingStopped`` once the limit is exceeded (call after logging)."""
        if self._stop_message:
            raise TrainingStopped(self._stop_message)


def kl_early_stops(metrics_path: str | Path) -> int:
    """Iterations of a finished run whose updates were cut short by ``rl.update.kl_stop``."""
    with Path(metrics_path).open() as f:
        return sum(json.loads(line).get("guard/kl_stopped", 0) > 0 for line in f if line.strip())


def _window_means(series: list[float], w: int) -> tuple[float, float, float]:
    """(mean of the first w, mean of the last w, standard error of their difference)."""
    a, b = series[:w], series[-w:]
    ma, mb = sum(a) / w, sum(b) / w
    var = lambda xs, m: sum((x - m) ** 2 for x in xs) / max(w - 1, 1)  # noqa: E731
    return ma, mb, math.sqrt((var(a, ma) + var(b, mb)) / w)


def learning_health(
    records: list[dict], evals: list[tuple[int, float]], section: GuardSection
) -> dict[str, str]:
    """A sentence for each symptom of a run that is learning badly, by kind
    (``train_success``, ``entropy``, ``kl``, ``eval_success``); empty: healthy.

    Args:
      records: the per-iteration metrics (``metrics.jsonl`` rows with ``step`` >= 1), read for
        ``train/success``, ``entropy/mean`` and ``kl/approx_old_new``.
      evals: (iteration, held-out success) of each evaluation, in order.
      section: the thresholds (``guards.health_*``).

    A symptom needs two full windows of ``health_window`` iterations (the first and the
    latest, not overlapping), so a short run is never judged. Falling train success is the
    policy-gradient failure users lose days to: the update lowers the very reward it ascends.
    """
    w, out = section.health_window, {}
    rows = sorted((r for r in records if int(r.get("step", 0)) >= 1), key=lambda r: r["step"])

    def series(key):
        pts = [(int(r["step"]), r[key]) for r in rows if isinstance(r.get(key), (int, float))]
        return [(i, float(v)) for i, v in pts if math.isfinite(v)]

    if w:
        succ = series("train/success")
        if len(succ) >= 2 * w:
            values = [v for _, v in succ]
            first, last, se = _window_means(values, w)
            if first - last >= section.health_drop and first - last >= 2 * se:
                out["train_success"] = (
                    f"train success fell from {first:.2f} (iterations {succ[0][0]}-"
                    f"{succ[w - 1][0]}) to {last:.2f} (iterations {succ[-w][0]}-{succ[-1][0]}): "
                    "the updates lower the reward they optimise. Likely fixes: a lower "
                    "rl.optim.learning_rate, fewer rl.update.num_epochs, rl.update.kl_stop; "
                    "check the advantage sign and the sampler-learner mismatch (mismatch/*)"
                )
        for kind, key, factor, name, fix in (
            (
                "entropy",
                "entropy/mean",
                section.health_entropy_factor,
                "token entropy ran away",
                "the policy drifts towards noise; lower rl.optim.learning_rate or "
                "rl.loss.entropy_coef",
            ),
            (
                "kl",
                "kl/approx_old_new",
                section.health_kl_factor,
                "the approximate KL(old || new) ran away",
                "each update moves the policy further than the clip allows; lower "
                "rl.optim.learning_rate or set rl.update.kl_stop",
            ),
        ):
            pts = series(key)
            if not factor or len(pts) < 2 * w:
                continue
            first, last, _ = _window_means([v for _, v in pts], w)
            if first > 0 and last > factor * first:
                out[kind] = (
                    f"{name}: {key} {last:.3g} in iterations {pts[-w][0]}-{pts[-1][0]} against "
                    f"{first:.3g} in iterations {pts[0][0]}-{pts[w - 1][0]} "
                    f"({last / first:.1f}x > guards.health_{key.split('/')[0]}_factor="
                    f"{factor:g}): {fix}"
                )
    if len(evals) >= 3:
        (i0, e0), (_, e1), (i2, e2) = evals[-3:]
        if e1 < e0 and e2 < e1 and e0 - e2 >= section.health_drop:
            out["eval_success"] = (
                f"held-out success fell at two consecutive evaluations ({e0:.2f} at iteration "
                f"{i0} -> {e1:.2f} -> {e2:.2f} at iteration {i2}): keep the checkpoint chosen "
                "on validation tasks (eval.val_tasks) and lower rl.optim.learning_rate"
            )
    return out
