"""Environment runners: how the rollout driver reaches its text environments.

The driver talks to a runner with two batched calls, ``reset(slots, tasks)`` and
``step(slots, actions)``, one reply per slot. A runner never raises for an environment's
failure: a crash, a hang past the timeout, a corrupt return or a failure the environment
reports itself (``info["termination"] == "env_error"``) comes back as an ``EnvReply`` with
``error`` set, and the driver ends that episode with ``Termination.ENV_ERROR``.

``InlineRunner`` calls the environments in the caller's thread (fast, for tests and
instantaneous worlds). ``PoolRunner`` (in ``jaxagent.agents.pool_runner``) drives the
host-side ``EnvPool`` with its timeouts, restarts and fault injection.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Optional, Protocol, Sequence

from jaxagent.envs.base import StepResult, Task, TextEnv, env_error_message, is_env_error


@dataclasses.dataclass
class EnvReply:
    """One environment answer; ``error`` is set when the environment itself failed."""

    observation: str
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    error: Optional[str] = None

    @classmethod
    def failed(cls, message: str) -> "EnvReply":
        return cls(observation="", reward=0.0, done=True, info={}, error=message)


class EnvRunner(Protocol):
    """Reaches the environments. Every failure comes back as ``EnvReply.error``: a crash, hang
    or corrupt result the runner caught, and an error the environment reports itself
    (``info["termination"] == "env_error"``, ``jaxagent.envs.base.is_env_error``)."""

    def reset(self, slots: Sequence[int], tasks: Sequence[Task]) -> list[EnvReply]: ...

    def step(self, slots: Sequence[int], actions: Sequence[str]) -> list[EnvReply]: ...

    def health(self) -> dict[str, float]: ...

    def close(self) -> None: ...


def _check_result(result: Any) -> EnvReply:
    if not isinstance(result, StepResult) or not isinstance(result.observation, str):
        return EnvReply.failed(f"corrupt step result of type {type(result).__name__}")
    try:
        reward = float(result.reward)
    except (TypeError, ValueError):
        return EnvReply.failed(f"corrupt reward {result.reward!r}")
    if reward != reward:  # NaN
        return EnvReply.failed("corrupt reward nan")
    info = dict(result.info or {})
    if is_env_error(info):  # the env caught its own failure (world exception, sandbox error)
        return EnvReply(result.observation, 0.0, True, info, error=env_error_message(info))
    return EnvReply(result.observation, reward, bool(result.done), info)


class InlineRunner:
    """Calls ``env_factory()`` instances directly; exceptions become env errors.

    Args:
      env_factory: builds one environment instance (one per slot, created lazily).
    """

    def __init__(self, env_factory: Callable[[], TextEnv]):
        self._factory = env_factory
        self._envs: dict[int, TextEnv] = {}
        # env_error_episodes has the pool's meaning (episodes ended by an env failure), so
        # env-health metrics read the same under every backend.
        self._counters = {"calls": 0, "errors": 0, "restarts": 0, "env_error_episodes": 0}
        self._latencies: list[float] = []

    def _env(self, slot: int) -> TextEnv:
        if slot not in self._envs:
            self._envs[slot] = self._factory()
        return self._envs[slot]

    def _call(self, slot: int, fn: Callable[[TextEnv], Any], reset: bool) -> EnvReply:
        self._counters["calls"] += 1
        start = time.perf_counter()
        try:
            out = fn(self._env(slot))
            if reset:
                if not isinstance(out, str):
                    raise TypeError(f"reset returned {type(out).__name__}, expected str")
                reply = EnvReply(out)
            else:
                reply = _check_result(out)
        except Exception as exc:  # an env failure must never end the rollout
            reply = EnvReply.failed(f"{type(exc).__name__}: {exc}")
        self._latencies.append(time.perf_counter() - start)
        if reply.error is not None:
            self._counters["errors"] += 1
            self._counters["env_error_episodes"] += 1
            self._restart(slot)
        return reply

    def _restart(self, slot: int) -> None:
        env = self._envs.pop(slot, None)
        self._counters["restarts"] += 1
        try:
            if env is not None:
                env.close()
        except Exception:  # closing a broken env may fail too
            pass

    def reset(self, slots: Sequence[int], tasks: Sequence[Task]) -> list[EnvReply]:
        return [self._call(s, lambda e, t=t: e.reset(t), True) for s, t in zip(slots, tasks)]

    def step(self, slots: Sequence[int], actions: Sequence[str]) -> list[EnvReply]:
        return [self._call(s, lambda e, a=a: e.step(a), False) for s, a in zip(slots, actions)]

    def health(self) -> dict[str, float]:
        lat = sorted(self._latencies) or [0.0]
        out = {k: float(v) for k, v in self._counters.items()}
        out["latency_p50_ms"] = 1e3 * lat[len(lat) // 2]
        out["latency_p99_ms"] = 1e3 * lat[min(len(lat) - 1, int(0.99 * len(lat)))]
        return out

    def close(self) -> None:
        for slot in list(self._envs):
            try:
                self._envs.pop(slot).close()
            except Exception:
                pass
