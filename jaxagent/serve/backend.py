"""The model side of the server: one device thread, a pool of KV slots, continuous batching.

``SlotBackend`` is the second client of the rollout engine's slot table
(``jaxagent.agents.slots.SlotTable`` over a ``jaxagent.generate.slots.SlotSampler`` pool),
on one thread. Requests arrive as ``Job``s on a queue; each round the thread gives every
waiting job it has a slot for its slot (``SlotTable.on_reply``) and admits them (one device
call per sampling key: their contexts are prefilled together), then runs at most
``decode_steps`` decode steps of every slot with a turn under way, so concurrent requests
share the decode batch and a finished turn leaves within a bounded number of steps while the
others keep their rows.

KV reuse. The table keeps the ids of what each slot's cache holds (``SlotTable.held``); a
session keeps its slot between requests. Only the part of a job's context after its common
prefix with the slot's ids is prefilled: the next turn of a conversation prefills just the
new messages, and a divergent history (an edited message, a retried turn) rewinds the slot to
the common prefix instead of starting over (the cache's length is set back: attention reads
only slots below a row's length, ``Transformer.hidden``). With every slot taken, the least
recently used idle slot is given to the new session (``evictions`` counts it); that
session's next request prefills its whole context again.

Sampling. A job draws from ``row_uniforms(key, N, row, turn)`` as the rollout driver does:
with a request ``seed``, the key is ``jax.random.key(seed)``, the row its choice index and the
turn the session's turn number, so a harness that sends the driver's key as its seed samples
exactly the driver's tokens; for the sessions of a harness run (``jaxagent.serve.harness``)
the run's key and the episode's row, as the driver draws them; otherwise a server key and a
fresh row per job. The settings
``SlotSampler`` compiles in (temperature, top-p, greedy) are one per device program: jobs
whose settings differ from the running ones wait until those end (first come, first served),
since one ``decode`` call would otherwise step every slot under one setting.

A turn ends at a stop token, at ``max_new_tokens``, at the request's ``max_tokens``, at one of
its ``stop`` strings, or when its client goes away; the last three stop the slot between
decode calls and set its cache back to the kept tokens.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import jax

from jaxagent.agents.slots import SlotTable, common_prefix
from jaxagent.buckets import bucket
from jaxagent.errors import ConfigError
from jaxagent.generate import SamplingConfig
from jaxagent.generate.grammar import GrammarTable
from jaxagent.generate.slots import SlotSampler


class Backend(Protocol):
    """What the app needs of the model side (``SlotBackend``; tests script one): sampling
    settings, rows for the sampling key, job submission, and the release of an ended
    session's slot."""

    max_new_tokens: int
    capacity: int
    stats: "BackendStats"

    def sampling_for(self, temperature: float | None, top_p: float | None) -> SamplingConfig: ...

    def compile(self, regex: str) -> int: ...

    def next_row(self) -> int: ...

    def submit(self, job: "Job") -> None: ...

    def release(self, session: str) -> None: ...

    def close(self) -> None: ...


@dataclasses.dataclass
class Job:
    """One choice of one request, as the device thread serves it.

    ``emit(kind, payload)`` is called from the device thread: ("tokens", (ids, logprobs)) for
    every new stretch of a turn when ``stream``; ("done", Result) at the end; ("error",
    exception) when it failed.
    """

    session: str | None  # the slot owner; None for a throw-away slot
    context: list[int]
    sampling: SamplingConfig
    max_tokens: int
    stops: tuple[str, ...]
    seed: int | None
    row: int  # the sampling stream's row (choice index, or a fresh one without a seed)
    turn: int
    emit: Callable[[str, object], None]
    stream: bool = False
    # A sampling key of the caller's (a rollout's key for the sessions of a harness run,
    # ``jaxagent.serve.harness``) and a hashable name for it; overrides ``seed``.
    key: object = None
    key_id: object = None
    cancelled: bool = False
    # Constrained decoding: the turn's start state in ``SlotBackend.compile``'s automata
    # (-1: free).
    gstart: int = -1
    # filled in by the device thread
    slot: int = -1
    start: int = 0
    sent: int = 0
    cached: int = 0
    admitted_at: float = 0.0


@dataclasses.dataclass
class Result:
    tokens: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop", "length" or "cancelled"
    cached_tokens: int  # context tokens the slot already held (KV reuse)
    version: int = 0  # the policy version that sampled it (``SlotBackend.update``)
    # Constrained decoding: per token the packed vocabulary mask it was drawn from, or None.
    masks: list | None = None


@dataclasses.dataclass(frozen=True)
class _Release:
    session: str


@dataclasses.dataclass(frozen=True)
class _Update:
    params: object
    version: int
    done: threading.Event


@dataclasses.dataclass
class _Slot:
    owner: str | None = None
    job: Job | None = None
    used: float = 0.0


@dataclasses.dataclass
class BackendStats:
    requests: int = 0
    prompt_tokens: int = 0
    reused_tokens: int = 0  # context tokens already in the slot's cache
    session_reused_tokens: int = 0  # of those, in the slot the session kept (its own turns)
    prefilled_tokens: int = 0
    generated_tokens: int = 0
    evictions: int = 0
    admit_calls: int = 0
    decode_calls: int = 0
    decode_rows: int = 0  # active slots summed over decode calls (the shared batch)
    max_batch: int = 0
    device_s: float = 0.0  # the device thread's time in admit / decode calls and reads

    def as_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["kv_reuse_rate"] = (
            self.reused_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
        )
        out["mean_batch"] = self.decode_rows / self.decode_calls if self.decode_calls else 0.0
        return out


class SlotBackend:
    """Continuous batching over ``slots`` KV rows of ``capacity`` tokens (module docstring).

    Args:
      graphdef, params: the policy.
      sampling: the server's settings (``max_new_tokens``: a turn's longest; the stop ids;
        temperature and top-p when a request sends none).
      slots, capacity: the KV pool.
      decode: ids -> text (``Chat.decode``), for ``stop`` strings.
      pad_id: padding id.
      decode_steps: decode steps per device call.
      seed: the key of requests without a seed.
      max_programs: distinct sampling settings kept compiled (least recently used dropped).
      version: the policy version of ``params`` (recorded with every turn).
      grammar: builds the ``GrammarTable`` of constrained requests (strict tool calls,
        ``response_format``), called at the first one; None: such requests are refused.
    """

    def __init__(
        self,
        graphdef,
        params,
        sampling: SamplingConfig,
        *,
        slots: int,
        capacity: int,
        decode: Callable[[Sequence[int]], str],
        pad_id: int = 0,
        decode_steps: int = 8,
        seed: int = 0,
        max_programs: int = 8,
        version: int = 0,
        grammar: Callable[[], GrammarTable] | None = None,
    ):
        self.graphdef, self.sampling = graphdef, sampling
        self._initial = (params, version)  # the table's, once the device thread has started
        self.num_slots, self.capacity, self.pad_id = slots, capacity, pad_id
        self.decode_steps, self.decode_text = decode_steps, decode
        self.max_new_tokens = sampling.max_new_tokens
        self.max_programs = max_programs
        self.key = jax.random.key(seed)
        self.stats = BackendStats()
        self._devs: collections.OrderedDict = collections.OrderedDict()
        self._queue: queue.Queue = queue.Queue()
        self._rows = itertools.count(1 << 20)  # unseeded jobs' streams, clear of choice rows
        self._closed = threading.Event()
        self._error: BaseException | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(
            target=self._main, name="jaxagent-serve-device", daemon=True
        )
        self._make_grammar, self._grammar = grammar, None
        self._grammar_lock = threading.Lock()
        self._thread.start()

    # ---- the request side ----------------------------------------------------------------
    def sampling_for(self, temperature: float | None, top_p: float | None) -> SamplingConfig:
        """The device settings of a request (the server's where it sends none)."""
        s = self.sampling
        if temperature is None:
            temperature = 0.0 if s.greedy else s.temperature
        return dataclasses.replace(
            s,
            temperature=temperature if temperature > 0 else 1.0,
            greedy=temperature == 0,
            top_p=s.top_p if top_p is None else top_p,
        )

    def compile(self, regex: str) -> int:
        """The start state of ``regex``'s token automaton (``jaxagent.generate.grammar``),
        compiled once; raises ``ConfigError`` when the vocabulary cannot write it."""
        with self._grammar_lock:
            if self._grammar is None:
                if self._make_grammar is None:
                    raise ConfigError("this server was built without constrained decoding")
                self._grammar = self._make_grammar()
            return self._grammar.start(regex)

    def _device_table(self) -> jax.Array:
        """The automata on the device (``SlotTable`` asks when a turn is constrained)."""
        with self._grammar_lock:
            return self._grammar.device_table()

    def next_row(self) -> int:
        return next(self._rows)

    def submit(self, job: Job) -> None:
        if self._error is not None:
            raise RuntimeError(f"the device thread failed: {self._error!r}")
        self._queue.put(job)

    def update(self, params, version: int) -> threading.Event:
        """Serve ``params`` as policy ``version`` from now on (a trainer's new weights); set
        once the turns under way have ended and the new weights are in place. Every cached
        context is dropped: KV written by the old weights is not the new policy's, so each
        session's next turn prefills its context again."""
        done = threading.Event()
        self._queue.put(_Update(params, version, done))
        return done

    def release(self, session: str) -> None:
        """The session ended: its slot is free for anyone (its ids stay, for prefix reuse)."""
        self._queue.put(_Release(session))

    def wait_ready(self, timeout: float = 600.0) -> None:
        self._ready.wait(timeout)
        if self._error is not None:
            raise RuntimeError(f"the device thread failed: {self._error!r}")

    def close(self) -> None:
        self._closed.set()
        self._queue.put(None)
        self._thread.join(timeout=30)

    # ---- the device thread ---------------------------------------------------------------
    def _dev(self, sampling: SamplingConfig) -> SlotSampler:
        if sampling not in self._devs:
            if len(self._devs) >= self.max_programs:
                self._devs.popitem(last=False)
            self._devs[sampling] = SlotSampler(
                self.graphdef,
                sampling,
                self.num_slots,
                self.capacity,
                pad_id=self.pad_id,
                decode_steps=self.decode_steps,
            )
        self._devs.move_to_end(sampling)
        return self._devs[sampling]

    def _main(self) -> None:
        try:
            params, version = self._initial
            self._initial = None
            self.table = SlotTable(
                self._dev(self.sampling),
                params,
                version=version,
                key=self.key,
                grammar=self._device_table,
            )
            self._slots = [_Slot() for _ in range(self.num_slots)]
            self._owned: dict[str, int] = {}
            self._waiting: collections.deque[Job] = collections.deque()
            self._running: SamplingConfig | None = None
            self._updates: collections.deque[_Update] = collections.deque()
            self._ready.set()
            self._loop()
        except BaseException as err:  # noqa: BLE001 -- reported to every waiting request
            self._error = err
            self._ready.set()
            for job in list(self._waiting) + [s.job for s in self._slots if s.job]:
                job.emit("error", err)
            while True:
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    break
                if isinstance(job, Job):
                    job.emit("error", err)

    def _busy(self) -> list[int]:
        return [i for i, s in enumerate(self._slots) if s.job is not None]

    def _loop(self) -> None:
        while not self._closed.is_set():
            idle = not self._busy() and not self._waiting
            try:
                job = self._queue.get(timeout=0.5) if idle else self._queue.get_nowait()
                while True:
                    if isinstance(job, _Update):
                        self._updates.append(job)
                    elif isinstance(job, _Release):
                        i = self._owned.pop(job.session, None)
                        if i is not None:
                            self._slots[i].owner = None
                    elif job is not None:
                        self.stats.requests += 1
                        self._waiting.append(job)
                    job = self._queue.get_nowait()
            except queue.Empty:
                pass
            if self._closed.is_set():
                return
            t0 = time.perf_counter()
            if self._updates and not self.table.switching:
                u = self._updates.popleft()
                self.table.switch_weights(u.params, u.version, u.done.set)
            self._admit()
            if self._busy():
                self._decode()
            self.stats.device_s += time.perf_counter() - t0

    def _free_slot(self, job: Job) -> int | None:
        slots, held = self._slots, self.table.held
        if job.session is not None and job.session in self._owned:
            i = self._owned[job.session]
            return i if slots[i].job is None else None
        free = [i for i, s in enumerate(slots) if s.job is None and s.owner is None]
        if free:  # an unowned slot, the one holding the longest shared prefix first
            return max(free, key=lambda i: (common_prefix(held[i], job.context), -i))
        idle = [i for i, s in enumerate(slots) if s.job is None]
        if not idle:
            return None
        i = min(idle, key=lambda i: slots[i].used)
        self.stats.evictions += 1
        del self._owned[slots[i].owner]
        slots[i].owner = None
        return i

    def _admit(self) -> None:
        keep: collections.deque[Job] = collections.deque()
        own: set[int] = set()
        while self._waiting and not self.table.switching:  # new turns wait for new weights
            job = self._waiting.popleft()
            if job.cancelled:
                job.emit("done", Result([], [], "cancelled", 0))
                continue
            if self._running is not None and job.sampling != self._running:
                keep.append(job)  # other settings: after the running turns (FIFO)
                keep.extend(self._waiting)
                self._waiting.clear()
                break
            i = self._free_slot(job)
            if i is None:
                keep.append(job)
                continue
            slot = self._slots[i]
            if job.session is not None:
                if slot.owner == job.session:
                    own.add(i)
                self._owned[job.session] = i
                slot.owner = job.session
            job.slot, job.start = i, len(job.context)
            job.admitted_at = time.perf_counter()
            slot.job, slot.used = job, time.monotonic()
            if self._running is None:
                self._running = job.sampling
                self.table.use(self._dev(job.sampling))
            if job.key is not None:
                key, key_id = job.key, ("key", job.key_id)
            elif job.seed is not None:
                key, key_id = jax.random.key(job.seed), ("seed", job.seed)
            else:
                key, key_id = None, None  # the server's key
            self.table.on_reply(
                i,
                job.context,
                row=job.row,
                turn=job.turn,
                gstart=job.gstart,
                key=key,
                key_id=key_id,
            )
        keep.extend(self._waiting)
        self._waiting = keep
        calls = self.table.admit_calls
        admitted = self.table.admit()
        self.stats.admit_calls += self.table.admit_calls - calls
        for i, n in admitted.items():
            job = self._slots[i].job
            job.cached = n
            self.stats.prompt_tokens += len(job.context)
            self.stats.reused_tokens += n
            self.stats.session_reused_tokens += n if i in own else 0
            self.stats.prefilled_tokens += len(job.context) - n

    def _decode(self) -> None:
        busy = self._busy()
        self.table.decode()
        self.stats.decode_calls += 1
        self.stats.decode_rows += len(busy)
        self.stats.max_batch = max(self.stats.max_batch, len(busy))
        for turn in self.table.harvest(every=True):
            i = turn.slot
            slot, job = self._slots[i], self._slots[i].job
            k, over = len(turn.tokens), turn.over
            keep, reason = k, None
            if job.cancelled:
                reason = "cancelled"
            if k >= job.max_tokens and (k > job.max_tokens or not over):
                keep, reason = job.max_tokens, "length"
            if job.stops and reason is None:
                hit = _stop_at(self.decode_text, turn.tokens, job.stops)
                if hit is not None:
                    keep, reason = hit, "stop"
            if reason is None and not over:
                if job.stream and k > job.sent:
                    job.emit("tokens", (turn.tokens[job.sent :], turn.logprobs[job.sent :]))
                    job.sent = k
                continue
            if reason is None:
                last = turn.tokens[-1] if k else -1
                reason = "stop" if last in self.sampling.stop_token_ids else "length"
            ids, lps = turn.tokens[:keep], turn.logprobs[:keep]
            if keep < k or not over:
                self.table.stop(i, ids)  # the cache keeps the context and ``ids``
            slot.job, slot.used = None, time.monotonic()
            if job.session is None:  # a throw-away slot: free for anyone
                slot.owner = None
            self.stats.generated_tokens += keep
            if job.stream and keep > job.sent:
                job.emit("tokens", (ids[job.sent :], lps[job.sent :]))
                job.sent = keep
            masks = None
            if job.gstart >= 0:
                with self._grammar_lock:
                    masks = self._grammar.masks(turn.gstates[:keep])
            job.emit("done", Result(ids, lps, reason, job.cached, self.table.version, masks))
        if not self._busy():
            self._running = None


def _stop_at(decode, ids: list[int], stops: Sequence[str]) -> int | None:
    """The fewest leading ``ids`` whose text holds one of ``stops``, or None."""
    if not any(s in decode(ids) for s in stops):
        return None
    lo = 1
    while lo < len(ids) and not any(s in decode(ids[:lo]) for s in stops):
        lo += 1
    return lo


def pool_capacity(max_total_tokens: int, max_seq_len: int) -> int:
    """A slot's tokens: the episode budget rounded up to 64 (few compiled shapes), at most
    the model's ``max_seq_len`` (as ``SlotEngine.drive`` sizes its slots)."""
    return min(bucket(max_total_tokens, multiple=64), max_seq_len)
