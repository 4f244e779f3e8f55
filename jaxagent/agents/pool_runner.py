"""``PoolRunner``: the rollout driver's runner on top of the host ``EnvPool``.

One pool env per episode slot (the pool grows when a batch has more episodes than it has
envs). Every call sends to all given slots and receives until each has answered; the pool's
timeouts, restarts and reset retries turn hangs, crashes and corrupt returns into answers with
``info["termination"] == "env_error"`` (``EnvReply.error`` set). Nothing is lost.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

from jaxagent.envs.base import Task
from jaxagent.pool import EnvPool, EnvReply, PoolConfig


class PoolRunner:
    """Drives an ``EnvPool`` (thread or process backend) slot by slot.

    Args:
      env_fn: ``env_fn(env_id) -> TextEnv`` (picklable for the process backend).
      config: the pool config; ``num_envs`` is the initial size (grown on demand).
    """

    def __init__(self, env_fn: Callable[[int], object], config: PoolConfig):
        self._env_fn, self._config = env_fn, config
        self._pool: Optional[EnvPool] = None
        self._health_before: dict[str, float] = {}

    def _ensure(self, num_slots: int) -> EnvPool:
        if self._pool is None or self._pool.num_envs < num_slots:
            if self._pool is not None:
                self._health_before = _add(self._health_before, self._pool.health.snapshot())
                self._pool.close()
            size = max(num_slots, self._config.num_envs)
            cfg = self._config
            fields = {f: getattr(cfg, f) for f in cfg.__dataclass_fields__}
            self._pool = EnvPool(self._env_fn, PoolConfig(**{**fields, "num_envs": size}))
        return self._pool

    def _gather(self, pool: EnvPool, slots: Sequence[int]) -> list[EnvReply]:
        want = set(slots)
        got: dict[int, EnvReply] = {}
        while len(got) < len(want):
            for step in pool.recv(min_batch=len(want) - len(got)):
                if step.env_id in want:
                    got[step.env_id] = step
        return [got[s] for s in slots]

    def reset(self, slots: Sequence[int], tasks: Sequence[Task]) -> list[EnvReply]:
        pool = self._ensure(max(slots) + 1 if slots else 1)
        pool.async_reset(list(slots), list(tasks))
        return self._gather(pool, slots)

    def step(self, slots: Sequence[int], actions: Sequence[str]) -> list[EnvReply]:
        if not slots:
            return []
        pool = self._ensure(max(slots) + 1)
        pool.send(list(slots), list(actions))
        return self._gather(pool, slots)

    # Streaming (``jaxagent.agents.engine``): submit without waiting, take answers as they come.
    def submit_reset(self, slots: Sequence[int], tasks: Sequence[Task]) -> None:
        self._ensure(max(slots) + 1).async_reset(list(slots), list(tasks))

    def submit_step(self, slots: Sequence[int], actions: Sequence[str]) -> None:
        self._ensure(max(slots) + 1).send(list(slots), list(actions))

    def poll(self, timeout: Optional[float]) -> list[tuple[int, EnvReply]]:
        """The answers ready within ``timeout`` seconds (None: wait for at least one), as
        (slot, reply) pairs."""
        if self._pool is None:
            return []
        return [(r.env_id, r) for r in self._pool.recv(min_batch=1, timeout=timeout)]

    def health(self) -> dict[str, float]:
        now = self._pool.health.snapshot() if self._pool is not None else {}
        return _add(self._health_before, now)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None


def _add(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        if isinstance(v, (int, float)) and "latency" not in k:
            out[k] = out.get(k, 0) + v
        else:
            out[k] = v
    return out
