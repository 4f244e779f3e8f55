"""Comparing two evaluation records (``eval.json`` files): B − A with its interval and the
probability of improvement P(B > A).

Both records carry ``scores`` (``[runs, tasks]`` mean success per training run and task);
only the tasks both evaluated are compared. The difference of mean success is bootstrapped
over those tasks, paired (the same tasks are resampled on both sides). P(B > A) is rliable's
probability of improvement (Mann-Whitney over runs per task, averaged over tasks); its
interval is the stratified bootstrap over runs when both sides have >= 2 runs, else a
bootstrap over tasks of the per-task values.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from jaxagent.eval import stats


class RecordError(ValueError):
    """An eval record cannot be read or compared (one-line message naming the file)."""


def load_record(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise RecordError(
            f"{str(path)!r} does not exist; pass an eval.json written by `jaxagent eval --out DIR`"
        ) from None
    except (OSError, json.JSONDecodeError) as err:
        raise RecordError(
            f"{str(path)!r} is not a readable JSON file ({type(err).__name__}); pass an eval.json written by `jaxagent eval --out DIR`"
        ) from None
    if not isinstance(record, dict) or "scores" not in record or "success" not in record:
        raise RecordError(
            f"{str(path)!r} is not an eval record (no 'scores' / 'success'); pass an eval.json written by `jaxagent eval --out DIR`"
        )
    return record


def _matrix(record: dict, tasks: list[str]) -> np.ndarray:
    s = record["scores"]
    col = {t: i for i, t in enumerate(s["tasks"])}
    m = np.asarray(s["matrix"], np.float64).reshape(len(s["runs"]), len(s["tasks"]))
    return m[:, [col[t] for t in tasks]]


def compare_records(
    a: dict, b: dict, *, reps: int = 2000, seed: int = 0, names=("A", "B")
) -> dict[str, Any]:
    """B − A and P(B > A) on the tasks both records scored."""
    common = sorted(set(a["scores"]["tasks"]) & set(b["scores"]["tasks"]))
    if not common:
        raise RecordError(
            f"{names[0]} and {names[1]} share no evaluated task; compare evaluations of the same split"
        )
    ma, mb = _matrix(a, common), _matrix(b, common)
    ta, tb = ma.mean(axis=0), mb.mean(axis=0)  # [tasks]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(common), size=(reps, len(common)))
    lo, hi = np.quantile((tb[idx] - ta[idx]).mean(axis=1), [0.025, 0.975])
    diff = {
        "value": float(tb.mean() - ta.mean()),
        "ci_low": float(lo),
        "ci_high": float(hi),
        "method": "paired bootstrap over tasks",
    }
    if ma.shape[0] >= 2 and mb.shape[0] >= 2:
        poi = stats.probability_of_improvement(mb, ma, reps=reps, seed=seed)
        poi["method"] = "stratified bootstrap over runs within tasks"
    else:
        per_task = np.array(
            [stats._prob_improvement(mb[:, [j]], ma[:, [j]]) for j in range(len(common))]
        )
        ci = stats.bootstrap_ci(per_task, reps=reps, seed=seed)
        poi = {
            "value": float(per_task.mean()),
            "ci_low": ci["ci_low"],
            "ci_high": ci["ci_high"],
            "method": "bootstrap over tasks",
        }
    poi["tasks"] = len(common)
    return {
        "a": {"success": float(ta.mean()), "episodes": a.get("episodes"), "runs": ma.shape[0]},
        "b": {"success": float(tb.mean()), "episodes": b.get("episodes"), "runs": mb.shape[0]},
        "difference": diff,
        "probability_of_improvement": poi,
        "tasks": len(common),
    }
