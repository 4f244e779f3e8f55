"""Trainer-side guards: count skipped updates, stop at a limit, report gradient and KL spikes.

The update step itself skips any optimiser step whose gradient is not finite and reports the
fraction skipped as ``guard/nonfinite`` (``jaxagent.rl.guards``). ``UpdateGuard.check`` turns
that into a count per iteration (``guard/skipped_updates``) and a run total
(``guard/skipped_total``, rebuilt from ``metrics.jsonl`` on resume), flags iterations whose
gradient norm or approximate KL is a multiple of its running median (``guard/grad_norm_spike``,
``guard/kl_spike``, one line each through ``echo``), and after the metrics are logged
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

    def __post_init__(self):
        check_positive("guards.max_skipped_updates", self.max_skipped_updates, allow_zero=True)
        check_positive("guards.grad_norm_spike", self.grad_norm_spike, allow_zero=True)
        check_positive("guards.kl_spike", self.kl_spike, allow_zero=True)


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
        self._stop_message: str | None = None

    def _load(self, before: int) -> None:
        self.total = 0
        if self.metrics_path is None or not self.metrics_path.exists():
            return
        from jaxagent.train.metrics_log import read_jsonl

        for record in read_jsonl(self.metrics_path):
            if int(record.get("step", -1)) < before:
                self.total += int(record.get("guard/skipped_updates", 0) or 0)
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
