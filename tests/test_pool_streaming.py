"""Bucket errors and the asyncio front-end of the pool."""

import asyncio

import pytest

from jaxagent.buckets import pick_bucket
from jaxagent.envs.base import Task
from jaxagent.envs.faults import FaultConfig, FaultLog, FaultyEnvFactory
from jaxagent.pool import EnvPool, PoolConfig
from jaxagent.pool.aio import AsyncEnvPool
from jaxagent.pool.fake_env import FakeToolEnvFactory


def test_bucket_errors_are_readable():
    with pytest.raises(ValueError, match="length 9 exceeds the largest bucket 8"):
        pick_bucket(9, (4, 8))
    with pytest.raises(ValueError, match="batch size 5 exceeds"):
        pick_bucket(5, (2, 4), what="batch size")


def test_async_front_end_runs_episodes_as_coroutines_with_faults():
    log = FaultLog.create()
    env_fn = FaultyEnvFactory(
        FakeToolEnvFactory(episode_len=3, latency_s=0.01), FaultConfig(crash=0.1, seed=2), log
    )

    async def main():
        pool = AsyncEnvPool(EnvPool(env_fn, PoolConfig(num_envs=8, max_retries=0)))
        async with pool:

            async def episode(env_id, tasks):
                finals = []
                for task in tasks:
                    r = await pool.reset(env_id, task)
                    k = 0
                    while not r.done:
                        r = await pool.step(env_id, f"call {k}")
                        k += 1
                    finals.append(r)
                return finals

            tasks = [Task(f"t{i}", "train", "p") for i in range(40)]
            results = await asyncio.gather(*(episode(e, tasks[e::8]) for e in range(8)))
            return [r for rs in results for r in rs], pool.pool.health.snapshot()

    finals, health = asyncio.run(main())
    assert len(finals) == 40
    errors = [r for r in finals if r.env_error]
    assert all(r.info["env_error"] == "crash" for r in errors)
    assert all(r.reward == 1.0 for r in finals if not r.env_error)
    assert health["crashes"] == log.counts()["crash"] == len(errors) > 0
