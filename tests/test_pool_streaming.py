"""Bucket errors, device prefetch, the asyncio front-end, the array pool."""

import asyncio
import time

import jax
import numpy as np
import pytest

from jaxagent.buckets import pick_bucket
from jaxagent.envs.base import Task
from jaxagent.envs.faults import FaultConfig, FaultLog, FaultyEnvFactory
from jaxagent.pool import EnvPool, PoolConfig
from jaxagent.pool.aio import AsyncEnvPool
from jaxagent.pool.fake_env import FakeToolEnvFactory
from jaxagent.pool.prefetch import DevicePrefetcher


def test_bucket_errors_are_readable():
    with pytest.raises(ValueError, match="length 9 exceeds the largest bucket 8"):
        pick_bucket(9, (4, 8))
    with pytest.raises(ValueError, match="batch size 5 exceeds"):
        pick_bucket(5, (2, 4), what="batch size")


def test_prefetcher_streams_in_order_ahead_of_the_consumer():
    batches = [{"obs": np.full((2, 3), i, np.float64), "ids": np.arange(2) + i} for i in range(5)]
    pre = DevicePrefetcher(iter(batches), depth=1)
    first = next(pre)
    deadline = time.monotonic() + 5.0
    while pre.pulled < 2 and time.monotonic() < deadline:  # batch 1 moves while we hold batch 0
        time.sleep(0.01)
    assert pre.pulled >= 2
    got = [first] + list(pre)
    assert len(got) == 5
    for i, b in enumerate(got):
        assert isinstance(b["obs"], jax.Array) and b["obs"].dtype == np.float32
        np.testing.assert_array_equal(np.asarray(b["obs"]), np.full((2, 3), i))
        np.testing.assert_array_equal(np.asarray(b["ids"]), np.arange(2) + i)


def test_prefetcher_rejects_a_shape_change():
    batches = [np.zeros((2, 4)), np.zeros((2, 5))]
    pre = DevicePrefetcher(batches)
    next(pre)
    with pytest.raises(ValueError, match="fixed by batch 0.*jaxagent.buckets"):
        next(pre)


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


def test_prefetcher_places_batches_with_a_named_sharding():
    from jax.sharding import NamedSharding, PartitionSpec

    n = len(jax.devices())
    mesh = jax.make_mesh((n,), ("data",))
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    batches = [np.arange(n * 4, dtype=np.int32).reshape(n, 4) + i for i in range(3)]
    got = list(DevicePrefetcher(batches, sharding=sharding))
    assert len(got) == 3
    for i, b in enumerate(got):
        assert b.sharding == sharding and len(b.addressable_shards) == n
        np.testing.assert_array_equal(np.asarray(b), batches[i])
