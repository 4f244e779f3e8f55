"""``ArrayEnvPool``: the EnvPool-style ``send`` / ``recv`` API over a batched array env.

The batched backend for MuJoCo: all pending envs are stepped in ONE call of the vector env
(``MujocoVectorEnv`` steps them with one ``mujoco.batch`` call per chunk of envs, in C threads
that release the GIL), so there is no per-env IPC and no Python per env. ``send``
records actions; ``recv`` steps every env with a pending action and returns one ``ArrayBatch``
(Gymnasium conventions: ``terminated`` and ``truncated`` apart, next-step autoreset).
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from jaxagent.envs.base import ArrayEnv
from jaxagent.pool.health import Health


@dataclasses.dataclass
class ArrayBatch:
    """``env_ids [K]``, ``obs [K, obs_dim]``, ``reward``, ``terminated``, ``truncated`` ``[K]``."""

    env_ids: np.ndarray
    obs: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray


class ArrayEnvPool:
    """send/recv over a ``jaxagent.envs.base.ArrayEnv`` (``reset``, ``step``, ``step_envs``,
    ``num_envs``, ``act_dim``)."""

    def __init__(self, env: ArrayEnv, seed: int = 0):
        if not isinstance(env, ArrayEnv):
            missing = [
                n
                for n in ("num_envs", "obs_dim", "act_dim", "reset", "step", "step_envs", "close")
                if not hasattr(env, n)
            ]
            raise TypeError(
                f"ArrayEnvPool needs an ArrayEnv; {type(env).__name__} lacks "
                f"{missing} (see jaxagent.envs.base.ArrayEnv)"
            )
        self.env = env
        self.seed = seed
        self.num_envs = env.num_envs
        self.health = Health()
        self._pending = np.zeros(self.num_envs, bool)
        self._actions = np.zeros((self.num_envs, env.act_dim), np.float32)
        self._ready: ArrayBatch | None = None

    def async_reset(self) -> None:
        """Reset every env (env i seeded with ``seed + i``); the observations come from recv."""
        obs, _ = self.env.reset(seed=self.seed)
        n = self.num_envs
        self._ready = ArrayBatch(
            np.arange(n), obs, np.zeros(n), np.zeros(n, bool), np.zeros(n, bool)
        )
        self.health.add("resets", n)

    def send(self, env_ids, actions) -> None:
        env_ids = np.asarray(env_ids, np.int64)
        if self._pending[env_ids].any():
            busy = env_ids[self._pending[env_ids]].tolist()
            raise ValueError(f"envs {busy} already have an action pending; recv() first")
        self._actions[env_ids] = actions
        self._pending[env_ids] = True

    def recv(self, min_batch: int = 1) -> ArrayBatch:
        """Step all envs with a pending action (at least ``min_batch`` of them) in one call."""
        if self._ready is not None:
            out, self._ready = self._ready, None
            return out
        ids = np.flatnonzero(self._pending)
        if len(ids) < min(min_batch, self.num_envs):
            raise ValueError(
                f"recv(min_batch={min_batch}) but only {len(ids)} envs have actions pending; "
                "send() actions first (a synchronous batched backend cannot wait for more)"
            )
        start = time.perf_counter()
        if len(ids) == self.num_envs:  # the common case: one plain batched step
            obs, reward, terminated, truncated, _ = self.env.step(self._actions)
        else:
            obs, reward, terminated, truncated, _ = self.env.step_envs(ids, self._actions[ids])
        self.health.latency(time.perf_counter() - start)
        self.health.add("steps", len(ids))
        self._pending[ids] = False
        return ArrayBatch(ids, obs, reward, terminated, truncated)

    def close(self) -> None:
        self.env.close()
