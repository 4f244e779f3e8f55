"""Environment-pool throughput, side by side in one run.

1. MuJoCo HalfCheetah-v5, 8 envs, random actions drawn inside the timed loop the same way for
   every contender (``rng.uniform(-1, 1, (8, 6)).astype(float32)`` per batched step):
   Gymnasium SyncVectorEnv(8) and AsyncVectorEnv(8) (anchors), EnvPool (8 envs, 2 threads) if
   installed, and jaxagent ``MujocoVectorEnv`` through ``ArrayEnvPool`` send/recv with each
   engine (robot/engines.py):
     ``jaxagent_pool_2thr`` (the headline, ``jaxagent_steps_s``): the default engine, "batch",
       bit-identical to Gymnasium (tests/test_robot.py), which picks the fastest of the next
       two layouts and the one-thread one from timings as it runs;
     ``jaxagent_batch_mjpool_2thr``: "batch" with ``chunks=1``, one Batch on MuJoCo's own C
       thread pool (its workers spin between calls);
     ``jaxagent_batch_team_2thr``: "batch" with ``chunks=2``, two Batch chunks of 4 envs
       stepped by two Python threads (nothing spins);
     ``jaxagent_threads_2thr``: "threads", ``mj_step`` per env on two Python threads
       (bit-identical; the engine Ant needs);
     ``jaxagent_rollout_2thr``: "rollout", one ``mujoco.rollout`` call per step (NOT bitwise
       Gymnasium: the solver warm start is zeroed every step);
     ``jaxagent_batch_1thr``: "batch" on one thread (the serial reference);
   and the raw physics bound (``mujoco.rollout``, 2 threads, one long open-loop rollout: no
   Python at all per step). Contenders are measured in many short interleaved rounds and the
   median round is reported, so that on a shared machine every contender sees the same mix of
   load; each also gets env steps per CPU-second of this process, which hardly depends on what
   else the machine runs.
2. Text envs: 256 fake tool envs with 50 ms latency each on the thread backend, driven with
   ``send``/``recv``; ideal concurrency is 256 / 0.05 s = 5120 calls/s.

Usage: python benchmarks/pool.py [--seconds 0.4] [--rounds 20]   (about 2 minutes)
Prints the setup, each figure, ratios, and one final JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # a checkout

warnings.filterwarnings("ignore")
N_ENVS, TASK, ACT_DIM = 8, "HalfCheetah-v5", 6
JAXAGENT = {  # contender -> MujocoVectorEnv arguments (the first is the headline)
    "jaxagent_pool_2thr": dict(num_threads=2),
    "jaxagent_batch_mjpool_2thr": dict(num_threads=2, engine="batch", chunks=1),
    "jaxagent_batch_team_2thr": dict(num_threads=2, engine="batch", chunks=2),
    "jaxagent_threads_2thr": dict(num_threads=2, engine="threads"),
    "jaxagent_rollout_2thr": dict(num_threads=2, engine="rollout"),
    "jaxagent_batch_1thr": dict(num_threads=1),
}
_ENVS = {}  # contender -> its MujocoVectorEnv, for the report
BITWISE = tuple(k for k in JAXAGENT if k != "jaxagent_rollout_2thr")


def _timed(step_fn, seconds, rng):
    """Step with fresh random actions from ``rng`` until ``seconds`` pass.

    Returns (env steps per wall second, env steps per CPU second of this process). The second
    figure counts the work per step and hardly depends on what else the machine runs.
    """
    k, start, cpu = 0, time.perf_counter(), time.process_time()
    while True:
        for _ in range(25):
            step_fn(rng.uniform(-1, 1, (N_ENVS, ACT_DIM)).astype(np.float32))
            k += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return k * N_ENVS / elapsed, k * N_ENVS / max(time.process_time() - cpu, 1e-9)


def make_contenders():
    """name -> (measure(seconds) -> (wall rate, CPU rate), close)."""
    import gymnasium as gym

    from jaxagent.envs.robot import MujocoVectorEnv
    from jaxagent.pool import ArrayEnvPool

    def timed(step_fn):
        rng = np.random.default_rng(0)
        return lambda seconds: _timed(step_fn, seconds, rng)

    contenders = {}
    sync = gym.vector.SyncVectorEnv([lambda: gym.make(TASK) for _ in range(N_ENVS)])
    sync.reset(seed=0)
    contenders["gymnasium_sync8"] = (timed(sync.step), sync.close)
    asyn = gym.vector.AsyncVectorEnv([lambda: gym.make(TASK) for _ in range(N_ENVS)])
    asyn.reset(seed=0)
    contenders["gymnasium_async8"] = (timed(asyn.step), asyn.close)
    child = _EnvPoolChild.start()
    if child is not None:
        contenders["envpool_8env_2thr"] = (child.measure, child.close)
    for name, kwargs in JAXAGENT.items():
        pool = ArrayEnvPool(MujocoVectorEnv(TASK, N_ENVS, **kwargs), seed=0)
        pool.async_reset()
        pool.recv()
        contenders[name] = (timed(_pool_stepper(pool)), pool.close)
        _ENVS[name] = pool.env
    raw = _RawBound()
    contenders["raw_rollout_bound_2thr"] = (raw.measure, raw.close)
    return contenders


def _pool_stepper(pool):
    ids = np.arange(pool.num_envs)

    def step(a):
        pool.send(ids, a)
        return pool.recv()

    return step


_ENVPOOL_CHILD = """
import json, sys, time, numpy as np, envpool
env = envpool.make("{task}", env_type="gymnasium", num_envs={n}, num_threads=2, batch_size={n})
env.reset()
rng = np.random.default_rng(0)
print("ready", flush=True)
for line in sys.stdin:
    seconds = float(line)
    k, start, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        for _ in range(25):
            env.step(rng.uniform(-1, 1, ({n}, {a})).astype(np.float32)); k += 1
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    print(json.dumps([k * {n} / wall, k * {n} / cpu]), flush=True)
"""


class _EnvPoolChild:
    """EnvPool in a child process, kept alive between rounds and timed there.

    EnvPool bundles its own MuJoCo build; loading it next to the mujoco package in one process
    crashes, so it runs in a child (same action draws, same timing loop).
    """

    def __init__(self, proc):
        self.proc = proc

    @classmethod
    def start(cls):
        import subprocess

        code = _ENVPOOL_CHILD.format(task=TASK, n=N_ENVS, a=ACT_DIM)
        proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        if proc.stdout.readline().strip() != "ready":
            proc.wait()
            print(f"envpool: unavailable ({proc.stderr.read().strip().splitlines()[-1:]})")
            return None
        return cls(proc)

    def measure(self, seconds):
        self.proc.stdin.write(f"{seconds}\n")
        self.proc.stdin.flush()
        return tuple(json.loads(self.proc.stdout.readline()))

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


class _RawBound:
    """The physics bound: one open-loop ``mujoco.rollout`` of 8 envs on 2 threads, no Python."""

    def __init__(self):
        import mujoco
        from mujoco import rollout

        from jaxagent.envs.robot.tasks import get_task, gymnasium_asset

        spec = get_task(TASK)
        self.frame_skip = spec.frame_skip
        self.model = m = mujoco.MjModel.from_xml_path(gymnasium_asset(spec.xml))
        full = mujoco.mjtState.mjSTATE_FULLPHYSICS
        self.state = np.zeros((N_ENVS, mujoco.mj_stateSize(m, full)))
        d = mujoco.MjData(m)
        for i in range(N_ENVS):
            mujoco.mj_getState(m, d, self.state[i], full)
        self.rollout = rollout.Rollout(nthread=2)
        self.datas = [mujoco.MjData(m) for _ in range(2)]
        self.rng, self.rate = np.random.default_rng(0), 30000.0  # rate: sizes the next call

    def measure(self, seconds):
        steps = max(50, int(seconds * self.rate / N_ENVS))
        ctrl = self.rng.uniform(-1, 1, (N_ENVS, steps, ACT_DIM))
        ctrl = np.repeat(ctrl, self.frame_skip, axis=1)
        start, cpu = time.perf_counter(), time.process_time()
        self.rollout.rollout(
            [self.model] * N_ENVS, self.datas, self.state, ctrl, nstep=steps * self.frame_skip
        )
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        self.rate = N_ENVS * steps / wall
        return self.rate, N_ENVS * steps / cpu

    def close(self):
        self.rollout.close()


def text_env_throughput(num_envs=256, latency_s=0.05, seconds=3.0):
    from jaxagent.envs.base import Task
    from jaxagent.pool import EnvPool, PoolConfig
    from jaxagent.pool.fake_env import FakeToolEnvFactory

    env_fn = FakeToolEnvFactory(episode_len=10**9, latency_s=latency_s)
    with EnvPool(env_fn, PoolConfig(num_envs=num_envs, backend="thread")) as pool:
        pool.async_reset(range(num_envs), Task("bench", "train", "p"))
        pool.recv(min_batch=num_envs)
        pool.send(range(num_envs), ["call 0"] * num_envs)
        calls, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            done = pool.recv(min_batch=1)
            calls += len(done)
            pool.send([r.env_id for r in done], ["call"] * len(done))
        elapsed = time.perf_counter() - start
        snap = pool.health.snapshot()
    ideal = num_envs / latency_s
    return calls / elapsed, ideal, snap


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=0.4, help="per contender per round")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    import gymnasium
    import mujoco

    print(
        f"setup: {TASK}, {N_ENVS} envs, random actions; {os.cpu_count()} CPUs; "
        f"load avg {os.getloadavg()[0]:.2f}; python {platform.python_version()}, "
        f"mujoco {mujoco.__version__}, gymnasium {gymnasium.__version__}; "
        f"{args.rounds} interleaved rounds x {args.seconds}s, median reported"
    )
    contenders = make_contenders()
    rates = {name: [] for name in contenders}
    cpu_rates = {name: [] for name in contenders}
    for _ in range(args.rounds):
        for name, (measure, _) in contenders.items():
            wall, cpu = measure(args.seconds)
            rates[name].append(wall)
            cpu_rates[name].append(cpu)
    engine = _ENVS["jaxagent_pool_2thr"].engine
    layout = ("MuJoCo's pool (chunks=1)", "Python threads (chunks=2)", "one thread")
    choice = {
        "final_layout": layout[engine.active],
        "switches": engine.switches,
        "last_window_mean_us": [m and round(m / 1e3, 1) for m in engine.chooser.mean],
    }
    for _, close in contenders.values():
        close()
    med = {name: statistics.median(v) for name, v in rates.items()}
    # AsyncVectorEnv works in child processes, invisible to process_time: no CPU figure.
    cpu_med = {n: statistics.median(v) for n, v in cpu_rates.items() if n != "gymnasium_async8"}
    bound = med["raw_rollout_bound_2thr"]
    ours = med["jaxagent_pool_2thr"]
    for name, v in med.items():
        tag = " (bitwise Gymnasium)" if name in BITWISE else ""
        print(
            f"{name:>26}: {v:8.0f} env steps/s{tag}; rounds p10/p90: "
            f"{np.percentile(rates[name], 10):.0f}/{np.percentile(rates[name], 90):.0f}; "
            + (f"{cpu_med[name]:.0f} per CPU-second" if name in cpu_med else "CPU: n/a")
        )
    ratios = {
        f"ratio_vs_{k}": ours / v for k, v in med.items() if not k.startswith(("jaxagent", "raw"))
    }
    # Per-round ratios: both sides of each measured seconds apart, under the same load.
    per_round = {
        "vs_gymnasium_sync8": np.divide(rates["jaxagent_pool_2thr"], rates["gymnasium_sync8"]),
        "fraction_of_bound": np.divide(
            rates["jaxagent_pool_2thr"], rates["raw_rollout_bound_2thr"]
        ),
    }
    per_round = {k: float(np.median(v)) for k, v in per_round.items()}
    for k, v in ratios.items():
        print(f"{k}: {v:.2f}x")
    print(
        f"median per-round ratios: vs Sync8 {per_round['vs_gymnasium_sync8']:.2f}x, "
        f"fraction of the raw bound {per_round['fraction_of_bound']:.2f}"
    )
    best_bitwise = max(BITWISE, key=med.get)
    best = max((k for k in med if k.startswith("jaxagent")), key=med.get)
    print(
        f"fraction of the raw physics bound measured in the same rounds: headline "
        f"{ours / bound:.2f}; target >= 40000 env steps/s on this run: headline "
        f"{'met' if ours >= 40000 else 'NOT met'} ({ours:.0f}); best bitwise engine "
        f"{best_bitwise} {med[best_bitwise]:.0f}; best engine {best} {med[best]:.0f}. "
        f"The target means >= 0.70 of the bound (40k / 56.9k on an idle machine)."
    )
    print(
        f"default engine's layout choice: ended on {choice['final_layout']} after "
        f"{choice['switches']} switches; last timed window per layout (mean us per step: "
        f"MuJoCo's pool, Python threads, one thread): {choice['last_window_mean_us']}"
    )
    text_rate, ideal, snap = text_env_throughput(seconds=max(2.0, args.seconds))
    eff = text_rate / ideal
    print(
        f"text envs: 256 tool envs x 50 ms latency, thread backend: {text_rate:.0f} calls/s, "
        f"ideal {ideal:.0f}; efficiency {eff:.2%} (target >= 80%); latency p50/p99 "
        f"{snap['latency_p50_ms']:.1f}/{snap['latency_p99_ms']:.1f} ms"
    )
    result = {
        "jaxagent_steps_s": round(ours),
        "gymnasium_sync8_steps_s": round(med["gymnasium_sync8"]),
        "gymnasium_async8_steps_s": round(med["gymnasium_async8"]),
        **{f"{k}_steps_s": round(v) for k, v in med.items() if k.startswith("jaxagent_")},
        "envpool_steps_s": round(med["envpool_8env_2thr"]) if "envpool_8env_2thr" in med else None,
        "raw_rollout_bound_steps_s": round(bound),
        **{k: round(v, 3) for k, v in ratios.items()},
        "fraction_of_physics_bound": round(ours / bound, 3),
        "median_round_ratios": {k: round(v, 3) for k, v in per_round.items()},
        "best_bitwise_engine": best_bitwise,
        "default_engine_layout": choice,
        "text_calls_s": round(text_rate),
        "text_ideal_calls_s": round(ideal),
        "text_concurrency_efficiency": round(eff, 3),
        "steps_per_cpu_s": {k: round(v) for k, v in cpu_med.items()},
        "cpu_ratio_vs_gymnasium_sync8": round(
            cpu_med["jaxagent_pool_2thr"] / cpu_med["gymnasium_sync8"], 3
        ),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
