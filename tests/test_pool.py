"""EnvPool: fault containment (no episode lost), counters, retries, seeding, errors."""

import re
import time

import pytest

from jaxagent.envs.base import StepResult, Task, truncate_observation
from jaxagent.envs.faults import FaultConfig, FaultLog, FaultyEnvFactory
from jaxagent.pool import EnvPool, PoolConfig, episode_seed
from jaxagent.pool.fake_env import FakeToolEnvFactory

ENV_ERROR_REASONS = {"timeout", "crash", "corrupt"}


def _run_episodes(pool, n_episodes, num_envs):
    """Drive ``n_episodes`` through the pool with the right actions; return the final steps."""
    tasks = [Task(f"t{i}", "train", f"prompt {i}") for i in range(n_episodes)]
    started = pool.async_reset(range(num_envs), tasks[:num_envs])
    next_task, finals, turn = num_envs, [], {}
    while len(finals) < n_episodes:
        for r in pool.recv(min_batch=1):
            if r.done:
                finals.append(r)
                if next_task < n_episodes:
                    started += pool.async_reset([r.env_id], [tasks[next_task]])
                    next_task += 1
                continue
            k = turn[r.episode_id] = turn.get(r.episode_id, -1) + 1
            pool.send([r.env_id], [f"call {k}"])
    return started, finals


@pytest.mark.parametrize("backend", ["process", "thread"])
def test_faults_no_episode_lost_and_counters_match(backend):
    check_fault_suite(backend, FaultLog.create())


def check_fault_suite(backend, log):
    """200 episodes over 16 envs, per call: 10% hangs, 5% crashes, 5% corrupt returns; ``log``
    counts the injected faults where the backend's workers run (tests/test_pool_ray.py)."""
    faults = FaultConfig(hang=0.10, crash=0.05, corrupt=0.05, seed=7, hang_s=30.0)
    # 5 s: short enough for a fast test, far above a normal call (~1 ms; < 0.7 s seen on a
    # loaded 2-core machine, but one Ray call past 2 s at load ~4 and several past 3 s at load
    # ~6), so that every timeout is an injected hang.
    config = PoolConfig(
        num_envs=16,
        backend=backend,
        step_timeout_s=5.0,
        reset_timeout_s=5.0,
        max_retries=2,
        backoff_s=0.01,
        seed=3,
    )
    with EnvPool(FaultyEnvFactory(FakeToolEnvFactory(episode_len=3), faults, log), config) as pool:
        started, finals = _run_episodes(pool, 200, 16)
        health = pool.health.snapshot()
        # A worker that died before it reported ready is respawned only when a call needs it
        # (test_env_fn_that_kills_its_worker_is_bounded_not_a_restart_storm). A Ray actor can
        # look so: a crash on its first call may kill it before ``ready``'s reply leaves it. If
        # no episode came after, that respawn is still owed at the end.
        owed = sum(slot.worker is None for slot in pool._slots)
    injected = log.counts()
    # Count out == count in, each episode exactly once.
    assert len(finals) == 200
    assert sorted(r.episode_id for r in finals) == sorted(started) == list(range(200))
    failed = [r for r in finals if r.env_error]
    ok = [r for r in finals if not r.env_error]
    # Every failed episode is labelled; every other one ran to its real end with reward 1
    # (the env pays 1 only if each action reached it in order: routing survived restarts).
    for r in failed:
        assert r.info["failure_mode"] == "env_error" and r.info["termination"] == "env_error"
        assert r.info["env_error"] in ENV_ERROR_REASONS and r.reward == 0.0
    for r in ok:
        assert r.info["termination"] == "terminated" and r.reward == 1.0
    assert injected["hang"] > 20 and injected["crash"] > 5 and injected["corrupt"] > 5
    assert 0 < len(failed) <= injected["hang"] + injected["crash"] + injected["corrupt"]
    # Health counters match the injected faults exactly.
    assert health["timeouts"] == injected["hang"]
    assert health["crashes"] == injected["crash"]
    assert health["corrupt"] == injected["corrupt"]
    assert health["restarts"] + owed == health["timeouts"] + health["crashes"]
    assert health["env_error_episodes"] == len(failed)
    assert health["episodes_started"] == health["episodes_finished"] == 200
    assert health["exceptions"] == 0
    assert 0 < health["latency_p50_ms"] <= health["latency_p90_ms"] <= health["latency_p99_ms"]


class _FlakyReset:
    """Fails its first ``fails`` resets with an exception, then works; records seeds."""

    attempts = {}

    def __init__(self, env_id, fails):
        self.env_id, self.fails, self.seeds = env_id, fails, []

    def seed(self, seed):
        self.seeds.append(seed)

    def reset(self, task):
        n = _FlakyReset.attempts[self.env_id] = _FlakyReset.attempts.get(self.env_id, 0) + 1
        if n <= self.fails:
            raise ConnectionError(f"backend not up yet (attempt {n})")
        return f"seeds {self.seeds}"

    def step(self, action):
        if action == "boom":
            raise KeyError("tool table missing")
        return StepResult("fine", 0.5, True, {"truncated": action == "budget"})

    def close(self):
        pass


def test_reset_retries_with_backoff_then_succeeds():
    _FlakyReset.attempts = {}
    cfg = PoolConfig(num_envs=1, max_retries=2, backoff_s=0.05, backoff_max_s=1.0, seed=11)
    with EnvPool(lambda i: _FlakyReset(i, fails=2), cfg) as pool:
        t0 = time.monotonic()
        pool.async_reset([0], Task("a", "train", "p"))
        (r,) = pool.recv()
        elapsed = time.monotonic() - t0
        assert r.kind == "reset" and not r.done
        assert pool.health["retries"] == 2 and pool.health["exceptions"] == 2
        assert elapsed >= 0.05 + 0.10  # back-off 0.05 s then 0.10 s
        # The successful attempt saw the deterministic seed of attempt 2 (after 0 and 1).
        assert r.observation == f"seeds {[episode_seed(11, 0, 0, a) for a in range(3)]}"


def test_reset_gives_up_after_max_retries_with_label():
    _FlakyReset.attempts = {}
    with EnvPool(
        lambda i: _FlakyReset(i, fails=99), PoolConfig(num_envs=2, max_retries=1, backoff_s=0.0)
    ) as pool:
        pool.async_reset([0, 1], Task("a", "train", "p"))
        out = []
        while len(out) < 2:
            out += pool.recv()
        assert all(r.done and r.info["env_error"] == "exception" for r in out)
        assert "backend not up yet" in out[0].info["env_error_detail"]
        assert pool.health["retries"] == 2 and pool.health["env_error_episodes"] == 2


def test_step_exception_ends_episode_labelled_and_truncation_kept_apart():
    _FlakyReset.attempts = {}
    with EnvPool(lambda i: _FlakyReset(i, fails=0), PoolConfig(num_envs=3)) as pool:
        pool.async_reset(range(3), Task("a", "train", "p"))
        assert len(pool.recv(min_batch=3)) == 3
        pool.send([0, 1, 2], ["boom", "budget", "ok"])
        out = {r.env_id: r for r in pool.recv(min_batch=3)}
        assert out[0].info["termination"] == "env_error" and "KeyError" in out[0].observation
        assert out[1].info["termination"] == "truncated" and out[1].reward == 0.5
        assert out[2].info["termination"] == "terminated"
        with pytest.raises(ValueError, match="env 2 has no running episode.*async_reset"):
            pool.send([2], ["again"])
        with pytest.raises(ValueError, match="env id 7 out of range"):
            pool.send([7], ["x"])
        # A bad call submits nothing: env 0 stays idle after the failed batch.
        with pytest.raises(ValueError, match="repeated env ids"):
            pool.async_reset([0, 0], Task("b", "train", "p"))
        with pytest.raises(ValueError, match="env 2 has no running episode"):
            pool.async_reset([0], Task("b", "train", "p"))
            pool.recv()
            pool.send([0, 2], ["ok", "ok"])
        assert pool.pending() == 0


def test_seeds_are_deterministic_per_env_and_episode():
    seeds = {(e, k): episode_seed(5, e, k) for e in range(4) for k in range(3)}
    assert len(set(seeds.values())) == 12  # distinct streams
    assert seeds == {(e, k): episode_seed(5, e, k) for e in range(4) for k in range(3)}
    assert episode_seed(6, 0, 0) != seeds[(0, 0)]


def test_process_pool_close_stops_workers():
    with EnvPool(FakeToolEnvFactory(), PoolConfig(num_envs=2, backend="process")) as pool:
        pool.async_reset([0, 1], Task("a", "train", "p"))
        assert len(pool.recv(min_batch=2)) == 2
        procs = [s.worker.process for s in pool._slots]
    assert not any(p.is_alive() for p in procs)


def test_recv_timeout_and_observation_truncation():
    cfg = PoolConfig(num_envs=1)
    env_fn = FakeToolEnvFactory(latency_s=0.3)
    with EnvPool(env_fn, cfg) as pool:
        pool.async_reset([0], Task("a", "train", "x" * 500))
        assert pool.recv(timeout=0.01) == []  # nothing ready yet
        (r,) = pool.recv()
        # Observations come back whole: truncation is the rollout's one knob
        # (rollout.max_observation_chars; tests/test_env_errors.py checks it per backend).
        assert "x" * 500 in r.observation and "truncated" not in r.observation
    text = "head " + "y" * 1000 + " tail"
    cut = truncate_observation(text, 100)
    assert len(cut) <= 100 and cut.startswith("head ") and cut.endswith(" tail")
    marker = re.search(r"\n\[\.\.\. (\d+) characters truncated \.\.\.\]\n", cut)
    assert int(marker.group(1)) == len(text) - (len(cut) - len(marker.group(0)))
    assert truncate_observation("short", 100) == "short"
    with pytest.raises(ValueError, match="max_chars=10 is too small"):
        truncate_observation(text, 10)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"num_envs": 0}, "num_envs"),
        ({"num_envs": 1, "backend": "docker"}, "backend"),
        ({"num_envs": 1, "step_timeout_s": 0}, "step_timeout_s"),
    ],
)
def test_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        PoolConfig(**kwargs)
    with pytest.raises(ValueError, match="sum to"):
        FaultConfig(hang=0.6, crash=0.6)


def test_process_backend_rejects_an_unpicklable_env_fn():
    with pytest.raises(ValueError, match="cannot be pickled.*top-level function.*backend='thread'"):
        EnvPool(lambda i: None, PoolConfig(num_envs=1, backend="process"))


# An env defined in the script that starts the pool, as a user's one-file experiment does.
MAIN_SCRIPT = """
from jaxagent.envs.base import StepResult, Task
from jaxagent.pool import EnvPool, PoolConfig


class Echo:
    def reset(self, task):
        return "hello " + task.prompt

    def step(self, action):
        return StepResult("", 1.0, True, {})

    def close(self):
        pass


def make_env(env_id):
    return Echo()


if __name__ == "__main__":
    with EnvPool(make_env, PoolConfig(num_envs=1, backend="process")) as pool:
        pool.async_reset([0], [Task("t", "train", "world")])
        print(pool.recv(min_batch=1, timeout=60)[0].observation)
"""


@pytest.mark.parametrize("how", ["file", "-c"])
def test_an_env_defined_in_main_runs_from_a_file_and_is_refused_from_dash_c(how, tmp_path):
    import subprocess
    import sys

    # A worker is not a fork: it re-imports a __main__ that has a file (multiprocessing's
    # rule), and cannot import one that has none, which the pool says before starting any.
    if how == "file":
        (tmp_path / "experiment.py").write_text(MAIN_SCRIPT)
        cmd = [sys.executable, str(tmp_path / "experiment.py")]
    else:
        cmd = [sys.executable, "-c", MAIN_SCRIPT]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    if how == "file":
        assert done.returncode == 0 and done.stdout.strip() == "hello world", done.stderr
    else:
        assert done.returncode != 0
        assert done.stderr.strip().splitlines()[-1] == (
            "ValueError: env_fn refers to __main__.make_env, which a process worker cannot "
            "import (this __main__ has no file: python -c, a notebook or stdin); define it in "
            "an importable module, or use backend='thread'"
        )


def test_worker_imports_see_through_a_shared_memory_field():
    from jaxagent.pool.shipping import worker_imports

    # The fault log's shared counters pickle only while a worker is being started; the env
    # factory next to them must still be found (the fork server imports its module once).
    env_fn = FaultyEnvFactory(FakeToolEnvFactory(), FaultConfig(crash=0.1), FaultLog.create())
    modules = worker_imports(env_fn, "forkserver")
    assert {"jaxagent.pool.fake_env", "jaxagent.envs.faults"} <= set(modules)


def test_idle_worker_death_is_answered_at_the_next_send_and_abandon_is_silent():
    import os
    import signal

    with EnvPool(
        FakeToolEnvFactory(episode_len=5), PoolConfig(num_envs=2, backend="process")
    ) as pool:
        pool.async_reset([0, 1], Task("a", "train", "p"))
        assert len(pool.recv(min_batch=2)) == 2
        os.kill(pool._slots[0].worker.process.pid, signal.SIGKILL)  # dies while idle
        deadline = time.monotonic() + 10
        while pool.health["crashes"] == 0 and time.monotonic() < deadline:
            assert pool.recv(timeout=0.05) == []  # no unsolicited answer
        assert pool.health["crashes"] == 1 and pool.health["restarts"] == 1
        pool.send([0, 1], ["call 0", "call 0"])
        out = {r.env_id: r for r in pool.recv(min_batch=2)}
        assert out[0].done and out[0].info["env_error"] == "crash"
        assert not out[1].done
        # Resetting env 1 mid-episode abandons that episode silently; the reset is answered.
        pool.async_reset([0, 1], Task("b", "train", "p"))
        out = pool.recv(min_batch=2)
        assert sorted(r.kind for r in out) == ["reset", "reset"]
        assert pool.health["episodes_abandoned"] == 1
        pool.send([0], ["call 0"])
        (r,) = pool.recv()
        assert r.env_id == 0 and not r.done  # the restarted worker serves the new episode


def _scripted_policy(obs):
    # FakeToolEnv says "result <t> of <task>" after step t-1; the right next action is "call <t>".
    return f"call {int(obs.split()[1])}" if obs.startswith("result") else "call 0"


def test_fault_check_passes_and_flags_timeouts_sized_below_the_env_latency():
    from jaxagent.cli.check import fault_check

    def policy(task):
        return _scripted_policy

    tasks = [Task(f"t{i}", "train", "p") for i in range(48)]
    cfg = PoolConfig(num_envs=8, step_timeout_s=1.0, reset_timeout_s=1.0, backoff_s=0.0)
    faults = FaultConfig(hang=0.1, crash=0.05, corrupt=0.05, seed=4, hang_s=20.0)
    report = fault_check(FakeToolEnvFactory(), tasks, policy, cfg, faults)
    assert report.ok, report.figures()
    assert report.episodes_out == 48 and report.env_error_episodes > 0
    assert sum(report.injected.values()) > 0
    # "slow" calls (0.3 s) against a 0.1 s timeout: timeouts no injected hang explains.
    slow = FaultConfig(slow=0.2, slow_s=0.3, seed=4)
    tight = PoolConfig(num_envs=8, step_timeout_s=0.1, reset_timeout_s=0.1, max_retries=0)
    bad = fault_check(FakeToolEnvFactory(), tasks[:16], policy, tight, slow)
    assert not bad.ok and not bad.counters_match and bad.health["timeouts"] > 0
    assert bad.figures()["ok"] is False


def test_run_episodes_runs_every_task_once_refilling_free_envs():
    from jaxagent.pool import run_episodes

    tasks = [Task(f"t{i}", "train", "p") for i in range(10)]
    made = []

    def make_policy(task):
        made.append(task.id)
        return _scripted_policy

    with EnvPool(FakeToolEnvFactory(), PoolConfig(num_envs=3)) as pool:
        run = run_episodes(pool, tasks, make_policy)
    assert sorted(e.task.id for e in run.episodes) == sorted(t.id for t in tasks)
    assert sorted(made) == sorted(t.id for t in tasks)  # one policy per episode
    assert all(e.final.done and e.final.reward == 1.0 for e in run.episodes)
    assert run.env_steps == sum(e.steps for e in run.episodes) > len(tasks)


def test_env_fn_that_kills_its_worker_is_bounded_not_a_restart_storm():
    from jaxagent.pool.fake_env import DyingEnvFactory

    cfg = PoolConfig(num_envs=1, backend="process", max_retries=2, backoff_s=0.01)
    with EnvPool(DyingEnvFactory(), cfg) as pool:
        pool.async_reset([0], Task("a", "train", "p"))
        (r,) = pool.recv()
        assert r.done and r.info["env_error"] == "crash" and "exit code 3" in r.observation
        assert pool.recv(timeout=0.5) == []  # idle: no respawn until the next call
        assert pool.health["crashes"] == 3  # the first attempt + 2 retries
        assert pool.health["restarts"] == 2  # respawned for each retry, not in a loop
