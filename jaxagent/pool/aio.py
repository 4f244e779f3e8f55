"""asyncio front-end for ``EnvPool``: ``await pool.reset(env_id, task)`` / ``await pool.step(...)``.

One dispatcher thread sits in ``EnvPool.recv`` and resolves each env's pending future on the
event loop, so an agent can be written as one coroutine per episode (tunix agentic style)
while the pool keeps its timeouts, restarts and env_error labelling::

    async with AsyncEnvPool(EnvPool(make_env, PoolConfig(num_envs=64))) as pool:
        async def episode(env_id, task):
            r = await pool.reset(env_id, task)
            while not r.done:
                r = await pool.step(env_id, policy(r.observation))
            return r
        finals = await asyncio.gather(*(episode(i, t) for i, t in enumerate(tasks)))
"""

from __future__ import annotations

import asyncio
import threading

from jaxagent.envs.base import Task
from jaxagent.pool.pool import EnvPool
from jaxagent.pool.steps import EnvReply


class AsyncEnvPool:
    """Awaitable per-env calls on top of an ``EnvPool`` (which it closes on exit)."""

    def __init__(self, pool: EnvPool):
        self.pool = pool
        self._futures: dict[int, asyncio.Future] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _ensure_dispatcher(self):
        if self._thread is None:
            self._loop = asyncio.get_running_loop()
            self._thread = threading.Thread(
                target=self._dispatch, name="pool-dispatch", daemon=True
            )
            self._thread.start()

    def _dispatch(self):
        while not self._stop.is_set():
            for step in self.pool.recv(min_batch=1, timeout=0.05):
                self._loop.call_soon_threadsafe(self._resolve, step)

    def _resolve(self, step: EnvReply):
        future = self._futures.pop(step.env_id, None)
        if future is not None and not future.done():
            future.set_result(step)

    def _call(self, env_id: int, submit) -> asyncio.Future:
        self._ensure_dispatcher()
        if env_id in self._futures:
            raise ValueError(f"env {env_id} already has a call in flight; await it first")
        future = self._loop.create_future()
        self._futures[env_id] = future
        try:
            submit()
        except BaseException:
            self._futures.pop(env_id, None)
            raise
        return future

    async def reset(self, env_id: int, task: Task) -> EnvReply:
        """Start an episode; returns its first observation (or its env_error end)."""
        return await self._call(env_id, lambda: self.pool.async_reset([env_id], [task]))

    async def step(self, env_id: int, action: str) -> EnvReply:
        return await self._call(env_id, lambda: self.pool.send([env_id], [action]))

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        self.pool.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        self.close()
