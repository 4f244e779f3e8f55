"""Host-side asynchronous environment pool (see DESIGN.md).

``EnvPool`` for text environments (its workers run on a backend from
``jaxagent.pool.backends``: threads, processes or Ray actors), ``AsyncEnvPool`` for asyncio code,
``ArrayEnvPool`` for batched array environments (MuJoCo) and ``run_episodes`` (every task to
its end, one policy per episode). Nothing here touches a device: episodes become learner rows
in one place, ``jaxagent.agents.batch.pack_episodes``.
"""

from jaxagent.pool.aio import AsyncEnvPool
from jaxagent.pool.array_pool import ArrayBatch, ArrayEnvPool
from jaxagent.pool.config import PoolConfig
from jaxagent.pool.episodes import EpisodeEnd, EpisodeRun, run_episodes
from jaxagent.pool.health import Health
from jaxagent.pool.pool import EnvPool
from jaxagent.pool.steps import EnvReply, episode_seed

__all__ = [
    "ArrayBatch",
    "ArrayEnvPool",
    "AsyncEnvPool",
    "EnvPool",
    "EnvReply",
    "EpisodeEnd",
    "EpisodeRun",
    "Health",
    "PoolConfig",
    "episode_seed",
    "run_episodes",
]
