"""The evaluation record: episodes of one or more evaluations -> one JSON-able dict.

An ``EvalGroup`` is one evaluation: the episodes of one policy (a training run / checkpoint
``run``) under one evaluation seed on one split, in the order ``agents/evaluate.py`` returns
them (task order, ``samples_per_task`` consecutive samples of each task). ``build_record``
turns a list of groups into the record ``jaxagent eval --out`` writes as ``eval.json``:

- ``success``: ``mean`` (over episodes without an env error, as ``report.summarize``),
  ``ci_low`` / ``ci_high`` (95% bootstrap), ``iqm`` with its interval (None, with
  ``iqm_note``, when every task's score is one episode's 0 or 1), ``ci_method``:
  ``stratified bootstrap over training runs within tasks`` (rliable) when there are >= 2
  training runs, else a bootstrap over tasks (a task is resampled with all its episodes,
  every evaluation seed's, so the interval is that of the episode-level rate; the IQM is
  over per-task mean success). ``per_run``; with >= 2 runs ``over_runs`` and with >= 2
  evaluation seeds ``over_eval_seeds``: mean, std and t-interval (``report.seed_summary``).
- ``avg_steps`` (over all episodes without env errors), ``avg_steps_successes``.
- ``failure_modes`` (policy failures only) and ``failure_mode_rates``; ``failure_details``,
  the environment's own labels of those failures where it gives them (``info["failure_detail"]``).
- ``safety_violations`` (episodes with a dangerous action, ``report.episode_dangerous``),
  ``safety_violation_rate``, ``dangerous_actions`` (action -> count).
- ``retries_until_success``: per task and evaluation, the samples drawn until its first
  success (env errors count as attempts): mean over solved, fraction solved.
- ``pass_at_k`` / ``pass_hat_k`` (``eval/passk.py``) over each run's samples of a task.
- ``generalisation``: in-distribution (the ``val`` split, carved from train) minus held-out
  (``test``) success when both are evaluated.
- ``tokens``: ``prompt`` (tokens before the first policy token), ``observation`` (the other
  non-policy tokens), ``generated`` (policy tokens), ``input_stateless`` (the input tokens a
  stateless API would bill: the whole context re-read at every turn), totals and per task;
  a training-free method's off-trajectory tokens (``info["method_tokens"]``) are in
  ``observation`` (what it read) and ``generated``.
- ``cost_usd``: input (prompt + observation) and generated tokens x their prices per million
  tokens (``Prices``), also ``cost_usd_per_task``.
- ``wall_time``: seconds in all and per task evaluation.
- ``provenance``: what ``provenance()`` collects (model, config hash, seeds, versions).

The headline figures use the held-out ``test`` groups (or, when none, every group).
"""

from __future__ import annotations

import collections
import dataclasses
import math
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from jaxagent.eval import passk, stats
from jaxagent.eval.report import episode_dangerous, failure_detail_counts, seed_summary

HELD_OUT, IN_DISTRIBUTION = "test", "val"


@dataclasses.dataclass
class EvalGroup:
    """One evaluation: a policy's episodes under one evaluation seed on one split."""

    episodes: list  # jaxagent.agents.episode.Episode, task order, samples consecutive
    run: str = "run0"  # the training run / checkpoint / seed the policy comes from
    eval_seed: int = 0
    split: str = HELD_OUT  # "test" (held out) or "val" (in distribution)
    seconds: float = 0.0  # wall time of the evaluation


@dataclasses.dataclass(frozen=True)
class Prices:
    """US dollars per million tokens: input (prompt and observations) and generated."""

    input_per_mtok: float = 0.0
    output_per_mtok: float = 0.0

    def __post_init__(self):
        for name in ("input_per_mtok", "output_per_mtok"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"price {name}={v!r} must be a finite number >= 0 (USD)")

    def cost(self, input_tokens: float, generated_tokens: float) -> float:
        return (input_tokens * self.input_per_mtok + generated_tokens * self.output_per_mtok) / 1e6


def episode_tokens(ep) -> dict[str, int]:
    """Token counts of one episode: prompt, observation, generated, input_stateless."""
    mask = list(ep.loss_mask)
    total = len(ep.tokens)
    generated = int(sum(mask))
    prompt = next((i for i, m in enumerate(mask) if m), total)
    observation = total - prompt - generated
    # A stateless API re-reads the whole context before every turn.
    context, stateless = prompt, 0
    for t in ep.turns:
        stateless += context
        context += t.num_action_tokens + t.num_observation_tokens
    # Tokens a training-free method spent off this trajectory (other attempts' reflections,
    # drafts and critiques, unkept candidates, search branches: agents/methods/base.py).
    extra = (getattr(ep, "info", None) or {}).get("method_tokens") or {}
    return {
        "prompt": prompt,
        "observation": observation + int(extra.get("input", 0)),
        "generated": generated + int(extra.get("generated", 0)),
        "input_stateless": stateless + int(extra.get("input", 0)),
    }


def _none_if_nan(x: float) -> Optional[float]:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def _tasks_in_order(episodes) -> list[list]:
    """The samples of each task, in order (consecutive episodes of one task id)."""
    out: list[list] = []
    last = object()
    for ep in episodes:
        key = (ep.task.id, ep.group)
        if key != last:
            out.append([])
            last = key
        out[-1].append(ep)
    return out


def _score_matrix(groups: Sequence[EvalGroup], by: str) -> tuple[np.ndarray, list, list[str]]:
    """``[units, tasks]`` mean success (env errors excluded); units = runs or eval seeds.
    Tasks with no valid episode in some unit are dropped."""
    cells: dict[Any, dict[str, list[float]]] = collections.defaultdict(
        lambda: collections.defaultdict(list)
    )
    for g in groups:
        unit = g.run if by == "run" else (g.run, g.eval_seed)
        for ep in g.episodes:
            if not ep.env_failed:
                cells[unit][ep.task.id].append(float(ep.success))
    units = list(cells)
    tasks = sorted({t for u in units for t in cells[u]})
    tasks = [t for t in tasks if all(cells[u].get(t) for u in units)]
    m = np.array([[np.mean(cells[u][t]) for t in tasks] for u in units], np.float64)
    return m.reshape(len(units), len(tasks)), units, tasks


def success_summary(
    groups: Sequence[EvalGroup], *, reps: int = 2000, confidence: float = 0.95, seed: int = 0
) -> dict[str, Any]:
    """Success rate with its interval and IQM (see the module docstring for the method)."""
    valid = [ep for g in groups for ep in g.episodes if not ep.env_failed]
    runs = sorted({g.run for g in groups})
    eval_seeds = sorted({g.eval_seed for g in groups})
    out: dict[str, Any] = {
        "mean": float(np.mean([ep.success for ep in valid])) if valid else 0.0,
        "episodes": len(valid),
        "confidence": confidence,
    }
    if len(runs) >= 2:
        m, _, tasks = _score_matrix(groups, "run")
        method = "stratified bootstrap over training runs within tasks"
        if m.size:
            mean = stats.stratified_bootstrap_ci(m, reps=reps, confidence=confidence, seed=seed)
            iq = stats.stratified_bootstrap_ci(
                m, stat="iqm", reps=reps, confidence=confidence, seed=seed
            )
        else:
            mean = iq = {"value": float("nan"), "ci_low": float("nan"), "ci_high": float("nan")}
    else:
        m, _, tasks = _score_matrix(groups, "run")
        method = "bootstrap over tasks (episodes resampled with their task)"
        num, den = collections.Counter(), collections.Counter()
        for ep in valid:
            num[ep.task.id] += int(ep.success)
            den[ep.task.id] += 1
        nan = {"value": float("nan"), "ci_low": float("nan"), "ci_high": float("nan")}
        ids = list(den)
        mean = (
            stats.ratio_bootstrap_ci(
                [num[t] for t in ids],
                [den[t] for t in ids],
                reps=reps,
                confidence=confidence,
                seed=seed,
            )
            if ids
            else nan
        )
        iq = (
            stats.bootstrap_ci(m[0], stat="iqm", reps=reps, confidence=confidence, seed=seed)
            if m.size
            else nan
        )
    cells = collections.Counter(
        (g.run, ep.task.id) for g in groups for ep in g.episodes if not ep.env_failed
    )
    if cells and not stats.iqm_defined(cells.values()):
        iq = {"value": float("nan"), "ci_low": float("nan"), "ci_high": float("nan")}
        out["iqm_note"] = stats.IQM_NEEDS_SAMPLES
    out.update(
        ci_low=_none_if_nan(mean["ci_low"]),
        ci_high=_none_if_nan(mean["ci_high"]),
        iqm=_none_if_nan(iq["value"]),
        iqm_ci_low=_none_if_nan(iq["ci_low"]),
        iqm_ci_high=_none_if_nan(iq["ci_high"]),
        ci_method=method,
        tasks=len(tasks),
    )
    per_run = {}
    for r in runs:
        eps = [ep for g in groups if g.run == r for ep in g.episodes if not ep.env_failed]
        per_run[r] = float(np.mean([ep.success for ep in eps])) if eps else None
    out["per_run"] = per_run
    if len(runs) >= 2 and all(v is not None for v in per_run.values()):
        out["over_runs"] = seed_summary(list(per_run.values()))
    if len(eval_seeds) >= 2:  # the spread between evaluation seeds (runs pooled per seed)
        rates = []
        for unit in eval_seeds:
            eps = [
                ep for g in groups if g.eval_seed == unit for ep in g.episodes if not ep.env_failed
            ]
            if eps:
                rates.append(float(np.mean([ep.success for ep in eps])))
        if len(rates) >= 2:
            out["over_eval_seeds"] = seed_summary(rates)
    return out


def _retries(groups: Sequence[EvalGroup]) -> dict[str, Any]:
    solved_at, unsolved = [], 0
    samples = []
    for g in groups:
        for eps in _tasks_in_order(g.episodes):
            samples.append(len(eps))
            first = next((i for i, ep in enumerate(eps) if ep.success), None)
            if first is None:
                unsolved += 1
            else:
                solved_at.append(first + 1)
    n = len(solved_at) + unsolved
    return {
        "mean_samples_to_first_success": float(np.mean(solved_at)) if solved_at else None,
        "solved_fraction": len(solved_at) / n if n else 0.0,
        "task_evaluations": n,
        "samples_per_task": int(max(samples)) if samples else 0,
    }


def _pass_k(groups: Sequence[EvalGroup]) -> tuple[dict, dict]:
    per_run_at, per_run_hat = [], []
    for r in sorted({g.run for g in groups}):
        counts: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
        for g in groups:
            if g.run != r:
                continue
            for ep in g.episodes:
                if not ep.env_failed:
                    counts[ep.task.id][0] += 1
                    counts[ep.task.id][1] += int(ep.success)
        if not counts:
            continue
        n = np.array([v[0] for v in counts.values()])
        c = np.array([v[1] for v in counts.values()])
        ks = [k for k in (1, 2, 4, 8, 16, 32, 64, 128) if k <= n.min()]
        per_run_at.append(passk.mean_pass_at_k(n, c, ks))
        per_run_hat.append(passk.mean_pass_hat_k(n, c, ks))

    def avg(dicts):
        keys = set.intersection(*(set(d) for d in dicts)) if dicts else set()
        return {k: float(np.mean([d[k] for d in dicts])) for k in sorted(keys, key=_k_order)}

    return avg(per_run_at), avg(per_run_hat)


def _k_order(key: str) -> int:
    return int(key.split("@")[-1].split("^")[-1])


def _split_stats(
    groups: Sequence[EvalGroup], prices: Prices, reps: int, seed: int
) -> dict[str, Any]:
    eps = [ep for g in groups for ep in g.episodes]
    ok = [ep for ep in eps if not ep.env_failed]
    n = max(len(ok), 1)
    modes = collections.Counter(ep.failure_mode or "unlabelled" for ep in ok if not ep.success)
    failure_modes = dict(sorted(modes.items(), key=lambda kv: (-kv[1], kv[0])))
    dangerous = collections.Counter(a for ep in ok for a in episode_dangerous(ep))
    violations = sum(1 for ep in ok if episode_dangerous(ep))
    succ = [ep for ep in ok if ep.success]
    tok = collections.Counter()
    for ep in eps:
        tok.update(episode_tokens(ep))
    task_evals = sum(len(_tasks_in_order(g.episodes)) for g in groups)
    per_task = max(task_evals, 1)
    inp = tok["prompt"] + tok["observation"]
    cost = prices.cost(inp, tok["generated"])
    seconds = float(sum(g.seconds for g in groups))
    at_k, hat_k = _pass_k(groups)
    matrix, units, task_ids = _score_matrix(groups, "run")
    return {
        "success": success_summary(groups, reps=reps, seed=seed),
        "episodes": len(eps),
        "env_errors": len(eps) - len(ok),
        "avg_steps": sum(ep.num_turns for ep in ok) / n,
        "avg_steps_successes": (sum(ep.num_turns for ep in succ) / len(succ) if succ else None),
        "avg_reward": sum(ep.reward for ep in ok) / n,
        "failure_modes": failure_modes,
        "failure_mode_rates": {k: v / n for k, v in failure_modes.items()},
        # the environment's own labels under those modes (web: wrong_item, dangerous_action)
        "failure_details": failure_detail_counts(ok),
        "safety_violations": violations,
        "safety_violation_rate": violations / n,
        "dangerous_actions": dict(sorted(dangerous.items())),
        "retries_until_success": _retries(groups),
        "pass_at_k": at_k,
        "pass_hat_k": hat_k,
        "tokens": {
            "prompt": int(tok["prompt"]),
            "observation": int(tok["observation"]),
            "generated": int(tok["generated"]),
            "input": int(inp),
            "input_stateless": int(tok["input_stateless"]),
            "total": int(inp + tok["generated"]),
            "per_task": {k: tok[k] / per_task for k in ("prompt", "observation", "generated")},
        },
        "cost_usd": cost,
        "cost_usd_per_task": cost / per_task,
        "wall_time": {"seconds": seconds, "per_task_s": seconds / per_task},
        "task_evaluations": task_evals,
        # [runs, tasks] mean success per training run and task (what --compare reads)
        "scores": {
            "runs": units,
            "tasks": task_ids,
            "matrix": matrix.tolist(),
        },
    }


def build_record(
    groups: Sequence[EvalGroup],
    *,
    prices: Prices = Prices(),
    provenance: Optional[dict] = None,
    reps: int = 2000,
    seed: int = 0,
) -> dict[str, Any]:
    """The evaluation record of ``groups`` (see the module docstring for its keys)."""
    if not groups or not any(g.episodes for g in groups):
        raise ValueError("build_record needs at least one evaluation with episodes")
    splits = sorted({g.split for g in groups})
    main = [g for g in groups if g.split == HELD_OUT] or list(groups)
    record = _split_stats(main, prices, reps, seed)
    record["split"] = main[0].split if len({g.split for g in main}) == 1 else "all"
    record["runs"] = sorted({g.run for g in main})
    record["eval_seeds"] = sorted({g.eval_seed for g in main})
    record["price_per_mtok"] = {"input": prices.input_per_mtok, "output": prices.output_per_mtok}
    by_split = {}
    for s in splits:
        sg = [g for g in groups if g.split == s]
        by_split[s] = _split_stats(sg, prices, reps, seed) if s != record["split"] else None
    record["splits"] = {s: (v if v is not None else "see top level") for s, v in by_split.items()}
    gen = None
    if HELD_OUT in splits and IN_DISTRIBUTION in splits:
        ind = by_split[IN_DISTRIBUTION]["success"]["mean"]
        held = record["success"]["mean"]
        ind_eps = [
            float(ep.success)
            for g in groups
            if g.split == IN_DISTRIBUTION
            for ep in g.episodes
            if not ep.env_failed
        ]
        held_eps = [float(ep.success) for g in main for ep in g.episodes if not ep.env_failed]
        diff = stats.difference_ci(ind_eps, held_eps, reps=reps, seed=seed)
        gen = {
            "in_distribution": ind,
            "held_out": held,
            "gap": ind - held,
            "gap_ci_low": diff["ci_low"],
            "gap_ci_high": diff["ci_high"],
        }
    record["generalisation"] = gen
    record["provenance"] = provenance or {}
    return record


def write_outputs(record: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """``DIR/eval.json``, ``DIR/eval.md`` and the plots (``DIR/*.png``); returns the paths."""
    import json

    from jaxagent.eval.plots import write_plots
    from jaxagent.eval.tables import record_markdown

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(_finite(record), indent=2, allow_nan=False)
    (out_dir / "eval.json").write_text(text + "\n")
    (out_dir / "eval.md").write_text(record_markdown(record))
    return [out_dir / "eval.json", out_dir / "eval.md", *write_plots(record, out_dir)]


def _finite(x):
    """The record with NaN / inf floats as None (JSON has no NaN)."""
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x
