"""EnvPool: N text environments stepped concurrently, EnvPool-style ``send`` / ``recv``.

    pool = EnvPool(make_env, PoolConfig(num_envs=16, backend="process", step_timeout_s=5))
    pool.async_reset(range(16), tasks)          # start one episode per env
    while episodes remain:
        for r in pool.recv(min_batch=4):        # whichever envs answered first
            if r.done: record(r) ...            # r.info["termination"] says how it ended
            else: pool.send([r.env_id], [policy(r.observation)])

Guarantees:
  * Every call (reset or step) gets exactly one answer; answers only follow calls.
  * No episode is ever lost: every episode started by ``async_reset`` yields exactly one
    ``EnvReply`` with ``done=True``, unless the caller itself abandons it by resetting the env
    mid-episode (counted in ``episodes_abandoned``, no answer emitted). If its env failed
    (timeout, crash, corrupt data, exception) that step carries
    ``info["termination"] == "env_error"`` and ``info["failure_mode"] == "env_error"``, plus
    the reason in ``info["env_error"]``.
  * A failed ``reset`` is retried up to ``max_retries`` times with exponential back-off (a reset
    is idempotent); a failed ``step`` is not retried (the env's state is lost with the worker), so
    the episode ends with env_error.
  * Timeouts and crashes restart the worker (a fresh env from ``env_fn``); hung threads are
    abandoned and their late answers dropped.
  * Seeds are deterministic: episode ``k`` of env ``i`` (attempt ``a``) is seeded with
    ``episode_seed(config.seed, i, k, a)`` through the env's optional ``seed`` method.

Where the envs run is the backend's business (``jaxagent.pool.backends``: thread, process, one
table entry per backend); deadlines and reset retries live in ``jaxagent.pool.timers``.
Observations come back whole: the one truncation knob is the rollout's
(``rollout.max_observation_chars``, applied by ``jaxagent.agents.rollout``), so what the policy
sees and what the episode records are cut in one place, the same way under every backend.
"""

from __future__ import annotations

import dataclasses
import numbers
import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from jaxagent.envs.base import Task
from jaxagent.pool.backends import make_backend
from jaxagent.pool.config import PoolConfig
from jaxagent.pool.health import Health
from jaxagent.pool.steps import EnvReply, episode_seed, step_reply, validate_answer
from jaxagent.pool.timers import RETRY, RetryPolicy, Timers
from jaxagent.pool.workers import Outcome


@dataclasses.dataclass
class _Call:
    seq: int
    kind: str
    payload: Any
    deadline: float
    sent_at: float
    attempt: int = 0
    timeout: float = 0.0


@dataclasses.dataclass
class _Slot:
    worker: Any
    generation: int = 0
    episode_id: int | None = None
    episode_index: int = -1
    task: Task | None = None
    call: _Call | None = None
    retry_at: float | None = None  # a reset retry is scheduled
    retry_attempt: int = 0
    ready: bool = False  # the worker has built its env (timeouts count from then)
    lost: tuple[str, str] | None = None  # the worker died between calls mid-episode


class EnvPool:
    """Concurrent text environments with timeouts, retries, restarts and health counters."""

    def __init__(self, env_fn: Callable[[int], Any], config: PoolConfig):
        self.config = config
        self.env_fn = env_fn
        self.health = Health(latency_window=config.latency_window)
        self._results: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.RLock()
        self._ready: list[EnvReply] = []
        # The envs with a call in flight or a retry scheduled (recv's pending count), and the
        # deadlines of both (jaxagent.pool.timers).
        self._busy: set[int] = set()
        self._timers = Timers(self._timer_live, compact_at=4 * config.num_envs + 64)
        self._retry = RetryPolicy.of(config)
        self._seq = 0
        self._next_episode = 0
        self._closed = False
        self._backend = make_backend(env_fn, config)
        self._slots = [_Slot(worker=self._spawn(i, 0)) for i in range(config.num_envs)]

    # ------------------------------------------------------------------ public API

    @property
    def num_envs(self) -> int:
        return self.config.num_envs

    def async_reset(self, env_ids: Iterable[int], tasks: Sequence[Task] | Task) -> list[int]:
        """Start one episode per env (tasks broadcast if one is given); returns episode ids."""
        env_ids = [self._check_env_id(i) for i in env_ids]
        if isinstance(tasks, Task):
            tasks = [tasks] * len(env_ids)
        if len(tasks) != len(env_ids):
            raise ValueError(
                f"async_reset got {len(env_ids)} env_ids but {len(tasks)} tasks; pass one task "
                "per env id (or a single Task to broadcast)"
            )
        episode_ids = []
        with self._lock:
            self._check_idle(env_ids, "reset")  # validate everything before submitting anything
            for env_id in env_ids:
                slot = self._slots[env_id]
                if slot.episode_id is not None:  # the caller ended it (e.g. its turn budget)
                    self.health.add("episodes_abandoned")
                    slot.lost = None
                slot.episode_id, self._next_episode = self._next_episode, self._next_episode + 1
                slot.episode_index += 1
                slot.task = tasks[len(episode_ids)]
                self.health.add("episodes_started")
                self._submit_reset(env_id, attempt=0)
                episode_ids.append(slot.episode_id)
        return episode_ids

    def send(self, env_ids: Iterable[int], actions: Sequence[str]) -> None:
        """Send one action per env; each env must be in an episode and idle."""
        env_ids = [self._check_env_id(i) for i in env_ids]
        if len(actions) != len(env_ids):
            raise ValueError(f"send got {len(env_ids)} env_ids but {len(actions)} actions")
        with self._lock:
            self._check_idle(env_ids, "send")
            for env_id in env_ids:
                if self._slots[env_id].episode_id is None:
                    raise ValueError(
                        f"env {env_id} has no running episode (it ended or was never reset); "
                        "call async_reset([env_id], task) first"
                    )
            for env_id, action in zip(env_ids, actions):
                slot = self._slots[env_id]
                if slot.lost is not None:  # its worker died between calls: answer with the loss
                    reason, detail = slot.lost
                    slot.lost = None
                    where = dict(env_id=env_id, episode_id=slot.episode_id)
                    self._finish(slot, EnvReply.failed(reason, detail, **where))
                    continue
                self._submit(env_id, "step", action, self.config.step_timeout_s)

    def pending(self) -> int:
        """Calls in flight or scheduled, plus answers ready to be received."""
        with self._lock:
            return len(self._busy) + len(self._ready)

    def recv(self, min_batch: int = 1, timeout: float | None = None) -> list[EnvReply]:
        """Block until at least ``min_batch`` answers are ready (fewer if fewer are pending).

        Returns every ready answer (possibly more than ``min_batch``). With ``timeout`` it
        returns what is ready after that many seconds, possibly nothing.
        """
        if min_batch < 1:
            raise ValueError(f"recv(min_batch={min_batch}) needs min_batch >= 1")
        give_up = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                # Answers already in are handled before deadlines are checked: each is judged
                # by when it arrived (``Outcome.at``), however long the caller was away.
                self._drain()
                self._poll_timers()
                need = min(min_batch, self.pending())
                # With nothing pending, return at once unless a timeout asks to wait for work.
                if (
                    (need and len(self._ready) >= need)
                    or (not need and timeout is None)
                    or self._closed
                ):
                    out, self._ready = self._ready, []
                    return out
                wait = self._timers.next_time() - time.monotonic()
            if give_up is not None:
                wait = min(wait, give_up - time.monotonic())
                if wait <= 0:
                    with self._lock:
                        out, self._ready = self._ready, []
                        return out
            try:
                outcome = self._results.get(timeout=max(wait, 0.0) + 1e-4)
            except queue.Empty:
                continue
            with self._lock:
                self._handle(outcome)
                self._drain()

    def _drain(self) -> None:
        """Handle every outcome already queued, without blocking."""
        while True:
            try:
                self._handle(self._results.get_nowait())
            except queue.Empty:
                return

    def close(self) -> None:
        """Stop every worker (hung ones are killed); safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            workers = [s.worker for s in self._slots if s.worker is not None]
        for w in workers:
            w.stop(timeout=self._backend.stop_timeout_s)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # ---------------------------------------------------------------- internals

    def _check_env_id(self, env_id) -> int:
        if not isinstance(env_id, numbers.Integral) or not 0 <= env_id < self.num_envs:
            raise ValueError(
                f"env id {env_id!r} out of range: this pool has envs 0..{self.num_envs - 1}"
            )
        return int(env_id)

    def _check_idle(self, env_ids: list[int], what: str) -> None:
        if len(set(env_ids)) != len(env_ids):
            raise ValueError(f"{what} got repeated env ids {env_ids}; one call per env at a time")
        for env_id in env_ids:
            slot = self._slots[env_id]
            if slot.call is not None or slot.retry_at is not None:
                raise ValueError(f"env {env_id} is busy; recv() its answer before {what}")

    def _spawn(self, env_id: int, generation: int):
        return self._backend.spawn(env_id, generation, self._results)

    def _restart(self, env_id: int) -> None:
        slot = self._slots[env_id]
        slot.worker.kill()
        slot.generation += 1
        if slot.ready:
            slot.worker = self._spawn(env_id, slot.generation)
            self.health.add("restarts")
        else:  # it died before building its env: respawn only when a call needs it, so a
            slot.worker = None  # broken env_fn cannot turn into an endless restart loop
        slot.ready = False

    def _submit(self, env_id: int, kind: str, payload: Any, timeout: float, attempt: int = 0):
        slot = self._slots[env_id]
        self._seq += 1
        now = time.monotonic()
        # A worker still starting gets start_timeout_s extra; the clock restarts when it is ready.
        grace = 0.0 if slot.ready else self.config.start_timeout_s
        slot.call = _Call(self._seq, kind, payload, now + timeout + grace, now, attempt, timeout)
        self._busy.add(env_id)
        self._timers.push(slot.call.deadline, self._seq, env_id)
        if slot.worker is None:
            slot.worker = self._spawn(env_id, slot.generation)
            self.health.add("restarts")
        slot.worker.submit(self._seq, kind, payload)

    def _submit_reset(self, env_id: int, attempt: int) -> None:
        slot = self._slots[env_id]
        seed = episode_seed(self.config.seed, env_id, slot.episode_index, attempt)
        self._submit(env_id, "reset", (slot.task, seed), self.config.reset_timeout_s, attempt)

    def _timer_live(self, when: float, seq: int, env_id: int) -> bool:
        slot = self._slots[env_id]
        if seq == RETRY:
            return slot.retry_at == when
        return slot.call is not None and slot.call.seq == seq and slot.call.deadline == when

    def _poll_timers(self) -> None:
        for _, seq, env_id in self._timers.due(time.monotonic()):
            slot = self._slots[env_id]
            if seq == RETRY:
                slot.retry_at = None
                self._submit_reset(env_id, slot.retry_attempt)
                continue
            self.health.add("timeouts")
            limit = slot.call.timeout if slot.ready else self.config.start_timeout_s
            self._restart(env_id)
            self._fail(env_id, "timeout", f"{slot.call.kind} exceeded {limit:.3g}s")

    def _handle(self, outcome: Outcome) -> None:
        slot = self._slots[outcome.env_id]
        if outcome.generation != slot.generation:
            self.health.add("stale_results")
            return
        if outcome.status == "ready":
            slot.ready = True
            if slot.call is not None:  # time the call from then, not from the worker's start
                now = outcome.at or time.monotonic()
                slot.call.sent_at, slot.call.deadline = now, now + slot.call.timeout
                self._timers.push(slot.call.deadline, slot.call.seq, outcome.env_id)
            return
        if outcome.seq is None:  # the worker died (or sent garbage) between calls
            if outcome.status == "crash":
                self.health.add("crashes")
                self._restart(outcome.env_id)
            else:
                self.health.add("corrupt")
            if slot.call is not None:
                self._fail(outcome.env_id, outcome.status, str(outcome.value))
            elif slot.episode_id is not None:  # reported at the next send, so every answer
                slot.lost = (outcome.status, str(outcome.value))  # still follows a call
            return
        if slot.call is None or outcome.seq != slot.call.seq:
            self.health.add("stale_results")
            return
        if outcome.at > slot.call.deadline:  # answered, but after its deadline: a timeout
            self.health.add("timeouts")
            call = slot.call
            limit = call.timeout if slot.ready else self.config.start_timeout_s
            self._restart(outcome.env_id)
            self._fail(outcome.env_id, "timeout", f"{call.kind} exceeded {limit:.3g}s")
            return
        if outcome.status == "crash":
            self.health.add("crashes")
            self._restart(outcome.env_id)
            self._fail(outcome.env_id, "crash", str(outcome.value))
        elif outcome.status == "error":
            self.health.add("exceptions")
            self._fail(outcome.env_id, "exception", str(outcome.value))
        elif outcome.status == "corrupt":
            self.health.add("corrupt")
            self._fail(outcome.env_id, "corrupt", str(outcome.value))
        else:
            self._accept(outcome.env_id, outcome.value)

    def _accept(self, env_id: int, value: Any) -> None:
        slot = self._slots[env_id]
        call, slot.call = slot.call, None
        latency = time.monotonic() - call.sent_at
        problem = validate_answer(call.kind, value)
        if problem:
            slot.call = call  # _fail reads the call's kind
            self.health.add("corrupt")
            self._fail(env_id, "corrupt", problem)
            return
        self._busy.discard(env_id)
        self.health.latency(latency)
        if call.kind == "reset":
            self.health.add("resets")
            self._ready.append(
                EnvReply(
                    value,
                    env_id=env_id,
                    episode_id=slot.episode_id,
                    kind="reset",
                    latency_s=latency,
                )
            )
            return
        self.health.add("steps")
        reply = step_reply(value, env_id=env_id, episode_id=slot.episode_id, latency_s=latency)
        if reply.done:
            self._finish(slot, reply)
        else:
            self._ready.append(reply)

    def _fail(self, env_id: int, reason: str, detail: str) -> None:
        """A call failed: retry a reset (bounded, with back-off) or end the episode labelled."""
        slot = self._slots[env_id]
        call, slot.call = slot.call, None
        attempt = self._retry.next_attempt(call.kind, call.attempt) if call is not None else None
        if attempt is not None:
            self.health.add("retries")
            slot.retry_attempt = attempt
            slot.retry_at = time.monotonic() + self._retry.delay(attempt)
            self._timers.push(slot.retry_at, RETRY, env_id)
            return
        self._busy.discard(env_id)
        if slot.episode_id is None:
            return
        latency = time.monotonic() - call.sent_at if call is not None else 0.0
        where = dict(env_id=env_id, episode_id=slot.episode_id, latency_s=latency)
        self._finish(slot, EnvReply.failed(reason, detail, **where))

    def _finish(self, slot: _Slot, reply: EnvReply) -> None:
        if reply.env_error:
            self.health.add("env_error_episodes")
        self.health.add("episodes_finished")
        self._ready.append(reply)
        slot.episode_id = None
