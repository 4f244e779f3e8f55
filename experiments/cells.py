"""Shared pieces of the experiment runners (``loop_ablation.py``, ``methods_vs_rl.py``,
``seeds_table.py``): a results file of finished cells that a later run continues from, one
``jaxagent train`` per cell, a per-task evaluation of a checkpoint, the machine's
description, and intervals over seeds.

A *cell* is one training run (a variant of a recipe, a world, a seed). Its record is one JSON
line appended to a results file committed in the repository as soon as the cell finishes, so
a killed run, or a later one on another machine, skips the cells already in the file.
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # works from a checkout without `pip install -e .` too

import numpy as np  # noqa: E402

from jaxagent.eval.report import seed_summary  # noqa: E402


# ----------------------------------------------------------------------------- results file


def read_cells(path: Path) -> list[dict]:
    """The records of a results file (a torn last line, from a kill mid-write, is skipped)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def append_cell(path: Path, record: dict) -> None:
    """Append one record as a line, flushed and synced before returning."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def cell_key(record: dict, fields: Sequence[str]) -> tuple:
    return tuple(record.get(f) for f in fields)


# ----------------------------------------------------------------------------- machine


def machine() -> dict:
    """CPU model, core count and memory of this machine (figures depend on them)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "mem_gib": mem,
        "python": platform.python_version(),
    }


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def provenance(load_start: list[float]) -> dict:
    """Where and when a record was measured: the load average at its start and end, the
    machine, the commit and the date (every record in docs/results/ carries them)."""
    return {
        "load_start": load_start,
        "load_end": load_average(),
        "machine": machine(),
        "commit": git_commit(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


def git_commit() -> Optional[str]:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
        return out.stdout.strip() or None
    except OSError:
        return None


# ----------------------------------------------------------------------------- training


def train_command(config: str, overrides: Sequence[str]) -> list[str]:
    """The ``jaxagent train`` command line of a cell (as a user would type it, from the
    repository root)."""
    return [a.replace(f"{ROOT}/", "") for a in ("jaxagent", "train", config, *overrides)]


def run_train(config: str, overrides: Sequence[str], log: Path) -> dict:
    """Run ``jaxagent train`` in a subprocess (output to ``log``); returns its last JSON line.

    Re-running a killed cell resumes it from its newest checkpoint (the trainer's own resume).
    """
    cmd = [sys.executable, "-m", "jaxagent.cli", "train", config, *overrides]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]
        ),
    }
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    lines = log.read_text().splitlines()
    if proc.returncode != 0:
        tail = "\n".join(lines[-30:])
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{tail}")
    for line in reversed(lines):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"no JSON summary line in {log}")


def curves(run_dir: Path) -> dict:
    """Per-iteration train success and the validation / held-out evaluations of a run."""
    from jaxagent.train.metrics_log import read_jsonl

    train, val, test = [], [], []
    for r in read_jsonl(run_dir / "metrics.jsonl"):
        step = int(r["step"])
        if "train/success" in r:
            train.append([step, round(float(r["train/success"]), 4)])
        if "val/success" in r:
            val.append([step, round(float(r["val/success"]), 4)])
        if "eval/success" in r:
            test.append([step, round(float(r["eval/success"]), 4)])
    return {"train": train, "val": val, "test": test}


# ----------------------------------------------------------------------------- evaluation


def evaluate_checkpoint(
    run_dir: Path, step: Any, samples_per_task: int, method: Any = None
) -> dict:
    """Held-out evaluation of a run's checkpoint, per task.

    Args:
      run_dir: a run directory written by ``jaxagent train``.
      step: "latest", "best" or a checkpoint number.
      samples_per_task: k samples of every test task (pass@k needs k >= the largest k).
      method: an optional training-free method around the policy: a mapping in the format of
        ``configs/methods/*.yaml`` (``{"method": "best_of_n", "n": 4, ...}``).

    Returns:
      ``{"tasks": {task_id: [valid samples, successes]}, "episodes", "success", "tokens":
      {prompt, observation, generated, input_stateless} totals, "env_steps", "seconds",
      "iteration"}``; the sampling key is the trainer's evaluation key for the checkpoint.
    """
    from jaxagent.agents.evaluate import evaluate
    from jaxagent.eval.protocol import episode_tokens
    from jaxagent.train.config import load_config
    from jaxagent.train.run import build_run, eval_key
    from jaxagent.train.session import load_policy

    policy = load_policy(run_dir, step)
    config = load_config(
        Path(run_dir) / "config.yaml", [f"eval.samples_per_task={samples_per_task}"]
    )
    iteration = int(policy.meta.get("iteration", 0))
    key = eval_key(config.train.seed, iteration)
    run = build_run(config, policy=policy)
    t0 = time.perf_counter()
    try:
        run_eval = evaluate
        if method is not None:
            from jaxagent.agents.methods.config import method_evaluator, parse_method

            run_eval = method_evaluator(parse_method(dict(method)), run, key, scripted=False)
        result = run_eval(
            run.eval_sampler,
            run.tasks.eval,
            run.rollout,
            key,
            params=run.params,
            samples_per_task=samples_per_task,
        )
    finally:
        run.close()
    tasks: dict[str, list[int]] = {}
    tokens = {"prompt": 0, "observation": 0, "generated": 0, "input_stateless": 0}
    steps = 0
    for ep in result.episodes:
        n_c = tasks.setdefault(str(ep.task.id), [0, 0])
        for k, v in episode_tokens(ep).items():
            if k in tokens:
                tokens[k] += int(v)
        # best-of-N and DFSDT count every candidate's / branch's steps; merged attempts
        # (Reflexion) carry every attempt's turns
        steps += int((ep.info.get("method") or {}).get("env_steps", ep.num_turns))
        if ep.env_failed:
            continue
        n_c[0] += 1
        n_c[1] += int(ep.success)
    n = sum(v[0] for v in tasks.values())
    return {
        "tasks": tasks,
        "episodes": len(result.episodes),
        "success": round(sum(v[1] for v in tasks.values()) / max(n, 1), 4),
        "tokens": tokens,
        "env_steps": steps,
        "seconds": round(time.perf_counter() - t0, 1),
        "iteration": iteration,
    }


# ----------------------------------------------------------------------------- statistics


def t_interval(values: Iterable[float]) -> dict:
    """Mean and 95% Student-t half-width over seeds (``report.seed_summary``)."""
    s = seed_summary(list(values))
    return {"mean": s["mean"], "ci95": s["ci95"], "n": s["n"], "std": s["std"]}


def fmt_interval(s: dict, scale: float = 1.0, digits: int = 3, signed: bool = False) -> str:
    mean = f"{s['mean'] * scale:{'+' if signed else ''}.{digits}f}"
    if s["n"] < 2 or not math.isfinite(s["ci95"]):
        return mean
    return f"{mean} ± {s['ci95'] * scale:.{digits}f}"


def task_matrix(cells: Sequence[dict], key: str = "eval") -> tuple[np.ndarray, np.ndarray]:
    """(n [runs, tasks], c [runs, tasks]) over the tasks every cell evaluated."""
    common = sorted(set.intersection(*(set(c[key]["tasks"]) for c in cells)))
    n = np.array([[c[key]["tasks"][t][0] for t in common] for c in cells], float)
    c_ = np.array([[c[key]["tasks"][t][1] for t in common] for c in cells], float)
    return n, c_
