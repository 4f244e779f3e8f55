"""Pool backends: where each worker's environment runs (a thread, a process, ...).

``EnvPool`` talks to its workers through two small protocols and a table:

* ``Worker``: ``submit(seq, cmd, payload)`` runs one ``reset``/``step`` call; ``stop(timeout)``
  ends the worker politely, ``kill()`` at once (a hung call's late result is then dropped by
  its stale ``generation``). A worker reports on the pool's result queue: one
  ``Outcome(status="ready")`` once its env is built (call timeouts count from then), then one
  ``Outcome`` per submitted call, or an ``Outcome(seq=None, status="crash")`` when it dies.
* ``Backend``: ``spawn(env_id, generation, results) -> Worker``, plus ``stop_timeout_s``, how
  long ``EnvPool.close`` waits for each worker.
* ``BACKENDS``: ``PoolConfig.backend`` name -> ``factory(env_fn, config) -> Backend``. A
  factory may carry ``check_config(config)``, which ``PoolConfig`` runs to validate the
  backend's own fields (``jaxagent.pool.ray_backend``: Ray installed, its address).

A new backend (a remote service, ...) is one module with a ``Backend`` whose workers
keep the ``Outcome`` contract (``jaxagent.pool.workers`` has the shared ``execute``), and one
entry here (or a ``register_backend`` call); timeouts, retries, restarts and health stay in
the pool, identical for every backend.
"""

from __future__ import annotations

import dataclasses
import queue
from collections.abc import Callable
from typing import Any, Protocol

from jaxagent.pool.ray_backend import RayBackend
from jaxagent.pool.shipping import worker_imports
from jaxagent.pool.workers import ProcessWorker, ThreadWorker, make_context


class Worker(Protocol):
    def submit(self, seq: int, cmd: str, payload: Any) -> None: ...

    def stop(self, timeout: float) -> None: ...

    def kill(self) -> None: ...


class Backend(Protocol):
    stop_timeout_s: float

    def spawn(self, env_id: int, generation: int, results: queue.SimpleQueue) -> Worker: ...


@dataclasses.dataclass
class ThreadBackend:
    """Envs in daemon threads of this process: for I/O-bound tool envs. A hung thread cannot
    be killed; it is abandoned (its late answer is dropped)."""

    env_fn: Callable[[int], Any]
    config: Any = None
    stop_timeout_s: float = 0.0

    def spawn(self, env_id: int, generation: int, results) -> Worker:
        return ThreadWorker(self.env_fn, env_id, generation, results)


class ProcessBackend:
    """Envs in child processes (``config.start_method``): for CPU-bound or crash-prone envs.
    ``env_fn`` must pickle and be importable in a worker (``jaxagent.pool.shipping``); a hung
    or dead process is killed and replaced."""

    stop_timeout_s = 1.0

    def __init__(self, env_fn: Callable[[int], Any], config):
        modules = worker_imports(env_fn, config.start_method)  # raises if no worker could
        self.env_fn = env_fn
        self._context = make_context(config.start_method, preload=modules)

    def spawn(self, env_id: int, generation: int, results) -> Worker:
        return ProcessWorker(self.env_fn, env_id, generation, results, self._context)


BACKENDS: dict[str, Callable[[Callable[[int], Any], Any], Backend]] = {
    "thread": ThreadBackend,
    "process": ProcessBackend,
    "ray": RayBackend,  # Ray actors, on this host or a cluster (imports Ray only when built)
}


def register_backend(name: str, factory: Callable[[Callable[[int], Any], Any], Backend]) -> None:
    """Add ``PoolConfig.backend=name``: ``factory(env_fn, config) -> Backend``."""
    if name in BACKENDS and BACKENDS[name] is not factory:
        raise ValueError(f"pool backend {name!r} is already registered; pick another name")
    BACKENDS[name] = factory


def make_backend(env_fn: Callable[[int], Any], config) -> Backend:
    try:
        factory = BACKENDS[config.backend]
    except KeyError:
        raise ValueError(
            f"PoolConfig.backend={config.backend!r}; choose one of {tuple(BACKENDS)}"
        ) from None
    return factory(env_fn, config)
