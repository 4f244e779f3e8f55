"""Host-side asynchronous environment pool (see DESIGN.md).

``EnvPool`` for text environments (its workers run on a backend from
``jaxagent.pool.backends``: threads or processes), ``AsyncEnvPool`` for asyncio code,
``ArrayEnvPool`` for batched array environments (MuJoCo), ``collate`` to pad token lists to
bucketed shapes, ``run_episodes`` (every task to its end, one policy per episode), and
``DevicePrefetcher`` (imports JAX lazily) for double-buffered transfer in
user loops.
"""

from jaxagent.pool.aio import AsyncEnvPool
from jaxagent.pool.array_pool import ArrayBatch, ArrayEnvPool
from jaxagent.pool.collate import Collated, collate, pick_bucket
from jaxagent.pool.config import PoolConfig
from jaxagent.pool.episodes import EpisodeEnd, EpisodeRun, run_episodes
from jaxagent.pool.health import Health
from jaxagent.pool.pool import EnvPool
from jaxagent.pool.steps import EnvReply, episode_seed

__all__ = [
    "ArrayBatch",
    "ArrayEnvPool",
    "AsyncEnvPool",
    "Collated",
    "DevicePrefetcher",
    "EnvPool",
    "EnvReply",
    "EpisodeEnd",
    "EpisodeRun",
    "Health",
    "PoolConfig",
    "collate",
    "episode_seed",
    "pick_bucket",
    "run_episodes",
]


def __getattr__(name):
    # DevicePrefetcher imports JAX; keep worker processes (which import this package) JAX-free.
    if name == "DevicePrefetcher":
        from jaxagent.pool.prefetch import DevicePrefetcher

        return DevicePrefetcher
    raise AttributeError(f"module 'jaxagent.pool' has no attribute {name!r}")
