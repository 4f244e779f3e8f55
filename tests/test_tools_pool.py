"""Both tool worlds speak the pool protocol: episodes run through ``EnvPool`` end with the
same verdicts as when run directly."""

import numpy as np
import pytest

from jaxagent.envs.tools import quickstart as Q
from jaxagent.pool import EnvPool, PoolConfig


def make_quickstart_env(env_id):
    del env_id
    return Q.QuickstartEnv()


def _drive(pool, tasks, make_policy):
    """Runs every task once through the pool; returns {task id: last EnvReply}."""
    policies, running, todo, done = {}, {}, list(tasks), {}
    free = list(range(pool.num_envs))
    while todo or running:
        while todo and free:
            env_id, task = free.pop(), todo.pop()
            pool.async_reset([env_id], task)
            running[env_id], policies[env_id] = task, make_policy(task)
        for step in pool.recv(min_batch=1):
            if step.done:
                done[running.pop(step.env_id).id] = step
                free.append(step.env_id)
            else:
                pool.send([step.env_id], [policies[step.env_id](step.observation)])
    return done


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_quickstart_through_pool(backend):
    tasks = Q.QuickstartWorld(num_train=0, num_test=24).tasks("test")
    rng = np.random.default_rng(0)
    with EnvPool(make_quickstart_env, PoolConfig(num_envs=4, backend=backend)) as pool:
        done = _drive(pool, tasks, lambda t: Q.ExpertPolicy(t, 0.0, rng).act)
        assert pool.health.snapshot()["episodes_started"] == len(tasks)
    assert len(done) == len(tasks)
    assert all(s.info["success"] and s.reward == 1.0 for s in done.values())


def test_bfcl_through_pool():
    pytest.importorskip("bfcl_eval")
    from jaxagent.envs.tools import bfcl as B
    from jaxagent.envs.tools.bfcl import data as D

    entries = D.load_entries("multi_turn_base")[:8]
    tasks = [D.entry_to_task(e) for e in entries]

    def gt_policy(task):
        script = []
        for calls in task.data["ground_truth"]:
            script += (["[" + ", ".join(calls) + "]"] if calls else []) + ["Final: done"]
        return lambda obs, it=iter(script): next(it)

    with EnvPool(lambda i: B.BFCLEnv(), PoolConfig(num_envs=3)) as pool:
        done = _drive(pool, tasks, gt_policy)
    assert len(done) == 8 and all(s.info["success"] for s in done.values())
