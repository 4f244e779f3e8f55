"""Host-side asynchronous environment pool (see DESIGN.md).

``EnvPool`` (threads or processes) for text environments, ``AsyncEnvPool`` for asyncio code,
``ArrayEnvPool`` for batched array environments (MuJoCo), ``collate`` to pad token lists to
bucketed shapes, and ``DevicePrefetcher`` (imports JAX lazily) for double-buffered transfer.
"""

from jaxagent.pool.config import PoolConfig
from jaxagent.pool.health import Health
from jaxagent.pool.pool import EnvPool, PoolStep, episode_seed

__all__ = ["EnvPool", "Health", "PoolConfig", "PoolStep", "episode_seed"]
