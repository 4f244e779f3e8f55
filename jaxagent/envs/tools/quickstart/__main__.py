"""Quickstart world health check: scripted-policy success rates on the held-out split.

  python -m jaxagent.envs.tools.quickstart [--split test] [--seed 0]

Prints one table (policy x level) and a final JSON line with each policy's success rate.
Expected: expert at 0% error 1.0, at 30% about 0.7, random and empty about 0.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from jaxagent.envs.tools import quickstart as Q
from jaxagent.envs.tools.quickstart.expert import run_episode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxagent.envs.tools.quickstart")
    parser.add_argument("--split", default="test", choices=("train", "test"))
    parser.add_argument("--seed", type=int, default=0, help="seed of the policies' randomness")
    args = parser.parse_args(argv)
    world = Q.QuickstartWorld()
    world.check_disjoint()
    tasks = world.tasks(args.split)
    rng = np.random.default_rng(args.seed)
    policies = {
        "expert_0%": lambda t: Q.ExpertPolicy(t, 0.0, rng).act,
        "expert_30%": lambda t: Q.ExpertPolicy(t, 0.3, rng).act,
        "random": lambda t: lambda obs: Q.random_action(t, rng),
        "empty": lambda t: lambda obs: "",
    }
    print(
        f"quickstart world: {len(world.tasks('train'))} train / {len(world.tasks('test'))} "
        f"test tasks (disjoint), {len(Q.vocabulary())} vocabulary words; split={args.split}"
    )
    print(f"{'policy':12s} " + " ".join(f"{lv:>10s}" for lv in Q.LEVELS) + f" {'all':>8s}")
    env, summary = Q.QuickstartEnv(), {}
    for name, make in policies.items():
        wins = {lv: [] for lv in Q.LEVELS}
        for task in tasks:
            wins[task.data["level"]].append(run_episode(env, task, make(task))[2].info["success"])
        rate = float(np.mean([w for ws in wins.values() for w in ws]))
        summary[name] = rate
        print(
            f"{name:12s} "
            + " ".join(
                f"{np.mean(wins[lv]) if wins[lv] else float('nan'):10.3f}" for lv in Q.LEVELS
            )
            + f" {rate:8.3f}"
        )
    print(json.dumps({"split": args.split, "tasks": len(tasks), "success": summary}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
