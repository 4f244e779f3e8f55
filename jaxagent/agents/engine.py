"""The continuous-batching rollout engine: episodes flow through a fixed pool of KV slots.

``collect_episodes`` with a ``SlotEngine`` runs this loop instead of lock-step rounds:

- episodes wait in a queue and are admitted into free slots (admission control: at most
  ``slots`` episodes in flight, each holding its slot, and so its cache row, for its life);
  their environments are reset at once;
- whatever the environments have answered is prefilled into its slots (the prompt, or the
  observation chunk on top of the cached history) with no barrier between episodes: a slow
  tool call holds back only its own episode;
- the device runs at most ``decode_steps`` decode steps of every slot with a turn under way
  and returns; rows whose turn ended leave the batch, their actions go to the environments
  at once (``submit_step``), the other rows keep decoding on the next call;
- the host blocks on the environments only when the device has nothing to do.

The slots themselves (admission, prefix bookkeeping, bounded decode, harvest, the weight
switch) are ``jaxagent.agents.slots.SlotTable``'s, shared with the policy server's backend;
this module keeps the episodes' side.

Episode records are built by the lock-step driver's own functions (``open_episode``,
``record_turn``, ``close_turn``): token-in/token-out ids, masks, log-probs, budgets and
termination labels are the same. Each turn draws from the random stream of its (episode,
turn) (``jaxagent.generate.slots``), so with the same key the engine samples exactly what the
lock-step driver samples, whatever order the environments answer in.

Runners stream (``EnvRunner.submit_reset`` / ``submit_step`` / ``poll``): the pool's
(``PoolRunner``) overlaps environment work with decoding; a ``BlockingRunner``
(``InlineRunner``: instantaneous worlds) answers at submission.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import time
from typing import Any, Callable, Optional, Sequence

import jax

from jaxagent.agents.cached import CachedTurnSampler
from jaxagent.agents.episode import Episode
from jaxagent.agents.rollout import (
    Refresh,
    RolloutSpec,
    RolloutStats,
    close_turn,
    new_episodes,
    open_episode,
    record_turn,
)
from jaxagent.agents.runner import EnvRunner
from jaxagent.agents.slots import SlotTable, TurnRead
from jaxagent.buckets import bucket
from jaxagent.envs.base import Task
from jaxagent.errors import ConfigError
from jaxagent.generate import SamplingConfig
from jaxagent.generate.slots import SlotSampler

ENGINES = ("auto", "lockstep", "slots")


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Which episode loop samples the policy.

    ``engine``: the ``Driver`` of the rollout's episodes: "slots", continuous batching over
    KV slots (``SlotEngine``), or "lockstep", rounds in which every waiting episode is
    served by one batched call and every environment steps before the next
    (``jaxagent.agents.rollout.LockStep``). Both sample the
    same tokens for the same key. "auto": slots when the environments run in a pool that
    answers asynchronously (the engine decodes while they work), lock-step when they are
    called inline (nothing to overlap; on this project's 2-core CPU the lock-step driver's
    fewer, larger calls are faster there: ``benchmarks/rollout_engine.py``).
    """

    engine: str = "auto"
    slots: int = 0  # episodes in flight (KV cache rows); 0 = every episode of a rollout
    decode_steps: int = 16  # decode steps per device call (how long a finished turn waits)
    # Slots prefilled per data shard a device call at most (0: every slot whose chunk is
    # ready); the rest wait for the next call. A chip prefills its own shard's slots only
    # (SlotSampler.admit), so this bounds each chip's prefill temporaries
    # (benchmarks/pod_plan.py --phase rollout --admit-rows).
    max_admit: int = 0
    # Decode every turn constrained to a schema-valid call of the task's tools (in the chat's
    # call syntax) or an answer (``jaxagent.agents.constrained``); the learner takes its
    # log-probs under the same masks.
    constrained_tool_calls: bool = False

    def __post_init__(self):
        if self.engine not in ENGINES:
            raise ConfigError(f"EngineConfig.engine={self.engine!r} must be one of {list(ENGINES)}")
        if not isinstance(self.slots, int) or self.slots < 0:
            raise ConfigError(
                f"EngineConfig.slots={self.slots!r} must be an int >= 0 (0 = one per episode)"
            )
        if not isinstance(self.decode_steps, int) or self.decode_steps < 1:
            raise ConfigError(f"EngineConfig.decode_steps={self.decode_steps!r} must be >= 1")
        if not isinstance(self.max_admit, int) or self.max_admit < 0:
            raise ConfigError(
                f"EngineConfig.max_admit={self.max_admit!r} must be an int >= 0 (0 = no cap)"
            )

    def resolved(self, streamed: bool) -> str:
        """ "slots" or "lockstep": ``engine`` with "auto" decided by whether the environments
        answer asynchronously (``streamed``)."""
        if self.engine != "auto":
            return self.engine
        return "slots" if streamed else "lockstep"


class SlotEngine(CachedTurnSampler):
    """The LM policy with a continuous-batching episode loop (see the module docstring): its
    own ``Driver`` (``TurnPolicy.driver``), so ``collect_episodes`` runs its episodes
    through ``drive``. Wrapped by a training-free method (which needs ``start`` /
    ``resume``) it samples as the cached lock-step sampler it extends.

    Args:
      graphdef: the model graphdef.
      sampling: static sampling settings.
      max_len: the longest row (an episode's whole context).
      pad_id: token id for padding.
      slots: episodes in flight at most (KV cache rows); 0: one per episode of the call.
      decode_steps: decode steps per device call at most (how long a finished turn can wait
        for the host).
      max_admit: slots prefilled per data shard a device call at most (0: all that are ready).
    """

    def __init__(
        self,
        graphdef,
        sampling: SamplingConfig,
        max_len: int,
        pad_id: int = 0,
        *,
        slots: int = 0,
        decode_steps: int = 16,
        max_admit: int = 0,
    ):
        super().__init__(graphdef, sampling, max_len, pad_id=pad_id)
        self.max_admit = max_admit
        if slots < 0 or decode_steps < 1:
            raise ValueError(
                f"SlotEngine: slots={slots} must be >= 0 (0 = one per episode) and "
                f"decode_steps={decode_steps} >= 1"
            )
        self.slots, self.decode_steps, self.pad_id = slots, decode_steps, pad_id
        self._devices: dict[tuple[int, int], SlotSampler] = {}
        self._state: Optional[SlotTable] = None  # the running rollout's slots

    @property
    def driver(self) -> "SlotEngine":
        return self

    @property
    def recompiles(self) -> int:
        return super().recompiles + sum(d.num_compiles for d in self._devices.values())

    @property
    def prefilled_tokens(self) -> int:
        own = sum(d.prefilled_tokens for d in self._devices.values())
        return self._sampler.prefilled_tokens + own

    def release(self) -> None:
        super().release()
        table, self._state = self._state, None
        if table is not None:
            table.close()

    def device(self, slots: int, capacity: int) -> SlotSampler:
        """The slot sampler of ``slots`` rows of ``capacity`` tokens (kept: its programs are
        compiled once)."""
        if (slots, capacity) not in self._devices:
            self._devices[(slots, capacity)] = SlotSampler(
                self._sampler.graphdef,
                self.sampling,
                slots,
                capacity,
                pad_id=self.pad_id,
                decode_steps=self.decode_steps,
            )
        return self._devices[(slots, capacity)]

    def drive(
        self,
        params: Any,
        tasks: Sequence[Task],
        *,
        samples_per_task: int,
        spec: RolloutSpec,
        key: jax.Array,
        group_offset: int = 0,
        on_round: Optional[Callable[[int, int], None]] = None,
        version: int = 0,
        refresh: Optional[Refresh] = None,
    ) -> tuple[list[Episode], RolloutStats]:
        """Run every (task, sample) episode to completion (``collect_episodes``' contract).

        ``refresh`` (partial rollouts): asked between decode calls; once it gives newer
        ``(params, version)``, no turn is admitted until the turns on the device have ended,
        then every running episode continues on the new weights from its next turn, its whole
        context prefilled again under them (``SlotTable.switch_weights``), with its turn
        numbers, so its random streams, unchanged. A turn is sampled by one version; tokens
        keep the version that sampled them."""
        if spec.budget.max_new_tokens != self.sampling.max_new_tokens:
            raise ValueError(
                f"Budget.max_new_tokens={spec.budget.max_new_tokens} differs from the "
                f"sampler's {self.sampling.max_new_tokens}"
            )
        eps = new_episodes(tasks, samples_per_task, group_offset)
        stats = RolloutStats()
        if not eps:
            return eps, stats
        n_slots = min(self.slots or len(eps), len(eps))
        need = min(spec.budget.max_total_tokens, self.max_len)
        capacity = min(bucket(need, multiple=64), self._sampler.config.max_seq_len)
        self.release()
        grammar = self.grammar
        table = self._state = SlotTable(
            self.device(n_slots, capacity),
            params,
            version=version,
            key=key,
            grammar=None if grammar is None else grammar.table.device_table,
            max_admit=self.max_admit,
        )
        run = _Episodes(eps, spec, table, self, on_round, stats)
        t_start = time.perf_counter()
        while run.finished < len(eps):
            run.admit_episodes()
            idle = not table.ready and not table.decoding
            t0 = time.perf_counter()
            replies = run.env.poll(None if idle and run.waiting else 0.0)
            if idle:
                stats.env_s += time.perf_counter() - t0
            run.on_replies(replies)
            if refresh is not None and not table.switching:
                newer = refresh(table.version)
                if newer is not None:
                    table.switch_weights(*newer)
            if not table.ready and not table.decoding:
                continue
            t0 = time.perf_counter()
            admitted = table.admit()
            stats.device_row_s += sum(t0 - run.since[s] for s in admitted)
            table.decode()
            stats.rounds += 1
            turns = table.harvest()
            stats.generate_s += time.perf_counter() - t0
            run.on_turns(turns)
        state = table.state
        steps, row_steps, busy = jax.device_get((state.steps, state.row_steps, state.busy_steps))
        stats.decode_steps, stats.row_steps, stats.busy_steps = (
            int(steps),
            int(row_steps),
            int(busy),
        )
        # KV bytes a decoded row reads: its slot's whole capacity (an upper bound: with a
        # window narrower than the capacity, attention reads only the window).
        cache_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state.cache))
        stats.kv_bytes = float(stats.row_steps) * cache_bytes / n_slots
        stats.wall_s = time.perf_counter() - t_start
        return eps, stats


class _Episodes:
    """The episodes' side of ``SlotEngine.drive``: which episode holds which slot, the
    environment calls under way, and the records (``open_episode``, ``record_turn``,
    ``close_turn``)."""

    def __init__(self, eps, spec, table: SlotTable, engine: SlotEngine, on_round, stats):
        self.eps, self.spec, self.table, self.stats = eps, spec, table, stats
        self.env: EnvRunner = spec.runner
        self.on_round, self.row_offset = on_round, engine.row_offset
        self.stop_ids = engine.sampling.stop_token_ids
        grammar = engine.grammar
        self.masks = None if grammar is None else grammar.table.masks
        self.gstarts = [-1] * len(eps)
        if grammar is not None:
            self.gstarts = grammar.starts([ep.task for ep in eps])
        self.queue = collections.deque(range(len(eps)))
        self.free = list(range(table.num_slots))  # a heap: the lowest free slot first
        self.episode_in: dict[int, int] = {}  # slot -> episode index
        self.opened: set[int] = set()  # slots whose episode has had its reset reply
        self.turn_out: dict[int, tuple[str, int, bool]] = {}  # slot -> action, tokens, stopped
        self.waiting = 0  # environment calls outstanding
        self.finished = 0
        self.since: dict[int, float] = {}  # slot -> when its env call was sent / chunk ready

    def admit_episodes(self) -> None:
        """Queued episodes into free slots; their environments reset."""
        if not (self.queue and self.free):
            return
        admitted = []
        while self.queue and self.free:
            slot = heapq.heappop(self.free)
            self.episode_in[slot] = self.queue.popleft()
            admitted.append(slot)
        self.env.submit_reset(admitted, [self.eps[self.episode_in[s]].task for s in admitted])
        self.waiting += len(admitted)
        self.since.update((s, time.perf_counter()) for s in admitted)

    def on_replies(self, replies) -> None:
        """Record the environments' answers; an episode that goes on has its context ready."""
        now = time.perf_counter()
        for slot, reply in replies:
            self.waiting -= 1
            self.stats.env_row_s += now - self.since[slot]
            self.since[slot] = now
            e = self.episode_in[slot]
            ep = self.eps[e]
            if slot not in self.opened:
                self.opened.add(slot)
                going_on = bool(open_episode(ep, reply, self.spec))
            else:
                action, n_tok, stopped = self.turn_out.pop(slot)
                going_on = close_turn(ep, action, n_tok, stopped, reply, self.spec) is not None
            if not going_on:
                self._end(slot)
                continue
            self.table.on_reply(
                slot,
                ep.tokens,
                row=self.row_offset + e,
                turn=len(ep.turns),
                gstart=self.gstarts[e],
            )

    def on_turns(self, turns: list[TurnRead]) -> None:
        """Record the turns the device ended and send their actions to the environments."""
        for t in turns:
            ep = self.eps[self.episode_in[t.slot]]
            masks = None if t.gstates is None else self.masks(t.gstates)
            record_turn(ep, t.tokens, t.logprobs, self.table.version, masks)
            self.stats.policy_tokens += len(t.tokens)
            stopped = bool(t.tokens and t.tokens[-1] in self.stop_ids)
            action = self.spec.chat.decode(t.tokens)
            self.turn_out[t.slot] = (action, len(t.tokens), stopped)
        if turns:
            slots = [t.slot for t in turns]
            self.env.submit_step(slots, [self.turn_out[s][0] for s in slots])
            self.waiting += len(slots)
            self.since.update((s, time.perf_counter()) for s in slots)

    def _end(self, slot: int) -> None:
        self.finished += 1
        del self.episode_in[slot]
        self.opened.discard(slot)
        self.table.free(slot)
        heapq.heappush(self.free, slot)
        if self.on_round is not None:
            self.on_round(self.finished, len(self.eps))


def slot_occupancy(stats: RolloutStats) -> float:
    """The share of decoded rows that were generating a turn (1: no slot idled)."""
    return stats.busy_steps / stats.row_steps if stats.row_steps else float("nan")
