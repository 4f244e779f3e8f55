"""Ground-truth replay through the adapter: the BFCL environment health check.

``replay(entry)`` feeds an entry's ground-truth calls, turn by turn, through ``BFCLEnv`` as an
agent would (one action with the turn's calls, then a message ending the turn) and returns the
episode's verdict. ``replay(entry, drop=(turn, index))`` leaves one call out; dropping a
*state-changing* call (one that changes some app instance's public state when the ground truth
runs) must make the entry fail. ``check_category`` runs this for every entry of a category;
``drop_check`` is the suite's figure in ``jaxagent check`` (its expert: ``expert.py``).
"""

from __future__ import annotations

import copy
from typing import Any

from jaxagent.envs import actions as A
from jaxagent.envs.tools.bfcl import data as D
from jaxagent.envs.tools.bfcl.env import BFCLEnv, BFCLEnvConfig


def replay(
    entry: dict, drop: tuple[int, int] | None = None, env: BFCLEnv | None = None
) -> dict[str, Any]:
    """Replays the ground truth (minus the call at ``drop``); returns
    ``{"id", "success", "failure_mode", "turn_results", "error"}``."""
    env = env or BFCLEnv(BFCLEnvConfig(max_steps_per_turn=2))
    env.reset(D.entry_to_task(entry))
    result = None
    for turn, calls in enumerate(entry["ground_truth"]):
        calls = [c for i, c in enumerate(calls) if (turn, i) != drop]
        if calls:
            result = env.step("[" + ", ".join(calls) + "]")
            if result.done:
                break
        result = env.step("Final: done")
        if result.done:
            break
    info = result.info
    failed = [v for v in info.get("turn_results", []) if not v["valid"]]
    error = info.get("error") or (failed[0]["error_message"] if failed else None)
    return {
        "id": entry["id"],
        "success": bool(info["success"]),
        "failure_mode": info["failure_mode"],
        "turn_results": info.get("turn_results"),
        "error": error,
    }


def _public_state(instances: dict[str, Any]) -> dict[str, dict]:
    return {
        name: {k: copy.deepcopy(v) for k, v in vars(inst).items() if not k.startswith("_")}
        for name, inst in instances.items()
    }


def state_changing_calls(entry: dict) -> list[tuple[int, int]]:
    """``(turn, index)`` of every ground-truth call that changes an app's public state."""
    instances = D.make_instances(entry)
    methods = D.public_methods(instances)
    specs = D.tool_specs(entry, methods)
    out = []
    for turn, calls in enumerate(entry["ground_truth"]):
        for index, text in enumerate(calls):
            call = A.parse_action(text).calls[0]
            kwargs = dict(call.kwargs, **dict(zip(specs[call.name].param_order, call.args)))
            before = _public_state(instances)
            D.call_method(methods[call.name], kwargs)
            if _public_state(instances) != before:
                out.append((turn, index))
    return out


def check_category(
    category: str, limit: int | None = None, drop_check: bool = False
) -> dict[str, Any]:
    """Replays every entry's ground truth (first ``limit`` entries if given).

    Returns ``{"category", "tasks", "ground_truth_success", "errors"}``; with ``drop_check``
    also ``"drop_tested"`` (entries with a state-changing call) and ``"drop_failed"`` (how many
    of them fail when their last state-changing call is removed, which should be all).
    """
    entries = D.load_entries(category)[: limit if limit is not None else None]
    errors, wins = [], 0
    drop_tested = drop_failed = 0
    for entry in entries:
        try:
            verdict = replay(entry)
        except Exception as exc:  # report, keep checking the other entries
            verdict = {"id": entry["id"], "success": False, "error": f"{type(exc).__name__}: {exc}"}
        wins += verdict["success"]
        if not verdict["success"]:
            errors.append({"id": entry["id"], "error": verdict["error"]})
        if drop_check:
            changing = state_changing_calls(entry)
            if changing:
                drop_tested += 1
                dropped = replay(entry, drop=changing[-1])
                drop_failed += not dropped["success"]
                if dropped["success"]:
                    errors.append(
                        {
                            "id": entry["id"],
                            "error": f"still succeeds without the "
                            f"state-changing call at (turn, index) {changing[-1]}",
                        }
                    )
    report = {
        "category": category,
        "tasks": len(entries),
        "ground_truth_success": wins / max(1, len(entries)),
        "errors": errors,
    }
    if drop_check:
        report.update(drop_tested=drop_tested, drop_failed=drop_failed)
    return report


def drop_check(tasks, runs) -> dict[str, Any]:
    """Each entry with a state-changing call replayed without its last one: BFCL's state
    checker must then fail it (otherwise the entry cannot tell a right episode from one that
    skipped the work). ``failed_checks`` names every entry whose ground truth failed through
    the pool or that still succeeds without the call."""
    errors = [
        f"{e.task.id}: the ground truth failed ({e.final.info.get('failure_mode')})"
        for e in (runs["expert"].episodes if "expert" in runs else ())
        if not e.success
    ]
    tested = failed = 0
    for task in tasks:
        entry = task.data
        changing = state_changing_calls(entry)
        if not changing:
            continue
        tested += 1
        dropped = replay(entry, drop=changing[-1])
        failed += not dropped["success"]
        if dropped["success"]:
            errors.append(f"{entry['id']}: still succeeds without call {changing[-1]}")
    return {"drop_tested": tested, "drop_failed": failed, "failed_checks": errors[:10]}
