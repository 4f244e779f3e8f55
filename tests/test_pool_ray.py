"""The ray pool backend on a local Ray instance: the pool's fault-injection suite (200 episodes
in, 200 out, counters equal to the injected faults), an actor killed from outside ends its
episode with env_error and is replaced, the config's checks, and one shrunken training
iteration through ``jaxagent.train`` with its envs in Ray actors."""

import time

import pytest

from jaxagent.envs.base import StepResult, Task
from jaxagent.envs.faults import FaultConfig, FaultLog, FaultyEnvFactory
from jaxagent.pool import EnvPool, PoolConfig
from jaxagent.pool.fake_env import DyingEnvFactory, FakeToolEnvFactory

from test_add_env import _register as register_echo
from test_add_env import test_echo_suite_trains_one_iteration as echo_trains_one_iteration
from test_pool import check_fault_suite

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    """One local instance for the module (~2.5 s to start here); the pools join it."""
    if not ray.is_initialized():
        # "local": a new instance, even where `ray start` left a cluster for ray.init() to join
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_backend_passes_the_fault_suite():
    from jaxagent.pool.ray_backend import RayFaultLog

    check_fault_suite("ray", RayFaultLog())


def _wait_dead(actor, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ray.get(actor.ready.remote(), timeout=1.0)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.05)
    raise AssertionError("the killed actor still answers")


def test_an_actor_killed_idle_or_mid_call_is_an_env_error_and_a_new_actor():
    offset = 7  # a closure: cloudpickle ships it by value, where the process backend refuses it
    env_fn = lambda env_id: FakeToolEnvFactory(episode_len=3, latency_s=0.5)(env_id + offset)
    tasks = [Task(f"t{i}", "train", "p") for i in range(3)]
    with EnvPool(env_fn, PoolConfig(num_envs=2, backend="ray", max_retries=0)) as pool:
        pool.async_reset([0, 1], tasks[:2])
        replies = pool.recv(min_batch=2)
        assert sorted(r.observation.split(":")[0] for r in replies) == [
            "env 7 task t0",
            "env 8 task t1",
        ]
        # env 0's actor dies between calls, mid-episode: answered at the next send
        idle = pool._slots[0].worker.actor
        ray.kill(idle)
        _wait_dead(idle)
        assert pool.recv(timeout=1.0) == []  # no call is pending, so no answer comes
        assert pool.health["crashes"] == 1 and pool.health["restarts"] == 1
        pool.send([0], ["call 0"])
        (r,) = pool.recv()
        assert r.done and r.env_id == 0 and r.info["env_error"] == "crash"
        assert "Ray actor died" in r.observation
        # env 1's actor dies during a call (each takes 0.5 s): the call's answer is the crash
        busy = pool._slots[1].worker.actor
        pool.send([1], ["call 0"])
        time.sleep(0.1)
        ray.kill(busy)
        (r,) = pool.recv()
        assert r.done and r.env_id == 1 and r.info["env_error"] == "crash"
        assert pool.health["crashes"] == 2 and pool.health["restarts"] == 2
        # both envs run a full episode on their new actors
        pool.async_reset([0, 1], [tasks[2], tasks[2]])
        turn, finals = {0: 0, 1: 0}, []
        while len(finals) < 2:
            for r in pool.recv():
                if r.done:
                    finals.append(r)
                else:
                    pool.send([r.env_id], [f"call {turn[r.env_id]}"])
                    turn[r.env_id] += 1
        assert all(r.reward == 1.0 and not r.env_error for r in finals)
        assert pool._slots[0].worker.actor._actor_id != idle._actor_id
        assert pool.health["env_error_episodes"] == 2 and pool.health["episodes_finished"] == 4


def test_a_result_ray_cannot_ship_is_corrupt_and_the_actor_stays():
    import threading

    class LockEnv:  # defined here: cloudpickle ships it by value
        def reset(self, task):
            return "hi"

        def step(self, action):
            return StepResult("x", 0.0, True, {"lock": threading.Lock()})

        def close(self):
            pass

    with EnvPool(lambda env_id: LockEnv(), PoolConfig(num_envs=1, backend="ray")) as pool:
        for _ in range(2):
            pool.async_reset([0], Task("a", "train", "p"))
            (r,) = pool.recv()
            assert r.observation == "hi"
            pool.send([0], ["go"])
            (r,) = pool.recv()
            assert r.done and r.info["env_error"] == "corrupt"
            assert "cannot pickle '_thread.lock' object" in r.observation
        assert pool.health["corrupt"] == 2 and pool.health["restarts"] == 0


def test_an_env_fn_that_kills_its_actor_is_bounded_not_a_restart_storm():
    cfg = PoolConfig(num_envs=1, backend="ray", max_retries=2, backoff_s=0.01)
    with EnvPool(DyingEnvFactory(), cfg) as pool:
        pool.async_reset([0], Task("a", "train", "p"))
        (r,) = pool.recv()
        assert r.done and r.info["env_error"] == "crash" and "Ray actor died" in r.observation
        assert pool.recv(timeout=0.5) == []  # idle: no respawn until the next call
        assert pool.health["crashes"] == 3  # the first attempt + 2 retries
        assert pool.health["restarts"] == 2  # respawned for each retry, not in a loop


def test_ray_config_errors_name_the_key_the_value_and_the_fix(monkeypatch):
    from jaxagent.errors import ConfigError
    from jaxagent.pool import ray_backend
    from jaxagent.train.config import load_config

    with pytest.raises(ConfigError, match=r"env\.pool\.ray_address='head'; use ''"):
        load_config(None, ["env.pool.backend=ray", "env.pool.ray_address=head"])
    with pytest.raises(ConfigError, match=r"env\.pool\.ray_num_cpus=-1\.0 must be >= 0"):
        load_config(None, ["env.pool.backend=ray", "env.pool.ray_num_cpus=-1"])
    config = load_config(
        None, ["env.pool.backend=ray", "env.pool.ray_address=ray://head:10001"]
        + ["env.pool.ray_resources={env_host: 1}"]
    )  # fmt: skip
    pool = config.env.pool_config(seed=0)
    assert pool.ray_address == "ray://head:10001" and pool.ray_resources == (("env_host", 1),)
    # a FaultLog's shared-memory counters reach only multiprocessing children: refused, in
    # one line naming the fix (ray_backend.RayFaultLog counts in a Ray actor instead)
    shared = FaultyEnvFactory(FakeToolEnvFactory(), FaultConfig(crash=0.1), FaultLog.create())
    with pytest.raises(ValueError, match="cannot be pickled.*the ray backend sends it"):
        EnvPool(shared, PoolConfig(num_envs=1, backend="ray"))
    monkeypatch.setattr(ray_backend, "find_spec", lambda name: None)  # Ray not installed
    with pytest.raises(ConfigError) as err:
        load_config(None, ["env.pool.backend=ray"])
    assert str(err.value) == "env.pool.backend='ray' needs Ray: pip install 'jaxagent[ray]'"


def test_a_suite_registered_at_run_time_runs_in_actors_from_yaml():
    # The echo suite is registered inside the test (tests/test_add_env.py): the actors rebuild
    # it from the test module, importable there because they extend their sys.path with this
    # process's. The runner is the one a run builds from its config.
    from jaxagent.train.config import load_config
    from jaxagent.train.run import make_runner

    register_echo()
    overrides = ["env.name=echo", "env.pool.backend=ray", "env.pool.num_envs=2"]
    runner = make_runner(load_config(None, overrides))
    try:
        tasks = [Task(f"e{i}", "train", "", {"word": w}) for i, w in enumerate(["ok", "red"])]
        replies = runner.reset([0, 1], tasks)
        assert [r.observation for r in replies] == ["say ok", "say red"]
        steps = runner.step([0, 1], ["ok", "blue"])
    finally:
        runner.close()
    assert [(s.reward, s.done, s.error) for s in steps] == [(1.0, True, None), (0.0, True, None)]


@pytest.mark.slow  # ~40 s here, most of it compiling the tiny model, as for the process backend
def test_one_training_iteration_runs_on_ray_actors(tmp_path):
    echo_trains_one_iteration("ray", tmp_path)
