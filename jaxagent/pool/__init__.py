"""Host-side asynchronous environment pool (see DESIGN.md).

``EnvPool`` for text environments (its workers run on a backend from
``jaxagent.pool.backends``: threads or processes), ``AsyncEnvPool`` for asyncio code,
``ArrayEnvPool`` for batched array environments (MuJoCo), and ``DevicePrefetcher`` (imports
JAX lazily) for double-buffered transfer in user loops. Episodes become learner rows in one
place, ``jaxagent.agents.batch.pack_episodes``.
"""

from jaxagent.pool.aio import AsyncEnvPool
from jaxagent.pool.array_pool import ArrayBatch, ArrayEnvPool
from jaxagent.pool.config import PoolConfig
from jaxagent.pool.health import Health
from jaxagent.pool.health_check import HealthReport, run_health_check
from jaxagent.pool.pool import EnvPool, PoolStep, episode_seed

__all__ = [
    "ArrayBatch",
    "ArrayEnvPool",
    "AsyncEnvPool",
    "DevicePrefetcher",
    "EnvPool",
    "Health",
    "HealthReport",
    "PoolConfig",
    "PoolStep",
    "episode_seed",
    "run_health_check",
]


def __getattr__(name):
    # DevicePrefetcher imports JAX; keep worker processes (which import this package) JAX-free.
    if name == "DevicePrefetcher":
        from jaxagent.pool.prefetch import DevicePrefetcher

        return DevicePrefetcher
    raise AttributeError(f"module 'jaxagent.pool' has no attribute {name!r}")
