"""One table of KV slots: the host side of continuous batching.

``SlotTable`` drives a ``jaxagent.generate.slots.SlotSampler`` pool (its ``admit`` and
``decode`` programs) for two clients: the rollout engine (``jaxagent.agents.engine``, whose
slots hold episodes) and the policy server's backend (``jaxagent.serve.backend``, whose slots
hold conversations). The table knows slots, contexts and turns; what a slot's turn is for (an
episode's action, a request's reply) is the client's.

- ``on_reply(slot, context, ...)``: the slot's next turn is ready: ``context`` is every id its
  cache must hold before the turn (a prompt; the history and an observation; a request's
  messages). Only the part after what the cache already holds is prefilled; a context that
  diverges from it sets the cache back to the common prefix first (``held``).
- ``admit()``: prefill the ready contexts (at most ``max_admit`` a data shard a call) and
  sample each one's first token, one device call per sampling stream.
- ``decode()``: at most ``decode_steps`` decode steps of every slot with a turn under way.
- ``harvest()``: the turns the device ended (their tokens, log-probs and automaton states),
  or every turn under way so far (``every``: for streaming and stop strings); ``stop`` ends
  a turn early and keeps only some of its tokens.
- ``switch_weights(params, version)``: new weights, put in place once the turns under way
  have ended (no turn is admitted meanwhile); every cache the old weights wrote is dropped,
  so each slot's next turn prefills its whole context again (AReaL's interruptible
  generation recomputes the cache the same way; Fu et al. 2025).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.generate.slots import SlotSampler


@dataclasses.dataclass
class TurnRead:
    """A slot's turn as ``SlotTable.harvest`` reads it."""

    slot: int
    tokens: list[int]
    logprobs: list[float]
    # the automaton state each token was drawn in (``jaxagent.generate.grammar``); None for
    # an unconstrained turn
    gstates: Optional[list[int]]
    over: bool  # the device ended the turn (a stop id or ``max_new_tokens``)


@dataclasses.dataclass
class _Ready:
    context: list[int]
    row: int
    turn: int
    gstart: int
    key: Any
    key_id: Any


class SlotTable:
    """The slots of one ``SlotSampler`` pool (module docstring).

    Args:
      program: the device programs (``SlotSampler``); ``use`` swaps them between turns.
      params: the weights the slots sample with.
      version: their policy version (``switch_weights`` moves it on).
      key: the sampling key of contexts that name none (``on_reply``).
      grammar: the automata on the device (``GrammarTable.device_table``), asked for when a
        constrained turn is admitted or decoded; None: no turn is constrained.
      max_admit: contexts prefilled per data shard a call at most (0: all that are ready).
    """

    def __init__(
        self,
        program: SlotSampler,
        params: Any,
        *,
        version: int = 0,
        key: Optional[jax.Array] = None,
        grammar: Optional[Callable[[], jax.Array]] = None,
        max_admit: int = 0,
    ):
        self.program, self.params, self.version = program, params, version
        self.key, self._grammar, self.max_admit = key, grammar, max_admit
        self.state = program.init(params)
        self.fused = program.prepare(params)
        n = program.slots
        self.per_shard = n // program.shards(params)
        self.held: list[list[int]] = [[] for _ in range(n)]  # the ids each slot's cache holds
        self._ready: dict[int, _Ready] = {}
        self._turns: dict[int, _Ready] = {}  # slots with a turn on the device
        self._ended: dict[int, _Ready] = {}  # slots whose turn the last harvest ended
        self._lengths = np.zeros(n, np.int32)  # cache lengths at the last harvest
        self._cuts: dict[int, int] = {}  # slot -> length its cache is set back to
        self._newer: Optional[tuple[Any, int, Optional[Callable[[], None]]]] = None
        self._cut = jax.jit(_cut_rows, donate_argnums=0)
        self.admit_calls = 0  # device admit calls so far

    # ---- what the clients read -------------------------------------------------------------
    @property
    def num_slots(self) -> int:
        return len(self.held)

    @property
    def ready(self) -> list[int]:
        """Slots whose context waits to be admitted."""
        return sorted(self._ready)

    @property
    def decoding(self) -> list[int]:
        """Slots with a turn on the device."""
        return sorted(self._turns)

    @property
    def switching(self) -> bool:
        """New weights wait for the turns under way to end."""
        return self._newer is not None

    def use(self, program: SlotSampler) -> None:
        """Sample with ``program`` (other settings, same pool shape) from the next admit on;
        only between turns: one decode call steps every slot under one setting."""
        if self._turns and program is not self.program:
            raise RuntimeError("SlotTable.use: turns are under way with the current program")
        self.program = program

    # ---- the five operations ---------------------------------------------------------------
    def on_reply(
        self,
        slot: int,
        context: Sequence[int],
        *,
        row: int,
        turn: int,
        gstart: int = -1,
        key: Optional[jax.Array] = None,
        key_id: Any = None,
    ) -> None:
        """Slot ``slot``'s next turn, ``turn`` of sampling row ``row``, starts after
        ``context`` (the whole context, at least one id: the last one's logits start the
        turn); it draws from ``row_uniforms(key, N, row, turn)`` (``key``: the table's when
        None; ``key_id`` names it, for grouping admits). ``gstart``: the turn's automaton
        start state (-1: free)."""
        if slot in self._turns:
            raise RuntimeError(f"SlotTable.on_reply: slot {slot} has a turn under way")
        if not context:
            raise ValueError(f"SlotTable.on_reply: slot {slot} got an empty context")
        self._ready[slot] = _Ready(list(context), row, turn, gstart, key, key_id)

    def admit(self) -> dict[int, int]:
        """Prefill the ready contexts and start their turns; returns, per admitted slot, how
        many context ids its cache already held (not prefilled again). Nothing is admitted
        while new weights wait for the device to drain."""
        self._switch_if_drained()
        if self._newer is not None or not self._ready:
            return {}
        slots = first_per_shard(sorted(self._ready), self.max_admit, self.per_shard)
        cached: dict[int, int] = {}
        groups: dict[Any, list[int]] = collections.defaultdict(list)
        for s in slots:
            r = self._turns[s] = self._ready.pop(s)
            self._ended.pop(s, None)
            # At least the last context id is fed: its logits start the turn.
            n = min(common_prefix(self.held[s], r.context), len(r.context) - 1)
            if n < len(self.held[s]):
                self._cuts[s] = n
            self.held[s] = r.context[:n]
            cached[s] = n
            groups[None if r.key is None else ("key", r.key_id)].append(s)
        self._flush_cuts()
        for members in groups.values():
            turns = [self._turns[s] for s in members]
            key = self.key if turns[0].key is None else turns[0].key
            table = self._table(turns)
            self.state = self.program.admit(
                self.params,
                self.fused,
                self.state,
                members,
                [t.context[cached[s] :] for s, t in zip(members, turns)],
                [cached[s] == 0 for s in members],
                key,
                [t.row for t in turns],
                [t.turn for t in turns],
                None if table is None else (table, [t.gstart for t in turns]),
            )
            self.admit_calls += 1
        return cached

    def decode(self) -> None:
        """At most ``decode_steps`` decode steps of every slot with a turn under way."""
        self._flush_cuts()
        if not self._turns:
            return
        turns = self._turns.values()
        # Every slot with a turn on the device ends it within max_new_tokens more tokens.
        longest = max(len(t.context) for t in turns) + self.program.sampling.max_new_tokens
        self.state = self.program.decode(
            self.params,
            self.fused,
            self.state,
            longest,
            active=self.decoding,
            table=self._table(turns),
        )

    def harvest(self, every: bool = False) -> list[TurnRead]:
        """The turns the device ended (they leave the device; the slot's cache holds their
        tokens), or with ``every`` every turn under way (the unfinished ones read so far and
        stay), in slot order."""
        if not self._turns:
            return []
        s = self.state
        pending, finished, num, self._lengths = jax.device_get(
            (s.pending, s.finished, s.num_generated, s.cache.lengths)
        )
        over = {i for i in self._turns if finished[i] and not pending[i]}
        read = self.decoding if every else sorted(over)
        if not read:
            return []
        constrained = any(self._turns[i].gstart >= 0 for i in read)
        tokens, logprobs, gstates = jax.device_get(
            (s.tokens, s.logprobs, s.gstates if constrained else None)
        )
        out = []
        for i in read:
            k, r = int(num[i]), self._turns[i]
            toks = [int(t) for t in tokens[i, :k]]
            gs = None if r.gstart < 0 else gstates[i, :k].tolist()
            out.append(TurnRead(i, toks, [float(x) for x in logprobs[i, :k]], gs, i in over))
            if i in over:
                self._ended[i] = self._turns.pop(i)
                self.held[i] = (r.context + toks)[: min(int(self._lengths[i]), len(r.context) + k)]
        return out

    def stop(self, slot: int, tokens: Sequence[int]) -> None:
        """End ``slot``'s turn (read by the last ``harvest``) after ``tokens``, the first of
        its tokens: its cache is set back to the context and those."""
        under_way = slot in self._turns
        r = self._turns.pop(slot) if under_way else self._ended[slot]
        length = int(self._lengths[slot])
        n = min(length, len(r.context) + len(tokens))
        self.held[slot] = (r.context + list(tokens))[:n]
        if under_way or n < length:
            self._cuts[slot] = n

    def free(self, slot: int) -> None:
        """Whatever ``slot`` holds is of no further use: its next context is prefilled whole
        (a new episode: a fresh row, as the lock-step sampler starts one)."""
        self.held[slot] = []

    def switch_weights(
        self, params: Any, version: int, on_done: Optional[Callable[[], None]] = None
    ) -> None:
        """Sample with ``params`` (policy ``version``) once the turns under way have ended
        (now, or at the first ``admit`` after they have: turns ``harvest`` returns were all
        sampled by ``version`` as it was before the call); ``on_done`` is called then."""
        self._newer = (params, version, on_done)
        self._switch_if_drained()

    def close(self) -> None:
        """Free the pool's device buffers now."""
        state, self.state = self.state, None
        for x in jax.tree.leaves(state):
            if isinstance(x, jax.Array) and not x.is_deleted():
                x.delete()

    # ---- internals ---------------------------------------------------------------------------
    def _switch_if_drained(self) -> None:
        if self._newer is None or self._turns:
            return
        (self.params, self.version, on_done), self._newer = self._newer, None
        self.fused = self.program.prepare(self.params)
        # KV the old weights wrote is not the new policy's: every slot is admitted fresh.
        self.held = [[] for _ in self.held]
        if on_done is not None:
            on_done()

    def _table(self, turns) -> Optional[jax.Array]:
        """The automata on the device when one of ``turns`` is constrained, else None."""
        if self._grammar is None or not any(t.gstart >= 0 for t in turns):
            return None
        return self._grammar()

    def _flush_cuts(self) -> None:
        if not self._cuts:
            return
        n = self.num_slots
        idx = np.full(n, n, np.int32)
        lengths = np.zeros(n, np.int32)
        for j, (i, k) in enumerate(sorted(self._cuts.items())):
            idx[j], lengths[j] = i, k
        self._cuts = {}
        self.state = self._cut(self.state, jnp.asarray(idx), jnp.asarray(lengths))


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _cut_rows(state, idx, lengths):
    """Slots ``idx`` (padded with out-of-range indices) stop their turn and keep at most
    ``lengths`` tokens of their cache."""
    s = state.num_slots
    cur = state.cache.lengths[jnp.minimum(idx, s - 1)]
    cache = state.cache.replace(
        lengths=state.cache.lengths.at[idx].set(jnp.minimum(cur, lengths), mode="drop")
    )
    return state.replace(
        cache=cache,
        finished=state.finished.at[idx].set(True, mode="drop"),
        pending=state.pending.at[idx].set(False, mode="drop"),
    )


def first_per_shard(slots: list[int], cap: int, per_shard: int) -> list[int]:
    """The first ``cap`` of ``slots`` on each data shard (slot s on shard s // per_shard);
    all of them when ``cap`` is 0."""
    if not cap:
        return slots
    taken: collections.Counter = collections.Counter()
    out = []
    for s in slots:
        if taken[s // per_shard] < cap:
            taken[s // per_shard] += 1
            out.append(s)
    return out
