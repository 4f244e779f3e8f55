"""Soak test: train on the quickstart world for M minutes with faults injected everywhere.

    nice -n 19 python experiments/soak.py --minutes 30 [--out runs/soak] [key=value ...]

The quickstart config (SFT off, a small batch, the process pool backend, no periodic
evaluation) trains with ``FaultyEnv`` on every environment call: hangs (the pool's timeout
fires and the worker is restarted), crashes (real worker-process deaths), corrupt replies
(protocol violations) and slow calls, plus one NaN injected into one behaviour log-prob of one
iteration, which makes the loss and gradient of every minibatch step holding that row NaN
(the update guard must skip exactly those steps and training must carry on). Checkpoints are
written every 5 iterations, as in a real run.

Every 5 s a thread samples the resident memory of the trainer process and the proportional
set size of its pool workers (they fork from one fork server and share its pages: their RSS
would count them once per worker), and each iteration records its peak resident memory
(Linux ``VmHWM``), which does not depend on where in the iteration a sample falls. The
trainer runs with its default memory settings (``jaxagent.perf.host_memory``). At the end:
``soak.png`` (memory and throughput over time), ``soak.json`` (with fits of the per-iteration
peaks and of the memory after the last XLA compilation), and one JSON line with minutes, iterations, episodes in (asked for) and out (returned, whatever their
termination), faults injected vs recovered (a hang recovered = a pool timeout, a crash = a
worker death detected and replaced, a corrupt reply = a protocol violation caught; a slow call
recovers by completing; the NaN by a skipped update that left the parameters finite),
skipped updates, and the slope of a least-squares line through the trainer's memory after
the warm-up (the first two iterations: compilation, pool start; at least the first 20% of the
run), in MB per hour.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

OVERRIDES = [
    "sft.enabled=false",
    "env.pool.backend=process",
    "env.pool.num_envs=8",
    "env.pool.step_timeout_s=1.0",
    "rollout.tasks_per_iteration=8",
    "rollout.samples_per_task=4",
    "rl.update.minibatch_size=16",
    "eval.every=0",
    "eval.val_tasks=0",
    "eval.num_tasks=8",
    "train.iterations=1000000",
    "train.progress=none",
    "train.tensorboard=false",
    "train.plot=false",
    "train.resume=false",
    "guards.max_skipped_updates=1000",
]


class MemorySampler(threading.Thread):
    """(t, trainer RSS MB, trainer RSS + children's PSS MB) every ``every`` seconds."""

    def __init__(self, every: float = 5.0):
        super().__init__(daemon=True)
        import psutil

        self.proc, self.every, self.samples = psutil.Process(), every, []
        self._halt = threading.Event()
        self.t0 = time.monotonic()

    def sample(self) -> None:
        own = self.proc.memory_info().rss
        kids = 0
        for child in self.proc.children(recursive=True):
            try:  # PSS: workers share the fork server's pages; RSS would count them again
                kids += child.memory_full_info().pss
            except Exception:  # noqa: BLE001 - a worker that just died (injected crash)
                pass
        self.samples.append((time.monotonic() - self.t0, own / 2**20, (own + kids) / 2**20))

    def run(self) -> None:
        while not self._halt.wait(self.every):
            self.sample()

    def stop(self) -> None:
        self._halt.set()


def peak_rss_mb(reset: bool = False) -> float:
    """This process's peak resident memory (MiB) since the last reset (Linux ``VmHWM``;
    ``reset`` starts a new peak through ``/proc/self/clear_refs``), NaN where unavailable. The
    peak of each iteration does not depend on when a sample falls in the iteration's phases,
    which move the 5 s samples by +-60 MB here."""
    try:
        if reset:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024
    except (OSError, StopIteration):
        return float("nan")


def object_census() -> dict:
    """Live Python objects by type: a Python-level leak grows some type's count steadily,
    native growth (XLA buffers, allocator arenas) leaves them flat while RSS rises."""
    import collections
    import gc

    gc.collect()
    return dict(collections.Counter(type(o).__name__ for o in gc.get_objects()))


def census_growth(first: dict, last: dict, top: int = 8) -> dict:
    grown = {k: last.get(k, 0) - first.get(k, 0) for k in set(first) | set(last)}
    return dict(sorted(grown.items(), key=lambda kv: -kv[1])[:top])


def slope_fit(samples: list, warm_s: float = 0.0, skip_frac: float = 0.2) -> dict:
    """Least-squares slope of trainer RSS over time after the warm-up (``warm_s``, or the first
    ``skip_frac`` of the run if later), MB/hour (+- stderr)."""
    arr = np.asarray(samples, np.float64)
    if len(arr):
        arr = arr[arr[:, 0] >= max(warm_s, skip_frac * arr[-1, 0])]
    if len(arr) < 3:
        return {"slope_mb_per_hour": float("nan"), "stderr": float("nan"), "n": len(arr)}
    t_h, mb = arr[:, 0] / 3600.0, arr[:, 1]
    slope, intercept = np.polyfit(t_h, mb, 1)
    pred = slope * t_h + intercept
    dof = max(len(arr) - 2, 1)
    se = np.sqrt(np.sum((mb - pred) ** 2) / dof / np.sum((t_h - t_h.mean()) ** 2))
    return {
        "slope_mb_per_hour": float(slope),
        "stderr": float(se),
        "n": int(len(arr)),
        "from_s": float(arr[0, 0]),
        "to_s": float(arr[-1, 0]),
        "mean_mb": float(mb.mean()),
    }


def plot(path: Path, samples: list, iters: list) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arr = np.asarray(samples)
    fig, (a, b) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    if len(arr):
        a.plot(arr[:, 0] / 60, arr[:, 1], label="trainer RSS")
        a.plot(arr[:, 0] / 60, arr[:, 2], label="trainer RSS + pool workers PSS")
    a.set_ylabel("MiB")
    a.legend()
    a.set_title("soak: memory and throughput under injected faults")
    if iters:
        t = [x["t_s"] / 60 for x in iters]
        b.plot(t, [x["episodes_per_s"] for x in iters], ".-")
    b.set_ylabel("episodes / s (per iteration)")
    b.set_xlabel("minutes")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--out", default="runs/soak")
    parser.add_argument("--hang", type=float, default=0.002)
    parser.add_argument("--crash", type=float, default=0.002)
    parser.add_argument("--corrupt", type=float, default=0.002)
    parser.add_argument("--slow", type=float, default=0.01)
    parser.add_argument("--nan-iteration", type=int, default=3, help="iteration given a NaN")
    parser.add_argument(
        "--census-every", type=int, default=50, help="iterations between object censuses"
    )
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    if args.minutes <= 0:
        parser.error(f"--minutes {args.minutes} must be > 0 (the soak's duration)")

    import jax

    from jaxagent.envs.faults import FaultConfig, FaultLog, FaultyEnvFactory
    import jaxagent.train.run as run_mod
    import jaxagent.train.trainer as trainer_mod
    from jaxagent.train.config import load_config

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # each soak starts fresh (train.resume=false): the previous soak's run is scratch
    shutil.rmtree(out / "run", ignore_errors=True)
    config = load_config(
        ROOT / "configs" / "quickstart.yaml",
        [*OVERRIDES, f"train.out_dir={out}/run", *args.overrides],
    )
    faults = FaultConfig(
        hang=args.hang,
        crash=args.crash,
        corrupt=args.corrupt,
        slow=args.slow,
        hang_s=4 * config.env.pool.step_timeout_s,
        slow_s=0.05,
        seed=config.train.seed,
    )
    log = FaultLog.create()  # the pool's start method: PoolConfig's default, forkserver
    make_runner = run_mod.make_runner

    def faulty_runner(cfg, **kw):  # the configured pool, every env wrapped in FaultyEnv
        runner = make_runner(cfg, **kw)
        runner._env_fn = FaultyEnvFactory(runner._env_fn, faults, log)
        return runner

    run_mod.make_runner = faulty_runner
    counts = {"episodes_in": 0, "episodes_out": 0}
    collect = trainer_mod.collect_episodes

    def counted_collect(policy, params, tasks, *, samples_per_task, **kw):
        counts["episodes_in"] += len(tasks) * samples_per_task
        eps, stats = collect(policy, params, tasks, samples_per_task=samples_per_task, **kw)
        counts["episodes_out"] += len(eps)
        return eps, stats

    trainer_mod.collect_episodes = counted_collect
    sampler = MemorySampler()
    # Every XLA compilation (sampler buckets, update shapes, evaluation) adds an executable
    # that stays cached: memory growth before the last one is the cache filling, not a leak.
    compiles = {"n": 0, "last_s": 0.0}

    def on_compile(event: str, duration_s: float, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles["n"] += 1
            compiles["last_s"] = time.monotonic() - sampler.t0

    jax.monitoring.register_event_duration_secs_listener(on_compile)
    trainer = trainer_mod.Trainer(config, echo=lambda line: print(line, flush=True))
    update = trainer.update_step
    nan_state = {"done": False}

    def poisoned_update(state, batch, _it=[0]):  # noqa: B006 - the iteration counter
        if _it[0] == args.nan_iteration and not nan_state["done"]:
            # one NaN behaviour log-prob on a sampled token: the importance ratio, the loss and
            # the gradient of every minibatch step that holds this row are NaN
            old = np.array(batch.old_logprobs, copy=True)
            row, col = np.argwhere(np.asarray(batch.loss_mask) > 0)[0]
            old[row, col] = np.nan
            batch = batch.replace(old_logprobs=old)
            nan_state["done"] = True
        _it[0] += 1
        return update(state, batch)

    trainer.update_step = poisoned_update
    t_start = time.monotonic()
    trainer._t_run, trainer._wall_offset = trainer._t_init, 0.0
    state, start, history, extra, _ = trainer._start_or_resume()
    sampler.start()
    sampler.sample()
    iters, skipped, it = [], 0, start
    censuses: list[tuple[int, int, dict]] = []  # (iteration, total objects, by type)
    deadline = t_start + 60 * args.minutes
    while time.monotonic() < deadline:
        before = counts["episodes_out"]
        t0 = time.monotonic()
        peak_rss_mb(reset=True)
        state, m = trainer.iteration(state, it)
        done = it + 1
        trainer.guard.check(done, m)
        skipped += int(m["guard/skipped_updates"])
        trainer.logger.log(done, m)
        trainer.guard.stop_if_needed()
        n_eps = counts["episodes_out"] - before
        iters.append(
            {
                "iteration": done,
                "t_s": time.monotonic() - sampler.t0,
                "episodes_per_s": n_eps / max(time.monotonic() - t0, 1e-9),
                "skipped": int(m["guard/skipped_updates"]),
                "compiles": compiles["n"],
            }
        )
        print(
            f"[soak] it {done} t={iters[-1]['t_s'] / 60:.1f}min eps/s={iters[-1]['episodes_per_s']:.2f} "
            f"rss={sampler.samples[-1][1]:.0f}MB skipped={skipped} load={os.getloadavg()[0]:.1f}",
            flush=True,
        )
        if done % 5 == 0:
            trainer._save(done, state, history, extra, None, {})
        iters[-1]["peak_rss_mb"] = peak_rss_mb()
        if args.census_every and done % args.census_every == 0:
            by_type = object_census()
            censuses.append((done, sum(by_type.values()), by_type))
        it = done
    trainer.checkpointer.wait()
    sampler.sample()
    sampler.stop()
    finite = all(
        bool(np.all(np.isfinite(np.asarray(x))))
        for x in jax.tree.leaves(state.params)
        if np.issubdtype(np.asarray(x).dtype, np.floating)
    )
    health = trainer.runner.health()
    trainer.close()
    injected = log.counts()
    recovered = {
        "hang": int(health.get("timeouts", 0)),
        "crash": int(health.get("crashes", 0)),
        "corrupt": int(health.get("corrupt", 0)),
        "slow": injected["slow"],  # a slow call is recovered by completing
        "nan": int(nan_state["done"] and skipped > 0 and finite),
    }
    injected = {**injected, "nan": int(nan_state["done"])}
    # warm-up: the first two iterations (compilation of the sampler and the update step)
    fit = slope_fit(sampler.samples, warm_s=iters[1]["t_s"] if len(iters) > 1 else 0.0)
    plot(out / "soak.png", sampler.samples, iters)
    summary = {
        "minutes": round((time.monotonic() - t_start) / 60, 2),
        "iterations": it - start,
        "episodes_in": counts["episodes_in"],
        "episodes_out": counts["episodes_out"],
        "faults_injected": sum(injected.values()),
        "faults_recovered": sum(recovered.values()),
        "skipped_updates": skipped,
        "memory_slope_mb_per_hour": round(fit["slope_mb_per_hour"], 2),
    }
    detail = {
        **summary,
        "injected": injected,
        "recovered": recovered,
        "memory_fit": fit,
        "params_finite": finite,
        "env_health": health,
        "load_average": os.getloadavg(),
        "iterations_log": iters,
        "memory_samples": sampler.samples,
        "python_objects": [(i, n) for i, n, _ in censuses],
        "python_objects_grown_by_type": (
            census_growth(censuses[1][2], censuses[-1][2]) if len(censuses) > 2 else {}
        ),
    }
    (out / "soak.json").write_text(json.dumps(detail, indent=1))
    print(f"injected {injected} recovered {recovered}")
    print(f"memory fit (trainer RSS after the warm-up, least squares): {fit}")
    # an allocator settling looks like a leak early on: the second half tells them apart
    late = slope_fit(sampler.samples, skip_frac=0.5)
    detail["memory_fit_second_half"] = late
    # after the last compilation no executable is added: what grows then is not a cache
    settled = slope_fit(sampler.samples, warm_s=compiles["last_s"], skip_frac=0.0)
    detail["compiles"] = {"count": compiles["n"], "last_s": round(compiles["last_s"], 1)}
    detail["memory_fit_after_last_compile"] = settled
    # each iteration's peak, whatever phase the 5 s samples hit: after the warm-up and after
    # the last compilation
    peaks = [(x["t_s"], x["peak_rss_mb"], x["peak_rss_mb"]) for x in iters]
    detail["peak_fit"] = slope_fit(peaks, warm_s=iters[1]["t_s"] if len(iters) > 1 else 0.0)
    detail["peak_fit_after_last_compile"] = slope_fit(
        peaks, warm_s=compiles["last_s"], skip_frac=0.0
    )
    (out / "soak.json").write_text(json.dumps(detail, indent=1))
    print(f"memory fit over the second half only: {late}")
    print(f"XLA compilations: {detail['compiles']}; memory fit after the last: {settled}")
    print(f"per-iteration peak RSS fit: {detail['peak_fit']}")
    print(
        f"per-iteration peak RSS fit after the last compilation: {detail['peak_fit_after_last_compile']}"
    )
    print(f"live Python objects (iteration, count): {detail['python_objects']}")
    print(f"types grown most after the second census: {detail['python_objects_grown_by_type']}")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
