"""``python -m jaxagent.envs.robot.manipulation --tasks 100 --envs 2 --backend process``
(``--block-colours 6 --cup-colours 4`` for the wide world): runs the scripted planner on test
tasks through ``jaxagent.pool.EnvPool`` and prints one JSON
line ``{"tasks", "success", "env_steps", "wall_s", "env_steps_per_s", "safety"}``."""

from __future__ import annotations

import argparse
import functools
import json
import time

import numpy as np

from jaxagent.envs.robot.manipulation.env import ManipulationEnv, ManipulationEnvConfig
from jaxagent.envs.robot.manipulation.planner import ScriptedPlanner
from jaxagent.envs.robot.manipulation.tasks import ManipulationConfig, ManipulationWorld
from jaxagent.pool import EnvPool, PoolConfig


def run(
    num_tasks: int,
    num_envs: int,
    backend: str,
    error_rate: float = 0.0,
    split="test",
    **world_options,
):
    world = ManipulationWorld(
        ManipulationConfig(num_test=num_tasks, num_train=num_tasks, **world_options)
    )
    tasks = list(world.tasks(split))[:num_tasks]
    make = functools.partial(ManipulationEnv, ManipulationEnvConfig())  # make(env_id) picklable
    pool = EnvPool(make, PoolConfig(num_envs=num_envs, backend=backend))
    rng = np.random.default_rng(0)
    queue, planners, wins, steps = list(tasks), {}, [], 0
    safety = {"knocked_off": 0, "contact_force": 0, "unreachable": 0}
    start = time.perf_counter()
    try:
        for env_id in range(min(num_envs, len(queue))):
            task = queue.pop(0)
            planners[env_id] = ScriptedPlanner(task, error_rate, rng)
            pool.async_reset([env_id], task)
        while planners:
            for out in pool.recv():
                if out.kind == "step":
                    steps += 1
                if out.done:
                    wins.append(bool(out.info.get("success")))
                    for k in safety:
                        safety[k] += out.info.get("safety", {}).get(k, 0)
                    del planners[out.env_id]
                    if queue:
                        task = queue.pop(0)
                        planners[out.env_id] = ScriptedPlanner(task, error_rate, rng)
                        pool.async_reset([out.env_id], task)
                    continue
                pool.send([out.env_id], [planners[out.env_id].act(out.observation)])
    finally:
        pool.close()
    wall = time.perf_counter() - start
    return {
        "tasks": len(wins),
        "success": float(np.mean(wins)),
        "env_steps": steps,
        "wall_s": round(wall, 2),
        "env_steps_per_s": round(steps / wall, 2),
        "safety": safety,
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=100)
    p.add_argument("--envs", type=int, default=2)
    p.add_argument("--backend", default="process", choices=["thread", "process"])
    p.add_argument("--error-rate", type=float, default=0.0)
    p.add_argument("--block-colours", type=int, default=ManipulationConfig.block_colours)
    p.add_argument("--cup-colours", type=int, default=ManipulationConfig.cup_colours)
    p.add_argument("--balance-kinds", action="store_true")
    args = p.parse_args(argv)
    world = dict(
        block_colours=args.block_colours,
        cup_colours=args.cup_colours,
        balance_kinds=args.balance_kinds,
    )
    print(json.dumps(run(args.tasks, args.envs, args.backend, args.error_rate, **world)))


if __name__ == "__main__":
    main()
