"""Continuous batching over KV slots: the device side of the rollout engine.

A fixed pool of S cache rows ("slots"), each holding one episode's whole context for the
episode's life. Two jitted programs act on it, and the host (``jaxagent.agents.engine``)
alternates them as work arrives:

- ``admit``: append a ragged chunk (a prompt or an environment observation) to some slots
  (only those rows are gathered, prefilled in chunks of ``SamplingConfig.prefill_chunk``
  tokens and scattered back), sample each one's first token, and start its turn;
- ``decode``: at most ``decode_steps`` decode steps for every slot whose turn is under way,
  then return, so finished turns leave the device within a bounded number of steps while
  the other rows keep their place.

A slot's turn draws from the stream of its (episode, turn) (``row_uniforms`` with turn ids),
token j from uniform j, exactly as ``jaxagent.generate.Sampler`` draws for the same row and
turn: the engine samples what the lock-step driver samples, whatever the order in which
turns reach the device. The sampling and log-prob conventions are ``Sampler``'s; after a turn
its last sampled token is in the cache too (the next chunk is only the observation).

The state counts decode row-steps and busy row-steps, so the host reports slot occupancy
(the share of decoded rows that were generating a turn).
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from jaxagent.buckets import bucket
from jaxagent.generate.sampler import (
    _DECODE_ROWS,
    _prefill,
    decode_step,
    _row_sharding,
    _shard_cache_rows,
    _take_rows,
)
from jaxagent.generate.grammar import advance, constrain_logits
from jaxagent.generate.sampling import (
    SamplingConfig,
    row_uniforms,
    sample_tokens_from_uniform,
)
from jaxagent.models.api import model_config
from jaxagent.models.cache import KVCache, init_cache


@struct.dataclass
class SlotState:
    """The slot pool on the device.

    Attributes:
      last: [S] the slot's last sampled token (``pending``: not yet in the cache).
      pending: [S] bool: ``last`` still has to be written to the cache.
      finished: [S] bool: the slot samples no more tokens this turn (idle slots too).
      num_generated: [S] int32 tokens of the current turn so far.
      tokens: [S, N] the current turn's tokens (pad after ``num_generated``).
      logprobs: [S, N] their log-probs.
      uniforms: [S, N] the current turn's draws (zeros when greedy).
      cache: the KV cache, one row a slot.
      steps: scalar int32: decode steps run so far.
      row_steps: scalar int32: rows decoded, summed over steps (all slots, or the active
        slots' batch with its padding rows).
      busy_steps: scalar int32: of those, the row-steps of slots generating a turn.
      gstate: [S] int32 automaton state of the slot's next token (``jaxagent.generate.grammar``;
        -1: unconstrained).
      gstates: [S, N] int32 the state each of the turn's tokens was drawn in.
    """

    last: jax.Array
    pending: jax.Array
    finished: jax.Array
    num_generated: jax.Array
    tokens: jax.Array
    logprobs: jax.Array
    uniforms: jax.Array
    cache: KVCache
    steps: jax.Array
    row_steps: jax.Array
    busy_steps: jax.Array
    gstate: jax.Array
    gstates: jax.Array

    @property
    def num_slots(self) -> int:
        return self.last.shape[0]


class SlotSampler:
    """Jitted ``admit`` / ``decode`` over a pool of ``slots`` cache rows of ``capacity`` tokens.

    Args:
      graphdef: the model graphdef.
      sampling: static sampling settings (``max_new_tokens`` = N per turn).
      slots: S, the cache rows (episodes in flight at most).
      capacity: tokens a slot holds (an episode's whole budget).
      pad_id: token id for padding.
      decode_steps: decode steps per ``decode`` call at most.
      cache_dtype: the cache's dtype (default: the model's ``kv_cache_dtype``).
    """

    def __init__(
        self,
        graphdef: nnx.GraphDef,
        sampling: SamplingConfig,
        slots: int,
        capacity: int,
        *,
        pad_id: int = 0,
        decode_steps: int = 16,
        cache_dtype=None,
    ):
        if slots < 1 or decode_steps < 1:
            raise ValueError(
                f"SlotSampler: slots={slots}, decode_steps={decode_steps} must be >= 1"
            )
        self.graphdef, self.sampling = graphdef, sampling
        self.config = model_config(graphdef)
        if capacity > self.config.max_seq_len:
            raise ValueError(
                f"SlotSampler: capacity={capacity} exceeds ModelConfig.max_seq_len="
                f"{self.config.max_seq_len}; lower rollout.max_total_tokens"
            )
        self.slots, self.capacity, self.pad_id = slots, capacity, pad_id
        self.decode_steps = decode_steps
        self.cache_dtype = cache_dtype or self.config.jnp_kv_cache_dtype
        self.num_compiles = 0
        self.prefilled_tokens = 0
        self._init = jax.jit(self._init_state, static_argnames=("rows_sharding",))
        self._prepare = jax.jit(lambda params: nnx.merge(graphdef, params).fused_weights())
        self._admit = jax.jit(self._admit_rows, donate_argnames=("state",))
        self._decode = jax.jit(
            self._decode_steps, donate_argnames=("state",), static_argnames=("window",)
        )

    # ---- host side ---------------------------------------------------------------------
    def prepare(self, params):
        """The decode kernels (``Transformer.fused_weights``: concatenated q/k/v and gate/up),
        built once for a rollout's parameters and passed to every ``admit`` / ``decode`` call
        (built inside each call instead, they would cost a pass over the weights and a
        transient copy every few decode steps)."""
        return self._prepare(params)

    def init(self, params) -> SlotState:
        """An empty pool (every slot idle), rows split over the parameters' mesh."""
        return self._init(params, rows_sharding=_row_sharding(params, self.slots))

    def admit(
        self,
        params,
        fused,
        state: SlotState,
        slot_ids: Sequence[int],
        chunks: Sequence[Sequence[int]],
        fresh: Sequence[bool],
        key: jax.Array,
        row_ids: Sequence[int],
        turn_ids: Sequence[int],
        grammar: tuple[jax.Array, Sequence[int]] | None = None,
    ) -> SlotState:
        """Append ``chunks[i]`` to slot ``slot_ids[i]`` (emptied first when ``fresh[i]``: a new
        episode takes the slot) and start the slot's turn ``turn_ids[i]`` of episode
        ``row_ids[i]``. ``fused``: ``prepare(params)``. The state is donated. ``grammar``:
        ``(table, starts)``, slot ``slot_ids[i]``'s turn constrained from automaton state
        ``starts[i]`` (-1: free) of ``table`` (``GrammarTable.device_table()``); pass the same
        table to ``decode``."""
        p = len(slot_ids)
        if not p or any(len(c) == 0 for c in chunks):
            raise ValueError("admit: pass at least one slot, each with a non-empty chunk")
        # Prefix sharing: fresh slots with the same chunk (the K samples of a task start from
        # one prompt) are prefilled once and the cache row copied to each of them.
        unique: dict = {}
        expand = np.zeros(p, np.int32)
        for i, c in enumerate(chunks):
            key_i = (True, tuple(c)) if fresh[i] else (False, i)
            expand[i] = unique.setdefault(key_i, len(unique))
        firsts = [int(np.argmax(expand == u)) for u in range(len(unique))]
        # Rows and width bucketed (powers of 8 rows, powers of 2 tokens from 16): few
        # compiled programs, whatever order the environments answer in.
        rows, pre = self._rows(p), self._rows(len(unique))
        t = bucket(max(len(c) for c in chunks), pow2=True, minimum=16)
        chunk = self.sampling.prefill_chunk
        if chunk and t > chunk:
            t = bucket(t, multiple=chunk)
        tokens = np.full((pre, t), self.pad_id, np.int32)
        segs = np.zeros((pre, t), np.int32)
        src = np.zeros(pre, np.int32)  # the slot each prefill row continues
        new = np.zeros(pre, bool)
        for u, i in enumerate(firsts):
            tokens[u, : len(chunks[i])] = chunks[i]
            segs[u, : len(chunks[i])] = 1
            src[u], new[u] = slot_ids[i], fresh[i]
        idx = np.full(rows, self.slots, np.int32)  # out of range: padding rows write nothing
        take = np.zeros(rows, np.int32)
        rid = np.zeros(rows, np.int32)
        tid = np.zeros(rows, np.int32)
        idx[:p], take[:p], rid[:p], tid[:p] = slot_ids, expand, row_ids, turn_ids
        table, gst = None, None
        if grammar is not None:
            table, gst = grammar[0], np.full(rows, -1, np.int32)
            gst[:p] = grammar[1]
        self.prefilled_tokens += int(segs.sum())
        return self._admit(
            params, fused, state, src, tokens, segs, new, idx, take, key, rid, tid, table, gst
        )

    def _rows(self, p: int) -> int:
        rows = 1
        while rows < p:
            rows *= 8
        return max(min(rows, self.slots), p)

    def decode(
        self,
        params,
        fused,
        state: SlotState,
        longest: int | None = None,
        active: Sequence[int] | None = None,
        table: jax.Array | None = None,
    ) -> SlotState:
        """At most ``decode_steps`` decode steps of every slot with a turn under way (donated).

        ``longest``: a bound on every slot's length at the end of its turn (the host knows
        it: tokens so far + ``max_new_tokens``). Attention then reads only that many slots,
        rounded up to a power of two (at least 64: few compiled programs), instead of the
        whole capacity: length-aware decode.

        ``active``: the slots with a turn under way. Only they are decoded: their rows are
        gathered into a batch of a power of 4 rows (at least 4), decoded and put back, so
        idle slots (turns over, episodes waiting for their environment) cost nothing but
        the copy; None decodes every slot, and so does a pool whose rows are split over
        devices (each device decodes its own slots).

        ``table``: the automaton table the constrained slots' ``admit`` used (None: none is)."""
        window = None
        if longest is not None:
            window = bucket(longest, pow2=True, minimum=64)
            window = None if window >= self.capacity else window
        rows = self.slots
        # Rows split over devices stay where they are: gathering the active ones would move
        # their caches between devices every call.
        split = _row_sharding(params, self.slots) is not None
        if active is not None and not split:
            rows = 4
            while rows < len(active):
                rows *= 4
        if rows >= self.slots:
            return self._decode(params, fused, state, None, table, window=window)
        idx = np.full(rows, self.slots, np.int32)
        idx[: len(active)] = sorted(active)
        return self._decode(params, fused, state, idx, table, window=window)

    # ---- device side -------------------------------------------------------------------
    def _init_state(self, params, *, rows_sharding):
        del params
        s, n = self.slots, self.sampling.max_new_tokens
        cache = init_cache(self.config, s, self.capacity, self.cache_dtype)
        if rows_sharding is not None:
            cache = _shard_cache_rows(cache, rows_sharding)
        zeros = jnp.zeros((), jnp.int32)
        return SlotState(
            last=jnp.zeros((s,), jnp.int32),
            pending=jnp.zeros((s,), bool),
            finished=jnp.ones((s,), bool),
            num_generated=jnp.zeros((s,), jnp.int32),
            tokens=jnp.full((s, n), self.pad_id, jnp.int32),
            logprobs=jnp.zeros((s, n), jnp.float32),
            uniforms=jnp.zeros((s, n), jnp.float32),
            cache=cache,
            steps=zeros,
            row_steps=zeros,
            busy_steps=zeros,
            gstate=jnp.full((s,), -1, jnp.int32),
            gstates=jnp.full((s, n), -1, jnp.int32),
        )

    def _admit_rows(
        self,
        params,
        fused,
        state,
        src,
        tokens,
        segs,
        fresh,
        idx,
        take,
        key,
        row_ids,
        turn_ids,
        table=None,
        gstart=None,
    ):
        self.num_compiles += 1
        sampling, n = self.sampling, self.sampling.max_new_tokens
        model = nnx.merge(self.graphdef, params)
        pre, t = tokens.shape
        rows = idx.shape[0]
        width = min(t, sampling.prefill_chunk or t)
        # A long chunk (a prompt) is a wide matmul, faster with the plain kernels.
        fused = fused if pre * width <= _DECODE_ROWS else None
        sub = _take_rows(state.cache, src)
        sub = sub.replace(lengths=jnp.where(fresh, 0, sub.lengths))
        h, sub = _prefill(model, tokens, segs, sub, fused, sampling.prefill_chunk)
        logits = model.logits(h, fused)[take]  # prefill row -> the slots that share it
        sub = _take_rows(sub, take)
        if sampling.greedy:
            us = jnp.zeros((rows, n), jnp.float32)
        else:
            us = row_uniforms(key, n, row_ids, turn_ids).T  # [rows, N]
        gstate = jnp.full((rows,), -1, jnp.int32) if gstart is None else gstart
        if table is not None:
            logits = constrain_logits(logits, table, gstate)
        tok, lp = sample_tokens_from_uniform(
            None if sampling.greedy else us[:, 0], logits, sampling
        )
        stop = jnp.asarray(sampling.stop_token_ids or (-1,), jnp.int32)

        def put(big, small):
            return big.at[idx].set(small, mode="drop")

        return state.replace(
            last=put(state.last, tok),
            pending=put(state.pending, jnp.ones((rows,), bool)),
            finished=put(state.finished, jnp.isin(tok, stop) | (n == 1)),
            num_generated=put(state.num_generated, jnp.ones((rows,), jnp.int32)),
            tokens=put(state.tokens, jnp.full((rows, n), self.pad_id, jnp.int32).at[:, 0].set(tok)),
            logprobs=put(state.logprobs, jnp.zeros((rows, n), jnp.float32).at[:, 0].set(lp)),
            uniforms=put(state.uniforms, us),
            cache=_put_rows(state.cache, idx, sub),
            gstate=put(state.gstate, gstate if table is None else advance(table, gstate, tok)),
            gstates=put(state.gstates, jnp.full((rows, n), -1, jnp.int32).at[:, 0].set(gstate)),
        )

    def _decode_steps(self, params, fused, state, active, table=None, window=None):
        self.num_compiles += 1
        if active is None:
            return self._decode_rows(params, fused, state, window, table)
        # The active slots as a batch of their own (padding rows, index S, idle and dropped).
        valid = active < self.slots
        take = jnp.minimum(active, self.slots - 1)
        sub = state.replace(
            last=state.last[take],
            pending=state.pending[take] & valid,
            finished=state.finished[take] | ~valid,
            num_generated=state.num_generated[take],
            tokens=state.tokens[take],
            logprobs=state.logprobs[take],
            uniforms=state.uniforms[take],
            cache=_take_rows(state.cache, take),
            gstate=state.gstate[take],
            gstates=state.gstates[take],
        )
        sub = self._decode_rows(params, fused, sub, window, table)

        def put(big, small):
            return big.at[active].set(small, mode="drop")

        return state.replace(
            last=put(state.last, sub.last),
            pending=put(state.pending, sub.pending),
            finished=put(state.finished, sub.finished),
            num_generated=put(state.num_generated, sub.num_generated),
            tokens=put(state.tokens, sub.tokens),
            logprobs=put(state.logprobs, sub.logprobs),
            cache=_put_rows(state.cache, active, sub.cache),
            gstate=put(state.gstate, sub.gstate),
            gstates=put(state.gstates, sub.gstates),
            steps=sub.steps,
            row_steps=sub.row_steps,
            busy_steps=sub.busy_steps,
        )

    def _decode_rows(self, params, fused, state, window, table=None):
        sampling, n = self.sampling, self.sampling.max_new_tokens
        model = nnx.merge(self.graphdef, params)
        stop = jnp.asarray(sampling.stop_token_ids or (-1,), jnp.int32)
        rows = jnp.arange(state.num_slots)

        def body(carry):
            i, s = carry
            u = None if sampling.greedy else s.uniforms[rows, jnp.minimum(s.num_generated, n - 1)]
            return i + 1, s.replace(
                **decode_step(model, fused, sampling, stop, s, u, window, table),
                steps=s.steps + 1,
                row_steps=s.row_steps + s.num_slots,
                busy_steps=s.busy_steps + jnp.sum(s.pending, dtype=jnp.int32),
            )

        def cond(carry):
            i, s = carry
            return (i < self.decode_steps) & jnp.any(s.pending)

        _, state = jax.lax.while_loop(cond, body, (jnp.zeros((), jnp.int32), state))
        return state


def _put_rows(cache: KVCache, index: jax.Array, rows: KVCache) -> KVCache:
    """``cache`` with row ``index[i]`` replaced by row i of ``rows`` (out-of-range indices are
    dropped); the inverse of ``sampler._take_rows``."""
    if cache.stacked:
        put = lambda big, small: big.at[:, index].set(small, mode="drop")
    else:
        put = lambda big, small: big.at[index].set(small, mode="drop")
    return KVCache(
        keys=jax.tree.map(put, cache.keys, rows.keys),
        values=jax.tree.map(put, cache.values, rows.values),
        lengths=cache.lengths.at[index].set(rows.lengths, mode="drop"),
    )
