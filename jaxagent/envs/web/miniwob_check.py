"""MiniWoB++ health check: the scripted solvers over N seeds a task, through the pool.

``check_miniwob(seeds, workers=4)`` runs every (task, seed) episode through an ``EnvPool`` of
``workers`` process workers, each owning one headless Chromium, and reports per-task success,
episodes/s and env steps/s through the pool; then one browser alone (inline) gives the step
latency p50/p95 (action + DOM read-back, the cost a policy pays per turn).
"""

from __future__ import annotations

import collections
import os
import time

import numpy as np

from jaxagent.envs.web.miniwob import (
    MiniWoBEnv,
    MiniWoBEnvConfig,
    MiniWoBFactory,
    MiniWoBTasks,
    MiniWoBTasksConfig,
)
from jaxagent.envs.web.miniwob_solvers import SOLVERS, MiniWoBSolver


def run_through_pool(tasks, workers: int, config: MiniWoBEnvConfig, *, backend: str = "process"):
    """Every task once through the pool with its solver: (episodes, steps, wall seconds,
    health), each episode ``(task, success, info)``; env errors are kept, never dropped."""
    from jaxagent.pool import EnvPool, PoolConfig

    pool_config = PoolConfig(
        num_envs=workers,
        backend=backend,
        step_timeout_s=config.timeout_s + 10,
        reset_timeout_s=config.timeout_s + 30,
        start_timeout_s=120,
        start_method="forkserver",
    )
    episodes, steps = [], 0
    queue = list(tasks)
    start = time.perf_counter()
    with EnvPool(MiniWoBFactory(config), pool_config) as pool:
        running: dict[int, tuple] = {}

        def launch(env_id: int) -> None:
            task = queue.pop(0)
            running[env_id] = (task, MiniWoBSolver(task))
            pool.async_reset([env_id], [task])

        for env_id in range(min(workers, len(queue))):
            launch(env_id)
        while running:
            for r in pool.recv(min_batch=1, timeout=300):
                task, solver = running[r.env_id]
                if r.kind == "step":
                    steps += 1
                if r.done:
                    episodes.append((task, bool(r.info.get("success")), r.info))
                    del running[r.env_id]
                    if queue:
                        launch(r.env_id)
                    continue
                pool.send([r.env_id], [solver.act(r.observation)])
        health = pool.health.snapshot()
    return episodes, steps, time.perf_counter() - start, health


def step_latency(names, seeds: int, config: MiniWoBEnvConfig) -> list[float]:
    """Seconds per ``step`` of one browser (inline), over ``seeds`` episodes of each task."""
    env, latencies = MiniWoBEnv(config), []
    source = MiniWoBTasks(MiniWoBTasksConfig(tasks=tuple(names), num_test=seeds, num_train=0))
    try:
        for task in source.tasks("test"):
            solver = MiniWoBSolver(task)
            obs, done = env.reset(task), False
            while not done:
                action = solver.act(obs)
                t0 = time.perf_counter()
                r = env.step(action)
                latencies.append(time.perf_counter() - t0)
                obs, done = r.observation, r.done
    finally:
        env.close()
    return latencies


def check_miniwob(seeds: int = 50, *, workers: int = 4, tasks=None) -> dict:
    names = tuple(tasks or SOLVERS)
    config = MiniWoBEnvConfig()
    source = MiniWoBTasks(MiniWoBTasksConfig(tasks=names, num_train=0, num_test=seeds))
    episodes, steps, wall, health = run_through_pool(source.tasks("test"), workers, config)
    per_task: dict[str, list[bool]] = collections.defaultdict(list)
    errors = []
    for task, success, info in episodes:
        if info.get("termination") == "env_error":
            errors.append(f"{task.id}: {info.get('env_error')}: {info.get('env_error_detail')}")
            continue
        per_task[task.data["task"]].append(success)
    lat = step_latency(names[:3], 10, config)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"miniwob: {len(episodes)} episodes ({seeds} seeds x {len(names)} tasks), {workers} browsers"
    )
    for name in names:
        wins = per_task.get(name, [])
        print(f"  {name:24s} {np.mean(wins) if wins else float('nan'):.3f} ({len(wins)})")
    print(
        f"  pool: {len(episodes) / wall:.2f} episodes/s, {steps / wall:.2f} steps/s, {wall:.1f} s; "
        f"single browser step p50 {1e3 * np.percentile(lat, 50):.0f} ms, "
        f"p95 {1e3 * np.percentile(lat, 95):.0f} ms; load average {load} on {os.cpu_count()} CPUs"
    )
    wins_all = [w for ws in per_task.values() for w in ws]
    return {
        "suite": "miniwob",
        "episodes": len(episodes),
        "expert_success": float(np.mean(wins_all)) if wins_all else 0.0,
        "per_task": {k: float(np.mean(v)) for k, v in sorted(per_task.items())},
        "errors": errors,
        "workers": workers,
        "episodes_per_s": len(episodes) / wall,
        "env_steps_per_s": steps / wall,
        "wall_s": wall,
        "step_latency_p50_ms": 1e3 * float(np.percentile(lat, 50)),
        "step_latency_p95_ms": 1e3 * float(np.percentile(lat, 95)),
        "load_average": load,
        "pool_health": health,
    }
