"""A MuJoCo environment stepped through ``EnvPool``: the manipulation world (a text world
whose every skill call runs a controller in MuJoCo) driven by its scripted expert through the
thread pool and the process pool (a fork-server worker builds MuJoCo in its own process). The
physics is deterministic, so every episode's reward, success, steps and final observation
equal a direct loop over the same environment."""

import random

import pytest

from jaxagent.envs import get_env_spec
from jaxagent.envs.registry import EnvFactory
from jaxagent.pool import EnvPool, PoolConfig, run_episodes

SPEC = get_env_spec("manipulation")
TASKS = list(SPEC.make_source().tasks("train"))[:4]


def _expert(task):
    return SPEC.make_expert(task, 0.0, random.Random(0)).act


def _direct(task):
    env, policy = SPEC.make_env(), _expert(task)
    obs, steps = env.reset(task), 0
    while True:
        r = env.step(policy(obs))
        steps += 1
        if r.done:
            env.close()
            return r.reward, bool(r.info.get("success")), steps, r.observation
        obs = r.observation


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_mujoco_world_through_the_pool_equals_a_direct_loop(backend):
    config = PoolConfig(num_envs=2, backend=backend, step_timeout_s=120, start_timeout_s=120)
    # the suite rebuilt by name in each worker (picklable for the process backend)
    with EnvPool(EnvFactory("manipulation"), config) as pool:
        run = run_episodes(pool, TASKS, _expert, recv_timeout_s=300)
    got = {
        ep.task.id: (ep.final.reward, ep.success, ep.steps, ep.final.observation)
        for ep in run.episodes
    }
    want = {t.id: _direct(t) for t in TASKS}
    assert got == want
    assert not any(ep.final.env_error for ep in run.episodes)
    assert sum(s for _, s, _, _ in want.values()) >= 2  # the expert solves most: real physics
