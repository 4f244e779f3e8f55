"""Environment runners: how the rollout driver reaches its text environments.

The driver talks to a runner with two batched calls, ``reset(slots, tasks)`` and
``step(slots, actions)``, one reply per slot. A runner never raises for an environment's
failure: a crash, a hang past the timeout, a corrupt return or a failure the environment
reports itself (``info["termination"] == "env_error"``) comes back as an ``EnvReply``
(``jaxagent.pool.steps``, the record the pool answers with too) with ``error`` set, and the
driver ends that episode with ``Termination.ENV_ERROR``.

The slot engine (``jaxagent.agents.engine``) streams instead: ``submit_reset`` /
``submit_step`` send without waiting and ``poll`` returns (slot, reply) pairs as they come,
so environment work overlaps decoding. ``PoolRunner`` (in ``jaxagent.agents.pool_runner``)
streams natively; the runners built on ``BlockingRunner`` answer at submission.

``InlineRunner`` calls the environments in the caller's thread (fast, for tests and
instantaneous worlds). ``PoolRunner`` drives the host-side ``EnvPool`` with its timeouts,
restarts and fault injection.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional, Protocol, Sequence

from jaxagent.envs.base import Task, TextEnv
from jaxagent.pool.steps import EnvReply, step_reply, validate_answer


class EnvRunner(Protocol):
    """Reaches the environments. Every failure comes back as ``EnvReply.error``: a crash, hang
    or corrupt result the runner caught, and an error the environment reports itself
    (``info["termination"] == "env_error"``, ``jaxagent.envs.base.is_env_error``)."""

    def reset(self, slots: Sequence[int], tasks: Sequence[Task]) -> list[EnvReply]: ...

    def step(self, slots: Sequence[int], actions: Sequence[str]) -> list[EnvReply]: ...

    def submit_reset(self, slots: Sequence[int], tasks: Sequence[Task]) -> None: ...

    def submit_step(self, slots: Sequence[int], actions: Sequence[str]) -> None: ...

    def poll(self, timeout: Optional[float]) -> list[tuple[int, EnvReply]]:
        """The submitted calls' answers ready within ``timeout`` seconds (None: wait for at
        least one), as (slot, reply) pairs."""

    def health(self) -> dict[str, float]: ...

    def close(self) -> None: ...


class BlockingRunner:
    """The streaming half of ``EnvRunner`` for a runner that answers synchronously: a
    submitted call runs at once (``reset`` / ``step``) and ``poll`` hands its answers over."""

    def __init__(self):
        self._answered: list[tuple[int, EnvReply]] = []

    def reset(self, slots: Sequence[int], tasks: Sequence[Task]) -> list[EnvReply]:
        raise NotImplementedError

    def step(self, slots: Sequence[int], actions: Sequence[str]) -> list[EnvReply]:
        raise NotImplementedError

    def submit_reset(self, slots: Sequence[int], tasks: Sequence[Task]) -> None:
        self._hand_over(slots, self.reset(slots, tasks))

    def submit_step(self, slots: Sequence[int], actions: Sequence[str]) -> None:
        self._hand_over(slots, self.step(slots, actions))

    def poll(self, timeout: Optional[float]) -> list[tuple[int, EnvReply]]:
        del timeout  # every answer is in already
        out, self._answered = self._answered, []
        return out

    def _hand_over(self, slots: Sequence[int], replies: list[EnvReply]) -> None:
        self._answered.extend(zip(slots, replies))


class InlineRunner(BlockingRunner):
    """Calls ``env_factory()`` instances directly; exceptions become env errors.

    Args:
      env_factory: builds one environment instance (one per slot, created lazily).
    """

    def __init__(self, env_factory: Callable[[], TextEnv]):
        super().__init__()
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

    def env(self, slot: int) -> TextEnv:
        """The slot's environment instance (built on first use), e.g. to ask what it can do."""
        return self._env(slot)

    def snapshot(self, slot: int) -> Any:
        """The slot's environment state (``jaxagent.envs.base.SnapshotEnv``): tree search
        (DFSDT) restores it to try another branch. In-process envs only: a pool worker's
        state stays in its process."""
        return self._env(slot).snapshot()

    def restore(self, slot: int, state: Any) -> None:
        self._env(slot).restore(state)

    def _call(self, slot: int, fn: Callable[[TextEnv], Any], kind: str) -> EnvReply:
        self._counters["calls"] += 1
        start = time.perf_counter()
        try:
            out = fn(self._env(slot))
            problem = validate_answer(kind, out)  # the pool's check, so both backends agree
            if problem:
                reply = EnvReply.failed("corrupt", problem, env_id=slot)
            elif kind == "reset":
                reply = EnvReply(out, env_id=slot, kind="reset")
            else:
                reply = step_reply(out, env_id=slot)
        except Exception as exc:  # an env failure must never end the rollout
            reply = EnvReply.failed("exception", f"{type(exc).__name__}: {exc}", env_id=slot)
        reply.latency_s = time.perf_counter() - start
        self._latencies.append(reply.latency_s)
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
        return [self._call(s, lambda e, t=t: e.reset(t), "reset") for s, t in zip(slots, tasks)]

    def step(self, slots: Sequence[int], actions: Sequence[str]) -> list[EnvReply]:
        return [self._call(s, lambda e, a=a: e.step(a), "step") for s, a in zip(slots, actions)]

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
