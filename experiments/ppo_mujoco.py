"""PPO on one of the pool's MuJoCo tasks; ends with one JSON line.

    python experiments/ppo_mujoco.py --env HalfCheetah-v5 --steps 1000000 --seed 0

Runs ``jaxagent.train.ppo_continuous.train`` on configs/ppo_halfcheetah.yaml with the task,
length and seed replaced (``--set key=value`` for any other field, e.g. the vectorised
variant ``--set ppo.num_envs=16 --set ppo.horizon=128``); the curve, summary and checkpoint
go to ``runs/ppo_mujoco/<env>_s<seed>``. ``return_mean`` is the mean return of the last 10
evaluation episodes (the deterministic policy at the end of training).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jaxagent.learners.ppo_continuous.train import train  # noqa: E402


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="HalfCheetah-v5")
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--config", default=str(ROOT / "configs" / "ppo_halfcheetah.yaml"))
    p.add_argument("--out", default="", help="output dir (default runs/ppo_mujoco/ENV_sSEED)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    out = args.out or str(ROOT / "runs" / "ppo_mujoco" / f"{args.env}_s{args.seed}")
    overrides = [
        f"env.name={args.env}",
        f"train.total_steps={args.steps}",
        f"train.seed={args.seed}",
        f"train.out_dir={out}",
        *args.set,
    ]
    s = train(args.config, overrides)
    line = {k: s[k] for k in ("env", "steps", "return_mean", "wall_s", "env_steps_per_s")}
    print(json.dumps(line))
    return line


if __name__ == "__main__":
    main()
