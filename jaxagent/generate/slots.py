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
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxagent.buckets import bucket
from jaxagent.generate.sampler import (
    _DECODE_ROWS,
    _prefill,
    attention_sharding,
    decode_step,
    _row_sharding,
    _shard_cache_rows,
)
from jaxagent.generate.grammar import advance, constrain_logits
from jaxagent.generate.sampling import (
    SamplingConfig,
    row_uniforms,
    sample_tokens_from_uniform,
)
from jaxagent.models.api import model_config
from jaxagent.models.blockwise import row_shards
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
        self._admit = jax.jit(
            self._admit_rows, donate_argnames=("state",), static_argnames=("attention_sharding",)
        )
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
        # Each admitted slot is prefilled on the data shard that holds its cache row (the
        # pool's rows are split evenly, in order, over the batch axes: ``init``): the inputs
        # are laid out [shards, rows a shard, ...] and split the same way, so a chip gathers,
        # prefills and scatters only its own slots, and an admit of P rows costs each chip
        # P / shards rows of prefill instead of P.
        rows_sh = _row_sharding(params, self.slots)
        d = _shards(rows_sh)
        per = self.slots // d
        groups: list[list[int]] = [[] for _ in range(d)]
        for i, s in enumerate(slot_ids):
            groups[s // per].append(i)
        # Prefix sharing: fresh slots of one shard with the same chunk (the K samples of a
        # task start from one prompt) are prefilled once and the cache row copied to each.
        expand = np.zeros(p, np.int32)
        firsts: list[list[int]] = []
        for g in groups:
            unique: dict = {}
            heads: list[int] = []  # the first slot of each distinct chunk
            for i in g:
                key_i = (True, tuple(chunks[i])) if fresh[i] else (False, i)
                expand[i] = unique.setdefault(key_i, len(unique))
                if expand[i] == len(heads):
                    heads.append(i)
            firsts.append(heads)
        # Rows and width bucketed (powers of 8 rows, powers of 2 tokens from 16): few
        # compiled programs, whatever order the environments answer in.
        rows = self._rows(max(map(len, groups)), per)
        pre = self._rows(max(map(len, firsts)), per)
        t = bucket(max(len(c) for c in chunks), pow2=True, minimum=16)
        chunk = self.sampling.prefill_chunk
        if chunk and t > chunk:
            t = bucket(t, multiple=chunk)
        tokens = np.full((d, pre, t), self.pad_id, np.int32)
        segs = np.zeros((d, pre, t), np.int32)
        src = np.zeros((d, pre), np.int32)  # the shard's slot each prefill row continues
        new = np.zeros((d, pre), bool)
        idx = np.full((d, rows), per, np.int32)  # out of range: padding rows write nothing
        take = np.zeros((d, rows), np.int32)  # the shard's prefill row of each admitted slot
        rid = np.zeros((d, rows), np.int32)
        tid = np.zeros((d, rows), np.int32)
        gst = None if grammar is None else np.full((d, rows), -1, np.int32)
        for g, (members, heads) in enumerate(zip(groups, firsts)):
            for u, i in enumerate(heads):
                tokens[g, u, : len(chunks[i])] = chunks[i]
                segs[g, u, : len(chunks[i])] = 1
                src[g, u], new[g, u] = slot_ids[i] - g * per, fresh[i]
            for j, i in enumerate(members):
                idx[g, j], take[g, j] = slot_ids[i] - g * per, expand[i]
                rid[g, j], tid[g, j] = row_ids[i], turn_ids[i]
                if gst is not None:
                    gst[g, j] = grammar[1][i]
        self.prefilled_tokens += int(segs.sum())
        inputs = (src, tokens, segs, new, idx, take)
        if d > 1:
            inputs, (rid, tid, gst) = jax.device_put(
                (inputs, (rid, tid, gst)), NamedSharding(rows_sh.mesh, P(rows_sh.spec[0]))
            )
        table = None if grammar is None else grammar[0]
        return self._admit(
            params, fused, state, *inputs, key, rid, tid, table, gst, **self.admit_static(params)
        )

    def admit_static(self, params) -> dict:
        """The static keyword arguments of the jitted admit program for ``params``' mesh:
        ``attention_sharding``, the prefill rows' sharding a fused attention kernel (cuDNN's,
        ``model.attention: cudnn|auto`` on a GPU) runs per device on (``Transformer.hidden``).
        What an ahead-of-time ``_admit.lower`` passes too."""
        return {"attention_sharding": attention_sharding(params, _row_sharding(params, self.slots))}

    def shards(self, params) -> int:
        """How many data shards the pool's rows are split over with ``params``' mesh (1:
        unsplit); slot s lives on shard ``s // (slots // shards)``."""
        return _shards(_row_sharding(params, self.slots))

    @staticmethod
    def _rows(p: int, limit: int) -> int:
        rows = 1
        while rows < p:
            rows *= 8
        return max(min(rows, limit), p)

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
        *,
        attention_sharding=None,
    ):
        self.num_compiles += 1
        sampling, n = self.sampling, self.sampling.max_new_tokens
        model = nnx.merge(self.graphdef, params)
        d, pre, t = tokens.shape
        rows = d * idx.shape[1]
        width = min(t, sampling.prefill_chunk or t)
        # A long chunk (a prompt) is a wide matmul, faster with the plain kernels.
        fused = fused if pre * width <= _DECODE_ROWS else None
        flat = lambda x: x.reshape(-1, *x.shape[2:])  # [shards, r, ...] -> [shards * r, ...]
        sub = _take_slots(state.cache, src)
        sub = sub.replace(lengths=jnp.where(flat(fresh), 0, sub.lengths))
        h, sub = _prefill(
            model, flat(tokens), flat(segs), sub, fused, sampling.prefill_chunk, attention_sharding
        )
        # prefill row -> the slots of its shard that share it
        logits = _grouped_take(model.logits(h, fused), take, 0)
        sub = _take_slots(sub, take)
        row_ids, turn_ids = flat(row_ids), flat(turn_ids)
        if sampling.greedy:
            us = jnp.zeros((rows, n), jnp.float32)
        else:
            us = row_uniforms(key, n, row_ids, turn_ids).T  # [rows, N]
        gstate = jnp.full((rows,), -1, jnp.int32) if gstart is None else flat(gstart)
        if table is not None:
            logits = constrain_logits(logits, table, gstate)
        tok, lp = sample_tokens_from_uniform(
            None if sampling.greedy else us[:, 0], logits, sampling
        )
        stop = jnp.asarray(sampling.stop_token_ids or (-1,), jnp.int32)

        def put(big, small):
            return _grouped_put(big, idx, small, 0)

        return state.replace(
            last=put(state.last, tok),
            pending=put(state.pending, jnp.ones((rows,), bool)),
            finished=put(state.finished, jnp.isin(tok, stop) | (n == 1)),
            num_generated=put(state.num_generated, jnp.ones((rows,), jnp.int32)),
            tokens=put(state.tokens, jnp.full((rows, n), self.pad_id, jnp.int32).at[:, 0].set(tok)),
            logprobs=put(state.logprobs, jnp.zeros((rows, n), jnp.float32).at[:, 0].set(lp)),
            uniforms=put(state.uniforms, us),
            cache=_put_slots(state.cache, idx, sub),
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
            cache=_take_slots(state.cache, take[None]),
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
            cache=_put_slots(state.cache, active[None], sub.cache),
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


def _shards(rows: NamedSharding | None) -> int:
    """How many groups the pool's rows are split into (``sampler._row_sharding``), 1 when
    unsplit."""
    return 1 if rows is None else row_shards(rows)


def _grouped(x: jax.Array, groups: int, axis: int) -> jax.Array:
    return x.reshape(*x.shape[:axis], groups, x.shape[axis] // groups, *x.shape[axis + 1 :])


def _grouped_take(x: jax.Array, index: jax.Array, axis: int) -> jax.Array:
    """Dimension ``axis`` of ``x`` (G groups of M rows, in order) indexed per group:
    ``index`` [G, K] holds rows of its own group (0..M-1); the result has G * K rows there.
    The gather is batched over the groups, so a group split over devices stays on them."""
    g = index.shape[0]
    out = jax.vmap(lambda xg, i: jnp.take(xg, i, axis=axis), in_axes=(axis, 0), out_axes=axis)(
        _grouped(x, g, axis), index
    )
    return out.reshape(*x.shape[:axis], -1, *x.shape[axis + 1 :])


def _grouped_put(x: jax.Array, index: jax.Array, rows: jax.Array, axis: int) -> jax.Array:
    """``x`` with row ``index[g, k]`` of group g (dimension ``axis``: G groups of M rows)
    replaced by row ``g * K + k`` of ``rows``; indices out of 0..M-1 write nothing. The
    inverse of ``_grouped_take``."""
    g = index.shape[0]
    at = (slice(None),) * axis

    def put(xg, i, r):
        return xg.at[(*at, i)].set(r, mode="drop")

    out = jax.vmap(put, in_axes=(axis, 0, axis), out_axes=axis)(
        _grouped(x, g, axis), index, _grouped(rows, g, axis)
    )
    return out.reshape(x.shape)


def _take_slots(cache: KVCache, index: jax.Array) -> KVCache:
    """``_grouped_take`` of every cache buffer's rows (dimension 0, or 1 after the layer axis
    of a stacked cache)."""
    axis = 1 if cache.stacked else 0
    return KVCache(
        keys=jax.tree.map(lambda k: _grouped_take(k, index, axis), cache.keys),
        values=jax.tree.map(lambda v: _grouped_take(v, index, axis), cache.values),
        lengths=_grouped_take(cache.lengths, index, 0),
    )


def _put_slots(cache: KVCache, index: jax.Array, rows: KVCache) -> KVCache:
    """``_grouped_put`` of every cache buffer's rows; the inverse of ``_take_slots``."""
    axis = 1 if cache.stacked else 0
    return KVCache(
        keys=jax.tree.map(lambda k, r: _grouped_put(k, index, r, axis), cache.keys, rows.keys),
        values=jax.tree.map(
            lambda v, r: _grouped_put(v, index, r, axis), cache.values, rows.values
        ),
        lengths=_grouped_put(cache.lengths, index, rows.lengths, 0),
    )
