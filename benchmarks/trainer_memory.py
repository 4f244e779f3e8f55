"""Peak memory of the real trainer over (params + grads + Adam): LOOP's "one model copy".

Two LOOP iterations of a 768-hidden x 12-layer model (the quickstart world's word vocabulary;
full fine-tuning and LoRA rank 16) run inside ``jaxagent.train.trainer.Trainer`` (sampling,
packing, update, evaluation, checkpoints), each in its own process so that the peak RSS
(``ru_maxrss``) is that configuration's. The runtime's own memory (Python, JAX, XLA client,
the environment) is measured in the same process before the trainer builds the model and is
reported apart; the ratio is (peak - runtime) / (params + grads + Adam moments), where the
trained part is the whole model (full) or the adapters (LoRA, plus the frozen base).

    flock /tmp/jaxagent_heavy.lock nice -n 5 python benchmarks/trainer_memory.py

Modes: ``full`` (the default update), ``full_lean`` (``train.release_compiled``: compiled
programs dropped between phases and reloaded from the persistent compilation cache, large
allocations mapped on their own), ``full_fused`` (``rl.update.fused_optimizer``: the optimiser
applied block by block inside a second backward pass, no gradient tree), ``lora`` and
``lora_lean``. Each runs with a fresh compilation cache (the first run's figure). Each also
prints the update's device memory: the train state plus the step's planned XLA temporaries,
what an accelerator would hold (no compiled code, no allocator leftovers). Last line:
``{"full": {"ratio": ...}, "full_lean": {...}, "full_fused": {...}, "lora": {...},
"lora_lean": {...}}``. Target: full fine-tuning <= 1.3.

Measured (2-core CPU, load 4.4 from a concurrent training run, 85M parameters = 325 MiB
fp32, params+grads+Adam 1299 MiB; 2026-12-02):

    mode        peak MiB  ratio  run s   update device ratio (temporaries)
    full          2126    1.41    46     1.06 (408 MiB)
    full_lean     1943    1.27    62     1.06
    full_fused    2211    1.48    64     0.84 (119 MiB)
    lora          1865    4.27    68     1.23  (over base + 4 x adapters, 368 MiB)
    lora_lean     1393    2.99    72     1.23

Idle machine, the same day, ``--one`` each: full 1.414 (2132 MiB, 26.3 s), full_lean 1.261
(1933 MiB, 31.9 s); wall times under load are noisy, the ratios are not. Runtime (Python,
JAX, the environment) 295 MiB in each, reported apart. The default's peak holds 1010 MiB of
JAX arrays (state and batch), the update's temporaries and ~420 MiB of compiled programs and
stranded heap; ``full_lean`` removes most of the last (docs/results/performance.md). Earlier: 1.72-1.98
before checkpoints streamed and freed memory was returned;
``GLIBC_TUNABLES=glibc.malloc.mmap_threshold=262144`` alone 1.365-1.38; fused + release 1.31.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile

SHAPE = [
    "model.hidden_size=768",
    "model.num_layers=12",
    "model.num_heads=12",
    "model.num_kv_heads=12",
    "model.intermediate_size=2048",
    "model.max_seq_len=160",
    "env.options.num_train=40",
    "env.options.num_test=4",
    "rollout.tasks_per_iteration=4",
    "rollout.samples_per_task=2",
    "rollout.max_turns=2",
    "rollout.max_new_tokens=8",
    "rl.update.minibatch_size=8",
    "rl.update.num_epochs=1",
    "sft.enabled=false",
    "eval.num_tasks=4",
    "eval.every=0",
    "eval.val_tasks=0",
    "train.iterations=2",
    "train.checkpoint_every=0",
    "train.progress=none",
    "train.tensorboard=false",
    "train.plot=false",
]
LEAN = "train.release_compiled=true"
MODES = {
    "full": ["rl.lora.rank=0"],
    "full_lean": ["rl.lora.rank=0", LEAN],
    "full_fused": ["rl.lora.rank=0", "rl.update.fused_optimizer=true"],
    "lora": ["rl.lora.rank=16"],
    "lora_lean": ["rl.lora.rank=16", LEAN],
}


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


class _Trace:
    """RSS every 20 ms, and the windows of every XLA compilation (JAX reports each one's
    duration when it ends): is the peak a compilation's working memory or the run's own?"""

    def __init__(self):
        import threading
        import time

        self.time, self.samples, self.compiles, self.phases = time, [], [], []
        self.t0, self._stop = time.monotonic(), threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self):
        import jax

        while not self._stop.wait(0.02):
            # The arrays alive at each sample split the RSS into what the run holds as JAX
            # arrays (what a device would hold) and everything else.
            arrays = sum(x.nbytes for x in jax.live_arrays() if not x.is_deleted()) / 2**20
            self.samples.append((self.time.monotonic() - self.t0, _rss_mib(), arrays))

    def on_event(self, event: str, duration_s: float, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            end = self.time.monotonic() - self.t0
            self.compiles.append((end - duration_s, end))

    def wrap(self, obj, name: str, label: str) -> None:
        """Marks each call of ``obj.name`` as a phase window ``label``."""
        fn = getattr(obj, name)

        def marked(*a, **k):
            t = self.time.monotonic() - self.t0
            try:
                return fn(*a, **k)
            finally:
                self.phases.append((label, t, self.time.monotonic() - self.t0))

        setattr(obj, name, marked)

    def phase_peaks(self) -> dict:
        """Peak RSS inside each phase (a sample in two nested phases counts for the inner)."""
        out: dict[str, float] = {}
        for t, m, _ in self.samples:
            inner = [p for p in self.phases if p[1] <= t <= p[2]]
            label = min(inner, key=lambda p: p[2] - p[1])[0] if inner else "other"
            out[label] = round(max(out.get(label, 0.0), m), 1)
        return out

    def split_peaks(self) -> dict:
        self._stop.set()
        self._thread.join()
        inside = lambda t: any(a - 0.05 <= t <= b + 0.05 for a, b in self.compiles)  # noqa: E731
        comp = [m for t, m, _ in self.samples if inside(t)]
        rest = [m for t, m, _ in self.samples if not inside(t)]
        return {
            "compile_peak_mib": round(max(comp, default=0.0), 1),
            "outside_compile_peak_mib": round(max(rest, default=0.0), 1),
            "compilations": len(self.compiles),
            "compile_s": round(sum(b - a for a, b in self.compiles), 1),
            "phase_peak_mib": self.phase_peaks(),
            **self.breakdown(),
        }

    def breakdown(self) -> dict:
        """The JAX arrays alive at the highest sampled RSS (what a device would hold)."""
        peak = max(self.samples, key=lambda s: s[1])
        return {"sampled_peak_mib": round(peak[1], 1), "arrays_at_peak_mib": round(peak[2], 1)}


def one(mode: str, out_dir: str) -> dict:
    import jax

    trace = _Trace()
    jax.monitoring.register_event_duration_secs_listener(trace.on_event)

    from jaxagent.envs.registry import get_env_spec  # noqa: F401  (import cost in runtime)
    from jaxagent.train.config import load_config
    from jaxagent.train.trainer import Trainer

    jax.numpy.zeros(1).block_until_ready()  # the backend is up before the baseline
    cfg = load_config("configs/quickstart.yaml", SHAPE + MODES[mode] + [f"train.out_dir={out_dir}"])
    runtime = _rss_mib()
    trainer = Trainer(cfg, echo=lambda s: None)
    mib = lambda tree: sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)) / 2**20
    params = mib(trainer._init_params)
    rl = cfg.rl_config
    if rl.lora.rank:
        from jaxagent.rl.train_state import recipe_adapters

        shapes = jax.eval_shape(
            lambda p: recipe_adapters(p, rl, jax.random.key(0)), trainer._init_params
        )
        trained = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(shapes)) / 2**20
    else:
        trained = params
    after_build = _rss_mib()
    update = trainer.update_step  # the ShardedUpdate (its compiled steps), before wrapping
    for obj, name, label in (
        (trainer, "evaluate", "evaluate"),
        (trainer, "iteration", "iteration (sample + update)"),
        (trainer, "update_step", "update"),
        (trainer.checkpointer, "save", "checkpoint save"),
        (trainer.checkpointer, "wait", "checkpoint wait"),
    ):
        trace.wrap(obj, name, label)
    t_run = trace.time.perf_counter()
    trainer.run()
    run_s = trace.time.perf_counter() - t_run
    peak = _peak_mib()
    split = trace.split_peaks()
    # What XLA plans for one update step (the compiled program's own accounting).
    update_temp = update.temp_bytes / 2**20
    # full: params + grads + 2 Adam moments; LoRA: the frozen base + 4 x the adapters
    denom = params + 4 * trained if rl.lora.rank else 4 * params
    return {
        "ratio": round((peak - runtime) / denom, 3),
        # the same ratio over the peak outside XLA compilations: the run's own memory
        "ratio_outside_compile": round((split["outside_compile_peak_mib"] - runtime) / denom, 3),
        **split,
        "peak_mib": round(peak, 1),
        "run_s": round(run_s, 1),  # the trainer's wall time (compiling and loading included)
        "runtime_mib": round(runtime, 1),
        "params_mib": round(params, 1),
        "trained_mib": round(trained, 2),
        "params_grads_adam_mib": round(denom, 1),
        "after_model_build_mib": round(after_build, 1),
        "ratio_incl_runtime": round(peak / denom, 3),
        "update_temp_mib": round(update_temp, 1),
        # What an accelerator holds for the update: the train state (params, moments, the
        # frozen base under LoRA) and the step's planned XLA temporaries; no compiled code,
        # no allocator leftovers (those are host-RSS effects of the CPU backend).
        "update_device_ratio": round((denom - trained + update_temp) / denom, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--one", choices=sorted(MODES), help="(internal) measure one mode")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.out)))
        return
    results = {}
    for mode in MODES:
        with tempfile.TemporaryDirectory() as tmp:
            proc = subprocess.run(
                [sys.executable, __file__, "--one", mode, "--out", tmp],
                capture_output=True,
                text=True,
                # A fresh compilation cache: the first run's figure, no programs from before.
                env=dict(
                    os.environ,
                    JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"),
                    JAX_COMPILATION_CACHE_DIR=os.path.join(tmp, "xla_cache"),
                ),
            )
        if proc.returncode:
            raise SystemExit(f"{mode} failed:\n{proc.stderr[-3000:]}")
        results[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
        r = results[mode]
        print(
            f"{mode}: peak {r['peak_mib']:.0f} MiB = runtime {r['runtime_mib']:.0f} + "
            f"{r['peak_mib'] - r['runtime_mib']:.0f} MiB for the run; params "
            f"{r['params_mib']:.0f} MiB, trained {r['trained_mib']:.1f} MiB; params+grads+Adam "
            f"{r['params_grads_adam_mib']:.0f} MiB -> ratio {r['ratio']:.2f} "
            f"(incl. runtime {r['ratio_incl_runtime']:.2f}); run {r['run_s']:.0f} s"
        )
        print(
            f"{mode}: {r['compilations']} XLA compilations ({r['compile_s']:.0f} s): peak RSS "
            f"while compiling {r['compile_peak_mib']:.0f} MiB, outside compilations "
            f"{r['outside_compile_peak_mib']:.0f} MiB -> ratio outside compilation "
            f"{r['ratio_outside_compile']:.2f}"
        )
        print(f"{mode}: peak RSS by phase (MiB): {r['phase_peak_mib']}")
        print(
            f"{mode}: the update's device memory (state + planned XLA temporaries "
            f"{r['update_temp_mib']:.0f} MiB) over params+grads+Adam: "
            f"{r['update_device_ratio']:.2f}"
        )
        other = r["sampled_peak_mib"] - r["runtime_mib"] - r["arrays_at_peak_mib"]
        print(
            f"{mode}: at the highest RSS sampled every 20 ms ({r['sampled_peak_mib']:.0f} MiB): "
            f"runtime, JAX arrays {r['arrays_at_peak_mib']:.0f} MiB and "
            f"{other:.0f} MiB besides: the running step's XLA temporaries (planned at "
            f"{r['update_temp_mib']:.0f} MiB), compiled programs, freed heap the allocator keeps"
        )
    load = os.getloadavg()[0]
    print(f"load average {load:.1f}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
