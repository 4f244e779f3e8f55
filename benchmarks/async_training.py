"""Synchronous vs overlapped (asynchronous) training: iteration wall time on the quickstart.

The trainer itself (``jaxagent.train.trainer.Trainer``) on ``configs/quickstart.yaml``, with
environment latency injected by the pool's fault layer (``env.faults.slow``: a call first
sleeps ``slow_s``; which calls are slow is a seeded stream, the same in every mode):

  latency_100ms: every environment call takes 100 ms more;
  long_tail:     5% of calls take 2 s more, the rest none.

Modes: synchronous (``overlap.staleness=0``: collect, then update; the anchor) and
asynchronous colocated ``overlap.staleness=1`` and ``2`` (the rollout of the next batches runs
while the learner updates, on the same devices), and ``overlap.staleness=1`` with
``overlap.lanes=2`` (two collections in flight: batch i + 1 is collected while batch i is still
out, each lane with its own sampler and environment pool), all on one device; and disaggregated on 8
simulated devices, ``overlap.sampler_devices=4`` with the update on a ``mesh.data=4`` mesh of
the other four, against the synchronous run on that same 4-device mesh (its own anchor). Figure: the median ``time/iteration_s`` over
iterations 2.. (the first compiles), i.e. the wall time between two updates. Ceiling: a
perfect overlap hides the shorter of the two phases, so the best asynchronous / synchronous
ratio is max(collect, update) / (collect + update), from the synchronous run's own phase times;
with two lanes at k = 1 it is max(update, (collect + update) / 2) / (collect + update).
On a CPU the simulated devices share the machine's cores, so the disaggregated figures show
the schedule and its copies, not separate hardware. SFT is off (the untrained policy's answers
run long: rollout-heavy).

Partial rollouts (``--modes lockstep_sync,lockstep_k2,partial_k2``): the lock-step driver
synchronous, at k = 2, and at k = 2 with ``overlap.partial_rollouts``; besides the wall time,
the mean staleness of the trained tokens (versions between the sampler and the learner), which
the switch lowers. The slot engine's switch (it drains the turns on the device first):
``--modes sync,async_k2,slots_partial_k2``.
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
# 8 simulated CPU devices for the disaggregated modes (set before JAX starts; a GPU / TPU
# host uses its own devices).
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402

from jaxagent.train.config import load_config  # noqa: E402
from jaxagent.train.metrics_log import read_jsonl  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..")
PROFILES = {
    "latency_100ms": ["env.faults.slow=1.0", "env.faults.slow_s=0.1"],
    "long_tail": ["env.faults.slow=0.05", "env.faults.slow_s=2.0"],
}
MESH4 = ["mesh.data=4"]
MODES = {  # name -> (staleness, extra settings)
    "sync": (0, []),
    "async_k1": (1, []),
    "async_k2": (2, []),
    "async_k1_lanes2": (1, ["overlap.lanes=2"]),
    "sync_mesh4": (0, MESH4),
    "disagg_k1": (1, [*MESH4, "overlap.sampler_devices=4"]),
    "disagg_k2": (2, [*MESH4, "overlap.sampler_devices=4"]),
}
# Partial rollouts, each driver compared with itself without the switch
# (``--modes lockstep_sync,lockstep_k2,partial_k2`` and ``sync,async_k2,slots_partial_k2``).
LOCKSTEP = ["rollout.engine=lockstep"]
PARTIAL_MODES = {
    "lockstep_sync": (0, LOCKSTEP),
    "lockstep_k2": (2, LOCKSTEP),
    "partial_k2": (2, [*LOCKSTEP, "overlap.partial_rollouts=true"]),
    "slots_partial_k2": (2, ["overlap.partial_rollouts=true"]),
}
ALL_MODES = {**MODES, **PARTIAL_MODES}


def run_mode(profile: str, mode: str, iterations: int, tasks: int, out: str) -> dict:
    from jaxagent.train.trainer import Trainer

    staleness, extra = ALL_MODES[mode]
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
            *([f"rollout.tasks_per_iteration={tasks}"] if tasks else []),
            *extra,
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
        # versions between a trained token's sampler and the learner, from iteration 3 on
        # (every mode's k <= 2, so its first k batches, sampled by the initial weights, are out)
        "staleness_mean": statistics.mean(r.get("async/staleness_mean", 0.0) for r in rows[2:]),
        "train_success": [round(r["train/success"], 3) for r in rows],
        "run_s": time.perf_counter() - t0,
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--profiles", default=",".join(PROFILES))
    ap.add_argument(
        "--modes", default=",".join(MODES), help=f"of {', '.join(ALL_MODES)} (default: the first 6)"
    )
    ap.add_argument("--tasks", type=int, default=0, help="tasks an iteration (0: config's)")
    args = ap.parse_args(argv)
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in ALL_MODES]
    if unknown:
        ap.error(f"--modes: unknown {', '.join(unknown)}; choose from {', '.join(ALL_MODES)}")
    cfg = load_config(os.path.join(ROOT, "configs/quickstart.yaml"), [])
    print(
        f"setup: quickstart world, model {cfg.model.num_layers} layers x "
        f"{cfg.model.hidden_size}, {args.tasks or cfg.rollout.tasks_per_iteration} tasks x "
        f"{cfg.group_size} samples an iteration, {args.iterations} iterations a mode (median "
        f"of iterations 2..), thread pool, no SFT; {platform.processor() or ''} "
        f"{os.cpu_count()} cores, {jax.default_backend()} ({jax.device_count()} devices); "
        f"load average before: {os.getloadavg()[0]:.1f}"
    )
    result: dict = {}
    for profile in args.profiles.split(","):
        rows = {}
        for mode in modes:
            with tempfile.TemporaryDirectory() as d:
                rows[mode] = run_mode(
                    profile, mode, args.iterations, args.tasks, os.path.join(d, "run")
                )
            r = rows[mode]
            print(
                f"{profile:>14} {mode:>9}: {r['iteration_s']:.2f} s/iteration (collect "
                f"{r['collect_s']:.2f} s, update {r['update_s']:.2f} s, learner waited "
                f"{r['learner_wait_s']:.2f} s, staleness {r['staleness_mean']:.2f}), train "
                f"success {r['train_success']}",
                flush=True,
            )
        anchor_mode = "sync" if "sync" in rows else "lockstep_sync"
        sync = rows[anchor_mode]
        c, u = sync["collect_s"], sync["update_s"]
        ceiling = max(c, u) / max(c + u, 1e-9)
        # two lanes at k = 1: batch i + 1 is collected while batch i is still out, so an
        # iteration takes max(update, (collect + update) / 2) (overlap.py)
        lanes_ceiling = max(u, (c + u) / 2) / max(c + u, 1e-9)
        x = {
            "ceiling": ceiling,
            "lanes2_ceiling": lanes_ceiling,
            "sync_iteration_s": sync["iteration_s"],
        }
        for mode, anchor in (
            ("lockstep_k2", "lockstep_sync"),
            ("partial_k2", "lockstep_sync"),
            ("slots_partial_k2", "sync"),
            ("async_k1", "sync"),
            ("async_k1_lanes2", "sync"),
            ("async_k2", "sync"),
            ("disagg_k1", "sync_mesh4"),
            ("disagg_k2", "sync_mesh4"),
        ):
            if mode in rows and anchor in rows:
                name = mode.replace("disagg", "disaggregated")
                x[f"{name}_over_sync"] = rows[mode]["iteration_s"] / rows[anchor]["iteration_s"]
                x[f"{name}_iteration_s"] = rows[mode]["iteration_s"]
        for mode in ("lockstep_k2", "partial_k2", "async_k2", "slots_partial_k2"):
            if mode in rows:
                x[f"{mode}_staleness_mean"] = rows[mode]["staleness_mean"]
        if "sync_mesh4" in rows:
            x["sync_mesh4_iteration_s"] = rows["sync_mesh4"]["iteration_s"]
        result[profile] = x
        shown = " | ".join(f"{k[:-10]} {v:.2f}x" for k, v in x.items() if k.endswith("_over_sync"))
        print(
            f"{profile:>14}: sync (anchor) {sync['iteration_s']:.2f} s | {shown} of the "
            f"synchronous time | ceiling {ceiling:.2f}x (max(collect, update) / sum; two "
            f"lanes at k = 1: {lanes_ceiling:.2f}x, max(update, sum / 2) / sum)",
            flush=True,
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
