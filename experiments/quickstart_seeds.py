"""Run the quickstart main job over several seeds and summarise (docs/results/quickstart.md).

    python experiments/quickstart_seeds.py --seeds 0 1 2 [--parallel] [key=value ...]

Each seed is one `jaxagent train configs/quickstart.yaml train.seed=S` process (its table and
JSON line are printed as it finishes, with the load average). The script ends with a table of
the seeds (the last checkpoint and, with ``eval.val_tasks``, the best-validation one), the mean
gains with 95% t-intervals, and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # works from a checkout without `pip install -e .` too

from jaxagent.eval.report import seed_summary  # noqa: E402


def _load() -> str:
    """The machine's load (wall times mean little without it)."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--config", default=str(ROOT / "configs" / "quickstart.yaml"))
    parser.add_argument("--out", default="runs/quickstart_seeds", help="parent run directory")
    parser.add_argument("--parallel", action="store_true", help="run the seeds concurrently")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    print(f"start; {_load()}", flush=True)
    procs = {}
    for seed in args.seeds:
        cmd = [
            sys.executable,
            "-m",
            "jaxagent.cli",
            "train",
            args.config,
            f"train.seed={seed}",
            f"train.out_dir={args.out}/seed{seed}",
            "train.progress=none",
            *args.overrides,
        ]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                [str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH", "")] if p]
            ),
        }
        procs[seed] = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        if not args.parallel:
            print(procs[seed].communicate()[0], flush=True)
            print(f"seed {seed} done; {_load()}", flush=True)
    results = {}
    for seed, proc in procs.items():
        if args.parallel:
            print(proc.communicate()[0], flush=True)
            print(f"seed {seed} done; {_load()}", flush=True)
        proc.wait()
        if proc.returncode != 0:
            print(f"seed {seed} failed with exit code {proc.returncode}", file=sys.stderr)
            return 1
        results[seed] = json.loads((Path(args.out) / f"seed{seed}" / "summary.json").read_text())
    has_val = all("success_best_val" in r for r in results.values())
    val_cols = f"  {'best-val (iter)':>15}  {'gain':>6}" if has_val else ""
    print(
        f"{'seed':>4}  {'before RL':>9}  {'after RL':>8}  {'gain':>6}{val_cols}  "
        f"{'avg steps':>9}  {'wall s':>7}"
    )
    for seed, r in results.items():
        gain = r["success_after_rl"] - r["success_before_rl"]
        val = ""
        if has_val:
            sel = f"{r['success_best_val']:.3f} ({r['best_val_iteration']})"
            val = f"  {sel:>15}  {r['success_best_val'] - r['success_before_rl']:>+6.3f}"
        print(
            f"{seed:>4}  {r['success_before_rl']:>9.3f}  {r['success_after_rl']:>8.3f}  "
            f"{gain:>+6.3f}{val}  {r['avg_steps']:>9.2f}  {r['wall_s']:>7.0f}"
        )
    line = {"seeds": list(results)}
    for name, key in (("gain", "success_after_rl"), ("gain_best_val", "success_best_val")):
        if key == "success_best_val" and not has_val:
            continue
        diffs = [r[key] - r["success_before_rl"] for r in results.values()]
        stats = seed_summary(diffs)
        what = "last" if name == "gain" else "best-validation checkpoint"
        print(
            f"{name} ({what}) over {stats['n']} seeds: {stats['mean']:+.3f} +- "
            f"{stats['ci95']:.3f} (95% t), min {min(diffs):+.3f}"
        )
        line.update(
            {
                f"{name}_mean": round(stats["mean"], 4),
                f"{name}_ci95": round(stats["ci95"], 4),
                f"{name}_min": round(min(diffs), 4),
            }
        )
    line.update(
        {
            "success_before_rl": [r["success_before_rl"] for r in results.values()],
            "success_after_rl": [r["success_after_rl"] for r in results.values()],
            "wall_s": [r["wall_s"] for r in results.values()],
        }
    )
    if has_val:
        line["success_best_val"] = [r["success_best_val"] for r in results.values()]
        line["best_val_iteration"] = [r["best_val_iteration"] for r in results.values()]
    print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
