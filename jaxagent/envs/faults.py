"""Fault injection: make any text environment hang, crash, return corrupt data or slow down.

A pre-launch health check runs episodes with injected failures. ``FaultyEnv`` wraps a
``TextEnv`` and, on every ``reset``/``step`` call, draws one uniform number from its own seeded
stream and picks at most one fault:

  [0, hang)                        hang: block for ``hang_s`` (the pool's timeout must fire)
  [hang, hang+crash)               crash: ``os._exit`` in a worker process (real process death),
                                   or ``EnvCrash`` in a thread worker (a process cannot be
                                   killed from one of its threads without killing the trainer)
  [.., ..+corrupt)                 corrupt: return data that violates the protocol
  [.., ..+slow)                    slow: sleep ``slow_s`` then behave normally

Every injected fault is first counted in a ``FaultLog`` (shared memory, so the count survives
the death of the process that injected it); tests compare it with the pool's health counters.

Usage::

    log = FaultLog.create()
    env_fn = FaultyEnvFactory(make_env, FaultConfig(hang=0.1, crash=0.05, corrupt=0.05), log)
    pool = EnvPool(env_fn, PoolConfig(num_envs=16, backend="process", step_timeout_s=0.5))
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from jaxagent.envs.base import StepResult, Task

FAULT_KINDS = ("hang", "crash", "corrupt", "slow")


class EnvCrash(RuntimeError):
    """An injected crash inside a thread worker (the pool treats it as a worker death)."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class FaultConfig:
    """Per-call fault probabilities (each in [0, 1], summing to at most 1)."""

    hang: float = 0.0  # probability that a call blocks for hang_s
    crash: float = 0.0  # probability that the worker dies during the call
    corrupt: float = 0.0  # probability that the call returns protocol-violating data
    slow: float = 0.0  # probability that the call first sleeps slow_s
    hang_s: float = 3600.0  # how long a hang lasts (make it finite for thread workers)
    slow_s: float = 0.05  # added latency of a slow call
    seed: int = 0  # seed of the fault stream (mixed with the env id and episode seed)

    def __post_init__(self):
        for name in FAULT_KINDS:
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"FaultConfig.{name}={p!r} must be a probability in [0, 1]")
        total = sum(getattr(self, name) for name in FAULT_KINDS)
        if total > 1.0 + 1e-9:
            raise ValueError(
                f"FaultConfig probabilities sum to {total:.3f} > 1; lower hang/crash/corrupt/slow"
            )
        if self.hang_s <= 0 or self.slow_s < 0:
            raise ValueError(f"FaultConfig.hang_s={self.hang_s} must be > 0, slow_s >= 0")


class FaultLog:
    """Counts of injected faults in shared memory (visible across worker processes)."""

    def __init__(self, array):
        self._array = array

    @classmethod
    def create(cls, context: str = "forkserver") -> FaultLog:
        """Shared counters; ``context`` must match the pool's ``PoolConfig.start_method``."""
        ctx = multiprocessing.get_context(context)
        return cls(ctx.Array("q", len(FAULT_KINDS), lock=True))

    def record(self, kind: str) -> None:
        with self._array.get_lock():
            self._array[FAULT_KINDS.index(kind)] += 1

    def counts(self) -> dict[str, int]:
        with self._array.get_lock():
            return {k: int(self._array[i]) for i, k in enumerate(FAULT_KINDS)}


def _in_worker_process() -> bool:
    return multiprocessing.parent_process() is not None


class FaultyEnv:
    """Wraps a ``TextEnv``; injects faults per call (see the module docstring)."""

    def __init__(self, env, config: FaultConfig, log: FaultLog | None = None, stream: int = 0):
        self.env = env
        self.config = config
        self.log = log
        self.stream = stream
        self._rng = np.random.default_rng([config.seed, stream])
        self._thresholds = np.cumsum([getattr(config, k) for k in FAULT_KINDS])

    def seed(self, seed: int) -> None:
        """Re-seed the fault stream for an episode (and the wrapped env, if it is seedable)."""
        self._rng = np.random.default_rng([self.config.seed, self.stream, seed])
        if hasattr(self.env, "seed"):
            self.env.seed(seed)

    def _draw(self) -> str | None:
        u = self._rng.random()
        for kind, threshold in zip(FAULT_KINDS, self._thresholds):
            if u < threshold:
                return kind
        return None

    def _inject(self, corrupt_value: Callable[[], Any]) -> tuple[bool, Any]:
        kind = self._draw()
        if kind is None:
            return False, None
        if self.log is not None:
            self.log.record(kind)
        if kind == "hang":
            threading.Event().wait(self.config.hang_s)
            raise TimeoutError(f"injected hang of {self.config.hang_s}s outlived the pool timeout")
        if kind == "crash":
            if _in_worker_process():
                os._exit(17)  # real process death: no cleanup, no reply
            raise EnvCrash("injected crash")
        if kind == "corrupt":
            return True, corrupt_value()
        time.sleep(self.config.slow_s)  # slow
        return False, None

    def reset(self, task: Task) -> str:
        corrupted, value = self._inject(lambda: {"not": "an observation"})
        return value if corrupted else self.env.reset(task)

    def step(self, action: str) -> StepResult:
        corrupted, value = self._inject(lambda: StepResult(None, float("nan"), "maybe"))  # type: ignore[arg-type]
        return value if corrupted else self.env.step(action)

    def close(self) -> None:
        self.env.close()


@dataclasses.dataclass(frozen=True)
class FaultyEnvFactory:
    """Picklable ``env_fn(env_id)`` that wraps ``make_env(env_id)`` in a ``FaultyEnv``."""

    make_env: Callable[[int], Any]
    config: FaultConfig
    log: FaultLog | None = None

    def __call__(self, env_id: int) -> FaultyEnv:
        return FaultyEnv(self.make_env(env_id), self.config, self.log, stream=env_id)
