"""Synchronous vs overlapped (asynchronous) training: iteration wall time on the quickstart.

The trainer itself (``jaxagent.train.trainer.Trainer``) on ``configs/quickstart.yaml``, with
environment latency injected by the pool's fault layer (``env.faults.slow``: a call first
sleeps ``slow_s``; which calls are slow is a seeded stream, the same in every mode):

  latency_100ms: every environment call takes 100 ms more;
  long_tail:     5% of calls take 2 s more, the rest none.

Modes: synchronous (``overlap.staleness=0``: collect, then update; the anchor) and
asynchronous colocated ``overlap.staleness=1`` and ``2`` (the rollout of the next batches runs
while the learner updates, on the same devices). Figure: the median ``time/iteration_s`` over
iterations 2.. (the first compiles), i.e. the wall time between two updates. Ceiling: a
perfect overlap hides the shorter of the two phases, so the best asynchronous / synchronous
ratio is max(collect, update) / (collect + update), from the synchronous run's own phase times.
The disaggregated layout (a sampler sub-mesh and a trainer sub-mesh) is not built; it is
reported as such. SFT is off (the untrained policy's answers run long: rollout-heavy).
The last line is one JSON object.

    python benchmarks/async_training.py [--iterations 6] [--profiles latency_100ms,long_tail]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jax  # noqa: E402

from jaxagent.train.config import load_config  # noqa: E402
from jaxagent.train.metrics_log import read_jsonl  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..")
PROFILES = {
    "latency_100ms": ["env.faults.slow=1.0", "env.faults.slow_s=0.1"],
    "long_tail": ["env.faults.slow=0.05", "env.faults.slow_s=2.0"],
}
MODES = {"sync": 0, "async_k1": 1, "async_k2": 2}


def run_mode(profile: str, staleness: int, iterations: int, out: str) -> dict:
    from jaxagent.train.trainer import Trainer

    cfg = load_config(
        os.path.join(ROOT, "configs/quickstart.yaml"),
        [
            *PROFILES[profile],
            "env.pool.backend=thread",
            f"overlap.staleness={staleness}",
            f"train.iterations={iterations}",
            "sft.enabled=false",
            "eval.every=0",
            "eval.num_tasks=8",
            "eval.val_tasks=0",
            "train.checkpoint_every=0",
            "train.progress=none",
            "train.tensorboard=false",
            "train.plot=false",
            f"train.out_dir={out}",
        ],
    )
    t0 = time.perf_counter()
    Trainer(cfg, echo=lambda s: None).run()
    rows = [r for r in read_jsonl(os.path.join(out, "metrics.jsonl")) if "time/iteration_s" in r]
    steady = rows[1:]  # the first iteration compiles the update and the sampler
    it_s = [r["time/iteration_s"] for r in steady]
    upd = [r["time/update_s"] for r in steady]
    return {
        "iteration_s": statistics.median(it_s),
        "update_s": statistics.median(upd),
        "collect_s": statistics.median(i - u for i, u in zip(it_s, upd)),
        "learner_wait_s": statistics.median(r.get("time/learner_wait_s", 0.0) for r in steady),
        "train_success": [round(r["train/success"], 3) for r in rows],
        "run_s": time.perf_counter() - t0,
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--profiles", default=",".join(PROFILES))
    args = ap.parse_args(argv)
    cfg = load_config(os.path.join(ROOT, "configs/quickstart.yaml"), [])
    print(
        f"setup: quickstart world, model {cfg.model.num_layers} layers x "
        f"{cfg.model.hidden_size}, {cfg.rollout.tasks_per_iteration} tasks x "
        f"{cfg.group_size} samples an iteration, {args.iterations} iterations a mode (median "
        f"of iterations 2..), thread pool, no SFT; {platform.processor() or ''} "
        f"{os.cpu_count()} cores, {jax.default_backend()}; disaggregated: not built"
    )
    result: dict = {}
    for profile in args.profiles.split(","):
        rows = {}
        for mode, k in MODES.items():
            with tempfile.TemporaryDirectory() as d:
                rows[mode] = run_mode(profile, k, args.iterations, os.path.join(d, "run"))
            r = rows[mode]
            print(
                f"{profile:>14} {mode:>9}: {r['iteration_s']:.2f} s/iteration (collect "
                f"{r['collect_s']:.2f} s, update {r['update_s']:.2f} s, learner waited "
                f"{r['learner_wait_s']:.2f} s), train success {r['train_success']}",
                flush=True,
            )
        sync = rows["sync"]
        c, u = sync["collect_s"], sync["update_s"]
        ceiling = max(c, u) / max(c + u, 1e-9)
        result[profile] = {
            "async_k1_over_sync": rows["async_k1"]["iteration_s"] / sync["iteration_s"],
            "async_k2_over_sync": rows["async_k2"]["iteration_s"] / sync["iteration_s"],
            "ceiling": ceiling,
            "sync_iteration_s": sync["iteration_s"],
            "async_k1_iteration_s": rows["async_k1"]["iteration_s"],
            "async_k2_iteration_s": rows["async_k2"]["iteration_s"],
            "disaggregated": None,
        }
        x = result[profile]
        print(
            f"{profile:>14}: sync (anchor) {sync['iteration_s']:.2f} s | async k=1 "
            f"{x['async_k1_over_sync']:.2f}x | async k=2 {x['async_k2_over_sync']:.2f}x of the "
            f"synchronous time | ceiling {ceiling:.2f}x (max(collect, update) / sum)"
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
