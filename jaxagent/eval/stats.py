"""Interval estimates for evaluation scores: percentile bootstrap, IQM, rliable's stratified
bootstrap and probability of improvement.

- ``bootstrap_ci(x)``: a statistic (mean or IQM) of the last axis of ``x`` with its percentile
  bootstrap interval; leading axes are independent samples (vectorised: one index draw
  ``[..., reps, n]``), so a coverage simulation costs one call.
- ``iqm(x)``: the interquartile mean, the mean of the middle 50% of the sorted scores
  (``scipy.stats.trim_mean(x, 0.25)``; Agarwal et al. 2021, "Deep RL at the Edge of the
  Statistical Precipice").
- ``stratified_bootstrap_ci(scores)``: ``scores[run, task]`` (run = training seed or
  checkpoint, a score = that run's success rate on that task, over evaluation seeds and
  samples); each replicate resamples runs with replacement independently within every task
  (the task is the stratum), then applies the aggregate (mean or IQM over all cells), as
  rliable's ``StratifiedBootstrap`` does.
- ``probability_of_improvement(x, y)``: P(X > Y) per task by the Mann-Whitney statistic over
  runs (ties count 1/2), averaged over tasks, with a stratified bootstrap interval that
  resamples the runs of ``x`` and of ``y`` independently.

Everything takes a ``seed`` (a ``numpy.random.Generator`` is built from it), so an interval
is reproducible. Pure numpy.
"""

from __future__ import annotations

from typing import Callable, Union

import numpy as np

Stat = Union[str, Callable[[np.ndarray], np.ndarray]]


# With one episode a cell (one sample a task, one evaluation seed), every score is 0 or 1,
# and the middle half of 0/1 scores is a single value: a 0.75 success rate has an IQM of 1.0,
# 0.25 one of 0.0. rliable's IQM (Agarwal et al. 2021, arXiv 2108.13264) is over scores that
# average several episodes; the record leaves it out (None) with this reason instead.
IQM_NEEDS_SAMPLES = (
    "IQM needs scores averaged over several episodes; with one sample a task every score is "
    "0 or 1 and the middle half is a single value (evaluate with samples_per_task >= 2 or "
    "several seeds)"
)


def iqm_defined(episodes_per_cell) -> bool:
    """Whether an IQM of per-cell mean scores says anything: some cell (a task, or a task in
    one run) averages more than one episode (``IQM_NEEDS_SAMPLES``)."""
    sizes = list(episodes_per_cell)
    return bool(sizes) and max(sizes) > 1


def iqm(x, axis: int = -1) -> np.ndarray:
    """Interquartile mean along ``axis``: drop ``floor(n/4)`` scores at each end of the sorted
    values and average the rest (equal to ``scipy.stats.trim_mean(x, 0.25, axis)``)."""
    x = np.sort(np.asarray(x, np.float64), axis=axis)
    n = x.shape[axis]
    if n == 0:
        raise ValueError("iqm needs at least one score")
    cut = int(0.25 * n)
    return np.take(x, np.arange(cut, n - cut), axis=axis).mean(axis=axis)


def _stat_fn(stat: Stat) -> Callable[[np.ndarray], np.ndarray]:
    if callable(stat):
        return stat
    table = {"mean": lambda a: np.mean(a, axis=-1), "iqm": lambda a: iqm(a, axis=-1)}
    if stat not in table:
        raise ValueError(f"stat={stat!r} is not known; use one of {sorted(table)} or a callable")
    return table[stat]


def _check_confidence(confidence: float) -> float:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence={confidence!r} must lie in (0, 1), e.g. 0.95")
    return (1.0 - confidence) / 2.0


def bootstrap_ci(
    x, *, stat: Stat = "mean", reps: int = 2000, confidence: float = 0.95, seed: int = 0
) -> dict[str, np.ndarray]:
    """A statistic of the last axis of ``x`` with its percentile bootstrap interval.

    Args:
      x: scores ``[..., n]``; leading axes are independent sets (each bootstrapped alone).
      stat: "mean", "iqm" or a function of ``[..., n]`` arrays reducing the last axis.
      reps: bootstrap replicates.
      confidence: the interval's nominal coverage.
      seed: seeds the ``numpy.random.Generator`` that draws the resamples.

    Returns:
      ``{"value", "ci_low", "ci_high"}``, each of shape ``x.shape[:-1]`` (floats for 1-d x).
    """
    x = np.asarray(x, np.float64)
    if x.ndim == 0 or x.shape[-1] == 0:
        raise ValueError(
            f"bootstrap_ci needs at least one score on the last axis (shape {x.shape})"
        )
    lo_q = _check_confidence(confidence)
    fn = _stat_fn(stat)
    rng = np.random.default_rng(seed)
    n = x.shape[-1]
    idx = rng.integers(0, n, size=x.shape[:-1] + (reps, n))
    resampled = np.take_along_axis(x[..., None, :], idx, axis=-1)  # [..., reps, n]
    dist = fn(resampled)  # [..., reps]
    lo, hi = np.quantile(dist, [lo_q, 1.0 - lo_q], axis=-1)
    out = {"value": fn(x), "ci_low": lo, "ci_high": hi}
    return {k: (float(v) if np.ndim(v) == 0 else v) for k, v in out.items()}


def _resample_runs(scores: np.ndarray, reps: int, rng: np.random.Generator) -> np.ndarray:
    """``[reps, runs, tasks]``: per replicate and task, runs drawn with replacement."""
    runs, tasks = scores.shape
    idx = rng.integers(0, runs, size=(reps, runs, tasks))
    return np.take_along_axis(np.broadcast_to(scores, (reps, runs, tasks)), idx, axis=1)


def _as_matrix(scores, name: str) -> np.ndarray:
    scores = np.asarray(scores, np.float64)
    if scores.ndim != 2 or scores.size == 0:
        raise ValueError(
            f"{name} must be a non-empty [runs, tasks] matrix of scores, got shape {scores.shape}"
        )
    return scores


def stratified_bootstrap_ci(
    scores, *, stat: Stat = "mean", reps: int = 2000, confidence: float = 0.95, seed: int = 0
) -> dict[str, float]:
    """An aggregate of ``scores[run, task]`` with its stratified bootstrap interval.

    Each replicate resamples the runs independently within every task and applies ``stat``
    to all ``runs * tasks`` cells (mean, or IQM as rliable aggregates).

    Returns:
      ``{"value", "ci_low", "ci_high"}``.
    """
    scores = _as_matrix(scores, "scores")
    lo_q = _check_confidence(confidence)
    fn = _stat_fn(stat)
    rng = np.random.default_rng(seed)
    boot = _resample_runs(scores, reps, rng).reshape(reps, -1)
    dist = fn(boot)
    lo, hi = np.quantile(dist, [lo_q, 1.0 - lo_q])
    return {"value": float(fn(scores.reshape(1, -1))[0]), "ci_low": float(lo), "ci_high": float(hi)}


def _prob_improvement(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P(X > Y) + P(X = Y)/2 per task, averaged over tasks; x ``[..., m, T]``, y ``[..., n, T]``."""
    gt = (x[..., :, None, :] > y[..., None, :, :]).mean(axis=(-3, -2))
    eq = (x[..., :, None, :] == y[..., None, :, :]).mean(axis=(-3, -2))
    return (gt + 0.5 * eq).mean(axis=-1)


def probability_of_improvement(
    x, y, *, reps: int = 2000, confidence: float = 0.95, seed: int = 0
) -> dict[str, float]:
    """P(X > Y): the probability that a run of X beats a run of Y on a random task.

    Args:
      x: ``[runs_x, tasks]`` scores of algorithm X (e.g. per-task success per training seed).
      y: ``[runs_y, tasks]`` scores of algorithm Y on the same tasks.

    Returns:
      ``{"value", "ci_low", "ci_high"}``; 0.5 means no difference, 1 means X always wins.
    """
    x, y = _as_matrix(x, "x"), _as_matrix(y, "y")
    if x.shape[1] != y.shape[1]:
        raise ValueError(
            f"x and y must score the same tasks: x has {x.shape[1]} tasks, y has {y.shape[1]}"
        )
    lo_q = _check_confidence(confidence)
    rng = np.random.default_rng(seed)
    dist = _prob_improvement(_resample_runs(x, reps, rng), _resample_runs(y, reps, rng))
    lo, hi = np.quantile(dist, [lo_q, 1.0 - lo_q])
    return {"value": float(_prob_improvement(x, y)), "ci_low": float(lo), "ci_high": float(hi)}


def difference_ci(
    x, y, *, reps: int = 2000, confidence: float = 0.95, seed: int = 0
) -> dict[str, float]:
    """mean(x) - mean(y) with a percentile bootstrap interval (x and y resampled
    independently; 1-d scores, e.g. per-episode success of two evaluations)."""
    x, y = np.asarray(x, np.float64).ravel(), np.asarray(y, np.float64).ravel()
    if x.size == 0 or y.size == 0:
        raise ValueError("difference_ci needs at least one score on each side")
    lo_q = _check_confidence(confidence)
    rng = np.random.default_rng(seed)
    bx = x[rng.integers(0, x.size, size=(reps, x.size))].mean(axis=1)
    by = y[rng.integers(0, y.size, size=(reps, y.size))].mean(axis=1)
    lo, hi = np.quantile(bx - by, [lo_q, 1.0 - lo_q])
    return {"value": float(x.mean() - y.mean()), "ci_low": float(lo), "ci_high": float(hi)}


def ratio_bootstrap_ci(
    num, den, *, reps: int = 2000, confidence: float = 0.95, seed: int = 0
) -> dict[str, float]:
    """sum(num) / sum(den) with a cluster bootstrap interval: clusters (e.g. tasks with
    ``num`` successes out of ``den`` valid episodes) are resampled with replacement, so the
    interval is that of the episode-level rate even when clusters differ in size."""
    num, den = np.asarray(num, np.float64).ravel(), np.asarray(den, np.float64).ravel()
    if num.shape != den.shape or num.size == 0 or den.sum() <= 0:
        raise ValueError(
            f"ratio_bootstrap_ci needs matching non-empty num/den with sum(den) > 0 "
            f"(shapes {num.shape}, {den.shape})"
        )
    lo_q = _check_confidence(confidence)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, num.size, size=(reps, num.size))
    d = den[idx].sum(axis=1)
    dist = num[idx].sum(axis=1) / np.where(d > 0, d, np.nan)
    lo, hi = np.nanquantile(dist, [lo_q, 1.0 - lo_q])
    return {"value": float(num.sum() / den.sum()), "ci_low": float(lo), "ci_high": float(hi)}
