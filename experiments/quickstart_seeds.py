"""Run the quickstart main job over several seeds and summarise (the issue's acceptance run).

    python experiments/quickstart_seeds.py --seeds 0 1 2 [--parallel] [key=value ...]

Each seed is one `jaxagent train configs/quickstart.yaml train.seed=S` process (its table and
JSON line are printed as it finishes). The script ends with a table of the seeds, the mean
gain with a 95% t-interval, and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from jaxagent.eval.report import seed_summary

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--config", default=str(ROOT / "configs" / "quickstart.yaml"))
    parser.add_argument("--out", default="runs/quickstart_seeds", help="parent run directory")
    parser.add_argument("--parallel", action="store_true", help="run the seeds concurrently")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    procs = {}
    for seed in args.seeds:
        cmd = [sys.executable, "-m", "jaxagent.cli", "train", args.config, f"train.seed={seed}",
               f"train.out_dir={args.out}/seed{seed}", "train.progress=none", *args.overrides]
        procs[seed] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       text=True)
        if not args.parallel:
            print(procs[seed].communicate()[0], flush=True)
    results = {}
    for seed, proc in procs.items():
        if args.parallel:
            print(proc.communicate()[0], flush=True)
        proc.wait()
        if proc.returncode != 0:
            print(f"seed {seed} failed with exit code {proc.returncode}", file=sys.stderr)
            return 1
        results[seed] = json.loads((Path(args.out) / f"seed{seed}" / "summary.json").read_text())
    print(f"{'seed':>4}  {'before RL':>9}  {'after RL':>8}  {'gain':>6}  {'avg steps':>9}  "
          f"{'wall s':>7}")
    for seed, r in results.items():
        gain = r["success_after_rl"] - r["success_before_rl"]
        print(f"{seed:>4}  {r['success_before_rl']:>9.3f}  {r['success_after_rl']:>8.3f}  "
              f"{gain:>+6.3f}  {r['avg_steps']:>9.2f}  {r['wall_s']:>7.0f}")
    gains = seed_summary([r["success_after_rl"] - r["success_before_rl"]
                          for r in results.values()])
    print(f"gain over {gains['n']} seeds: {gains['mean']:+.3f} +- {gains['ci95']:.3f} (95% t)")
    print(json.dumps({
        "seeds": list(results), "gain_mean": round(gains["mean"], 4),
        "gain_ci95": round(gains["ci95"], 4),
        "gain_min": round(min(r["success_after_rl"] - r["success_before_rl"]
                              for r in results.values()), 4),
        "success_before_rl": [r["success_before_rl"] for r in results.values()],
        "success_after_rl": [r["success_after_rl"] for r in results.values()],
        "wall_s": [r["wall_s"] for r in results.values()]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
