"""Batched generation under one jit: a prefill, then a ``lax.while_loop`` decode.

The prefill writes the new tokens into the cache ``SamplingConfig.prefill_chunk`` tokens at a
time (a ``lax.fori_loop`` over chunks, each attending to the cache written so far), so its
attention temporaries grow linearly with the prompt. Rows whose prompts are the same token
list can be prefilled once and their cache rows copied (``share_prompts``): the K samples of
one task then cost one prefill.

The KV cache is preallocated and donated, so the decode loop updates it in place. Under a
mesh (parameters carrying NamedShardings) the cache is split over batch rows, each device
holding its own rows' keys and values, and over KV heads along the mesh's tensor axis when
that divides them (the heads the device's attention projections compute). Rows keep
their own lengths: a call may append a ragged chunk of new tokens per row (a prompt, or an
environment observation on top of an earlier turn) and continue decoding from there, so a
multi-turn episode never re-encodes its history. After a call the cache holds every token
the row has seen, including all tokens returned by that call (the last sampled token is fed
through the model before the loop ends), so the next call passes only the new observation.

Shapes are bucketed (chunk length to a power of two, cache capacity to four sizes an octave,
see ``bucket_capacity``) so that recompiles are rare; ``Sampler.num_compiles`` counts them.
"""

from __future__ import annotations

import weakref
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxagent.buckets import bucket
from jaxagent.generate.sampling import (
    SamplingConfig,
    row_uniforms,
    sample_tokens_from_uniform,
    uniforms,
)
from jaxagent.generate.grammar import advance, constrain_logits
from jaxagent.models.cache import KVCache, grow_cache, init_cache
from jaxagent.models.api import model_config
from jaxagent.parallel.mesh import batch_mesh_axes


@struct.dataclass
class SampleOutput:
    """Result of one sampler call.

    tokens [B, N] int32 (pad_id after each row's length); logprobs [B, N] float32, the
    log-prob of each sampled token under softmax(logits / temperature) before top-k / top-p
    filtering (temperature 1 gives the teacher-forced log-prob; greedy reports temperature-1
    log-probs), 0 after the length; lengths [B] int32 tokens generated, stop token included
    (0 for rows given no new tokens); cache holding each row's full context, returned tokens
    included (pass it to the next call)."""

    tokens: jax.Array
    logprobs: jax.Array
    lengths: jax.Array
    cache: KVCache
    # [B, N] int32: the automaton state each token was drawn in (``jaxagent.generate.grammar``;
    # -1: unconstrained), or None for a call without a grammar.
    grammar_states: Optional[jax.Array] = None


@struct.dataclass
class _LoopState:
    step: jax.Array  # scalar int32
    last: jax.Array  # [B] last sampled token, not yet in the cache while pending
    pending: jax.Array  # [B] bool: ``last`` still has to be written to the cache
    finished: jax.Array  # [B] bool: the row samples no more tokens
    num_generated: jax.Array  # [B] int32
    tokens: jax.Array  # [B, N] int32
    logprobs: jax.Array  # [B, N] float32
    cache: KVCache
    gstate: jax.Array  # [B] int32 automaton state of the next token (-1: unconstrained)
    gstates: jax.Array  # [B, N] int32 the state each token was drawn in


_DECODE_ROWS = 64  # chunks of at most this many tokens (B x T) use the decode kernels
# "auto" decode layout: output-major kernels (see ``dense_t``) on the CPU backend when the
# weights cannot stay in cache between steps and a step has few rows. Measured on a 2-core
# EPYC (32 MiB L3): 768 x 12 model at batch 8, decode step 50 -> 35 ms; the tiny model
# (20 MiB, cache-resident) is ~10% slower with them, hence the size threshold.
_OUTPUT_MAJOR_MIN_BYTES = 64 * 2**20
_OUTPUT_MAJOR_MAX_ROWS = 32
DECODE_LAYOUTS = ("auto", "row_major", "output_major")


_LIVE: "weakref.WeakSet[Sampler]" = weakref.WeakSet()


def release_decode_kernels() -> int:
    """Free the output-major decode kernels every live ``Sampler`` keeps (one transposed copy
    of the weights each); returns how many were freed. A trainer calls it when a rollout is
    over and the parameters are about to change, so the copy never coexists with the
    update's gradients and optimiser state."""
    freed = 0
    for sampler in list(_LIVE):
        freed += sampler._prepared is not None
        sampler.release()
    return freed


def bucket_capacity(needed: int, block: int) -> int:
    """Round a cache size up to a multiple of max(block, largest power of two <= needed / 4).

    Four buckets an octave: at most ~25% of slots are wasted, and a growing multi-turn
    context triggers O(log length) recompiles rather than one per ``block`` tokens.
    """
    step = max(block, 1 << max(0, (needed // 4).bit_length() - 1))
    return bucket(needed, multiple=step)


class Sampler:
    """Jitted sampler for one model architecture.

    Usage::

        sampler = Sampler(graphdef)
        out = sampler(params, [[1, 5, 9], [1, 7]], SamplingConfig(max_new_tokens=32), key)
        out2 = sampler(params, [obs_a, obs_b], cfg, key2, cache=out.cache)  # next turn

    The cache passed in is donated: do not use it after the call (use the returned one).

    ``decode_layout``: how decode steps hold the kernels. "row_major" ([in, out], concatenated
    per call), "output_major" ([out, in], kept across calls while ``params`` stay the same
    arrays, see ``release``), or "auto": output-major on the CPU backend for models too big
    to stay in cache (>= 64 MiB) at batch <= 32, row-major otherwise. Results are the same
    up to float rounding.
    """

    def __init__(
        self,
        graphdef: nnx.GraphDef,
        *,
        pad_id: int = 0,
        min_chunk: int = 8,
        capacity_block: int = 64,
        cache_dtype=None,
        fuse_weights: bool = True,
        decode_layout: str = "auto",
    ):
        if decode_layout not in DECODE_LAYOUTS:
            raise ValueError(
                f"Sampler: decode_layout={decode_layout!r} must be one of {DECODE_LAYOUTS}"
            )
        self.graphdef = graphdef
        self.config = model_config(graphdef)
        self.pad_id, self.min_chunk, self.capacity_block = pad_id, min_chunk, capacity_block
        self.cache_dtype = cache_dtype or self.config.jnp_kv_cache_dtype
        self.fuse_weights, self.decode_layout = fuse_weights, decode_layout
        self.num_compiles = 0  # incremented each time the jitted function is traced
        self.prefilled_tokens = 0  # real tokens fed through prefills (host-side count)
        self._jit = jax.jit(
            self._generate,
            static_argnames=("sampling", "capacity", "rows_sharding", "attention_sharding"),
            donate_argnames=("cache",),
        )
        self._prepare = jax.jit(self._fused_weights, static_argnames=("output_major",))
        self._prepared = None  # (params leaves, decode kernels): see _decode_weights
        _LIVE.add(self)

    def output_major(self, params, batch_size: int) -> bool:
        """Whether decode steps use output-major kernels (``decode_layout``, see ``dense_t``)."""
        return self._output_major(jax.tree.leaves(params), batch_size)

    def _output_major(self, leaves, batch_size: int) -> bool:
        if self.decode_layout != "auto":
            return self.decode_layout == "output_major"
        if jax.default_backend() != "cpu" or batch_size > _OUTPUT_MAJOR_MAX_ROWS:
            return False
        return sum(x.size * x.dtype.itemsize for x in leaves) >= _OUTPUT_MAJOR_MIN_BYTES

    def _fused_weights(self, params, output_major):
        return nnx.merge(self.graphdef, params).fused_weights(output_major=output_major)

    def _decode_weights(self, params, batch_size: int):
        """The decode kernels (``Transformer.fused_weights``), built once per parameter version.

        Output-major kernels are a transposed copy of the weights: building them streams the
        whole model, so they are kept and reused while the same ``params`` arrays come back
        (every turn of a multi-turn episode, every repeat of a benchmark). This holds one
        extra copy of the kernels until params change or ``release()``. Row-major kernels
        are cheap concatenations, built inside each call instead (None here).
        """
        leaves = jax.tree.leaves(params)
        if not self.fuse_weights or not self._output_major(leaves, batch_size):
            return None
        kept = self._prepared
        if (
            kept is not None
            and len(kept[0]) == len(leaves)
            and all(a is b for a, b in zip(kept[0], leaves))
        ):
            return kept[1]
        self._prepared = None  # drop the old copy before building the new one
        fused = self._prepare(params, output_major=True)
        self._prepared = (leaves, fused)  # holding the leaves keeps their ids unique
        return fused

    def release(self) -> None:
        """Free the kept decode kernels (they are rebuilt on the next call)."""
        self._prepared = None

    # ---- host side ---------------------------------------------------------------------
    def __call__(
        self,
        params,
        new_tokens: Sequence[Sequence[int]],
        sampling: SamplingConfig,
        key: jax.Array,
        cache: Optional[KVCache] = None,
        row_ids: Optional[Sequence[int]] = None,
        share_prompts: bool = False,
        turn_ids: Optional[Sequence[int]] = None,
        grammar: Optional[tuple[jax.Array, Sequence[int]]] = None,
    ) -> SampleOutput:
        """Append ``new_tokens[b]`` to row b and sample ``sampling.max_new_tokens`` tokens.

        Args:
          params: model parameters.
          new_tokens: B lists of token ids (ragged). A row with an empty list is left alone
            this call (it generates nothing; its length in the output is 0).
          sampling: decoding settings (static).
          key: PRNG key.
          cache: cache from an earlier call (donated), or None to start fresh.
          row_ids: optional global row numbers, B ints: row b's random draws then depend only
            on (key, row_ids[b]), so rows sampled on different hosts draw what one process
            sampling every row draws (``row_uniforms``). None: one stream for the batch.
          share_prompts: with ``cache=None``, rows with identical token lists are prefilled
            once and the resulting cache rows (and next-token logits) copied to each of them;
            what is sampled is unchanged (the draws stay per row).
          turn_ids: with ``row_ids``, B ints (each row's turn number): row b's draws then
            depend only on (key, row_ids[b], turn_ids[b]), whichever call serves the turn.
          grammar: ``(table, starts)``: constrained decoding (``jaxagent.generate.grammar``),
            row b starting this call's turn in automaton state ``starts[b]`` (-1: free) of
            ``GrammarTable.device_table()``; the output then has ``grammar_states``.
        """
        args, kwargs, prefilled = self._inputs(
            params, new_tokens, sampling, key, cache, row_ids, share_prompts, turn_ids, grammar
        )
        self.prefilled_tokens += prefilled
        return self._jit(*args, **kwargs)

    def lower(
        self,
        params,
        new_tokens: Sequence[Sequence[int]],
        sampling: SamplingConfig,
        key: jax.Array,
        cache: Optional[KVCache] = None,
        row_ids: Optional[Sequence[int]] = None,
        share_prompts: bool = False,
        turn_ids: Optional[Sequence[int]] = None,
        grammar: Optional[tuple[jax.Array, Sequence[int]]] = None,
    ):
        """The ``jax.stages.Lowered`` of the call ``__call__`` would make (nothing runs):
        ``.compile().memory_analysis()`` gives its temporaries (``benchmarks/prefill_memory``)."""
        args, kwargs, _ = self._inputs(
            params, new_tokens, sampling, key, cache, row_ids, share_prompts, turn_ids, grammar
        )
        return self._jit.lower(*args, **kwargs)

    def _inputs(
        self,
        params,
        new_tokens,
        sampling,
        key,
        cache,
        row_ids,
        share_prompts,
        turn_ids=None,
        grammar=None,
    ):
        """The jitted function's arguments (padded, bucketed chunk, cache, row sharding) and
        how many real tokens it prefills."""
        if not isinstance(sampling, SamplingConfig):
            raise TypeError(f"sampling must be a SamplingConfig, got {type(sampling).__name__}")
        rows = [np.asarray(r, np.int32).reshape(-1) for r in new_tokens]
        b = len(rows)
        if b == 0:
            raise ValueError("new_tokens is empty: pass one list of token ids per row")
        counts = np.array([len(r) for r in rows])
        if counts.max() == 0:
            raise ValueError("new_tokens: every row is empty, nothing to condition on")
        for i, r in enumerate(rows):
            if r.size and (r.min() < 0 or r.max() >= self.config.vocab_size):
                raise ValueError(f"new_tokens[{i}] has ids outside [0, {self.config.vocab_size})")
        expand = None
        if share_prompts and cache is None:
            first: dict[bytes, int] = {}
            expand = np.array([first.setdefault(r.tobytes(), len(first)) for r in rows], np.int32)
            if len(first) == b:
                expand = None  # nothing shared: the plain call
            else:
                unique = [None] * len(first)
                for i, j in enumerate(expand):
                    if unique[j] is None:
                        unique[j] = rows[i]
                # Prefill rows bucketed to a power of two (the extra rows are empty), so the
                # number of distinct prompts does not add a compile per value.
                pad_rows = bucket(len(unique), pow2=True, cap=b) - len(unique)
                rows = unique + [np.zeros(0, np.int32)] * pad_rows
        t = bucket(int(counts.max()), pow2=True, minimum=self.min_chunk)
        chunk = sampling.prefill_chunk
        if chunk and t > chunk:
            t = bucket(t, multiple=chunk)  # whole chunks (t itself is a power of two)
        tokens = np.full((len(rows), t), self.pad_id, np.int32)
        segs = np.zeros((len(rows), t), np.int32)
        for i, r in enumerate(rows):  # right-padded: the cache compacts rows anyway
            tokens[i, : len(r)] = r
            segs[i, : len(r)] = 1
        old = np.zeros(b, np.int64) if cache is None else np.asarray(cache.lengths)
        if cache is not None and cache.batch_size != b:
            raise ValueError(
                f"cache has {cache.batch_size} rows but new_tokens has {b}; "
                "keep one row per episode across calls"
            )
        needed = int((old + counts).max()) + sampling.max_new_tokens
        if needed > self.config.max_seq_len:
            raise ValueError(
                f"context of {needed} tokens exceeds ModelConfig.max_seq_len="
                f"{self.config.max_seq_len}; shorten the episode or max_new_tokens"
            )
        capacity = bucket_capacity(needed, self.capacity_block)
        if cache is not None and cache.capacity < needed:
            cache = grow_cache(cache, capacity)
        rows_sh = _row_sharding(params, b)
        put = jnp.asarray if rows_sh is None else lambda x: jax.device_put(x, rows_sh)
        put_pre = put if expand is None else jnp.asarray  # prefill rows: left to XLA
        args = (
            params,
            self._decode_weights(params, b),
            cache,
            put_pre(tokens),
            put_pre(segs),
            key,
            None if row_ids is None else put(np.asarray(row_ids, np.int32).reshape(b)),
            None if expand is None else jnp.asarray(expand),
            None if turn_ids is None else put(np.asarray(turn_ids, np.int32).reshape(b)),
            None if grammar is None else grammar[0],
            None if grammar is None else put(np.asarray(grammar[1], np.int32).reshape(b)),
        )
        kwargs = dict(
            sampling=sampling,
            capacity=None if cache is not None else capacity,
            rows_sharding=rows_sh,
            attention_sharding=attention_sharding(params, rows_sh),
        )
        return args, kwargs, int(segs.sum())

    # ---- device side -------------------------------------------------------------------
    def _generate(
        self,
        params,
        fused,
        cache,
        tokens,
        segment_ids,
        key,
        row_ids,
        expand,
        turn_ids,
        gtable,
        gstart,
        *,
        sampling,
        capacity,
        rows_sharding,
        attention_sharding=None,
    ):
        self.num_compiles += 1
        cfg, n = self.config, sampling.max_new_tokens
        model = nnx.merge(self.graphdef, params)
        t = tokens.shape[1]
        # Rows sampled (b) and rows prefilled: the same, or with ``expand`` [b] the distinct
        # prompts, whose cache rows and logits row b takes from prefill row expand[b].
        b = tokens.shape[0] if expand is None else expand.shape[0]
        if cache is None:
            cache = init_cache(cfg, tokens.shape[0], capacity, self.cache_dtype)
        if rows_sharding is not None and expand is None:
            cache = _shard_cache_rows(cache, rows_sharding)
        if fused is None and self.fuse_weights:
            # Concatenated q/k/v and gate/up kernels, built once per call, reused every step.
            fused = model.fused_weights()
        # A long chunk (a prompt) is a wide matmul, faster with the row-major kernels; the
        # output-major decode kernels pay off for few rows (a step, a short observation).
        # Decided on the sampled rows and chunk width, so sharing prompts keeps the kernels.
        width = min(t, sampling.prefill_chunk or t)
        chunk_fused = fused if b * width <= _DECODE_ROWS else None
        h, cache = _prefill(
            model,
            tokens,
            segment_ids,
            cache,
            chunk_fused,
            sampling.prefill_chunk,
            attention_sharding,
        )
        logits = model.logits(h, chunk_fused)  # [B, V]: last token only
        valid = segment_ids != 0
        if expand is not None:
            cache = _take_rows(cache, expand)
            logits, valid = logits[expand], valid[expand]
            if rows_sharding is not None:
                cache = _shard_cache_rows(cache, rows_sharding)
        # Every uniform the call needs, drawn at once: [n, B] (row i feeds the i-th token).
        if sampling.greedy:
            us = None
        else:
            us = (
                uniforms(key, (n, b))
                if row_ids is None
                else row_uniforms(key, n, row_ids, turn_ids)
            )
        gstate = jnp.full((b,), -1, jnp.int32) if gstart is None else gstart
        if gtable is not None:
            logits = constrain_logits(logits, gtable, gstate)
        tok, lp = sample_tokens_from_uniform(None if us is None else us[0], logits, sampling)
        active = jnp.any(valid, axis=1)
        stop = jnp.asarray(sampling.stop_token_ids or (-1,), jnp.int32)
        state = _LoopState(
            step=jnp.zeros((), jnp.int32),
            last=tok,
            pending=active,
            finished=~active | jnp.isin(tok, stop) | (n == 1),
            num_generated=active.astype(jnp.int32),
            tokens=jnp.full((b, n), self.pad_id, jnp.int32)
            .at[:, 0]
            .set(jnp.where(active, tok, self.pad_id)),
            logprobs=jnp.zeros((b, n), jnp.float32).at[:, 0].set(jnp.where(active, lp, 0.0)),
            cache=cache,
            gstate=gstate if gtable is None else advance(gtable, gstate, tok),
            gstates=jnp.full((b, n), -1, jnp.int32).at[:, 0].set(gstate),
        )

        def body(s: _LoopState) -> _LoopState:
            # Token num_generated of each row; the last step's draw (all rows done) is unused.
            u = (
                None
                if us is None
                else jax.lax.dynamic_index_in_dim(
                    us, jnp.minimum(s.step + 1, n - 1), keepdims=False
                )
            )
            return s.replace(
                step=s.step + 1, **decode_step(model, fused, sampling, stop, s, u, table=gtable)
            )

        state = jax.lax.while_loop(lambda s: jnp.any(s.pending), body, state)
        return SampleOutput(
            tokens=state.tokens,
            logprobs=state.logprobs,
            lengths=state.num_generated,
            cache=state.cache,
            grammar_states=None if gtable is None else state.gstates,
        )


def decode_step(model, fused, sampling, stop, s, u, window: int | None = None, table=None) -> dict:
    """One decode step over a batch of rows (the one step of ``Sampler`` and
    ``SlotSampler``): feed each pending row's last sampled token into the cache, sample the
    next from ``u`` [B] (None: greedy), write it at the row's column; returns the new
    ``last``, ``pending``, ``finished``, ``num_generated``, ``tokens``, ``logprobs`` and
    ``cache`` of state ``s``. A row that already finished writes nothing (column
    ``max_new_tokens`` is out of range: dropped). With an automaton ``table``
    (``jaxagent.generate.grammar``) each row samples from the tokens its ``gstate`` allows, and
    ``gstate`` / ``gstates`` are returned too."""
    n = sampling.max_new_tokens
    h, cache = model.hidden(
        s.last[:, None],
        s.cache.lengths[:, None],
        s.pending[:, None].astype(jnp.int32),
        s.cache,
        fused,
        window=window,
    )
    logits = model.logits(h[:, 0], fused)
    if table is not None:
        logits = constrain_logits(logits, table, s.gstate)
    tok, lp = sample_tokens_from_uniform(u, logits, sampling)
    gen = s.pending & ~s.finished  # rows that emit a new token this step
    col = jnp.where(gen, s.num_generated, n)
    rows = jnp.arange(s.last.shape[0])
    num_generated = s.num_generated + gen
    extra = {}
    if table is not None:
        extra = dict(
            gstate=jnp.where(gen, advance(table, s.gstate, tok), s.gstate),
            gstates=s.gstates.at[rows, col].set(s.gstate, mode="drop"),
        )
    return dict(
        **extra,
        last=jnp.where(gen, tok, s.last),
        pending=gen,
        finished=s.finished | (gen & (jnp.isin(tok, stop) | (num_generated >= n))),
        num_generated=num_generated,
        tokens=s.tokens.at[rows, col].set(tok, mode="drop"),
        logprobs=s.logprobs.at[rows, col].set(lp, mode="drop"),
        cache=cache,
    )


def _prefill(model, tokens, segment_ids, cache, fused, chunk: int, attention_sharding=None):
    """Write ``tokens`` [B, T] into ``cache``; returns each row's last real token's hidden
    state [B, D] and the cache.

    ``attention_sharding`` (static, ``attention_sharding``): the rows' sharding, whose mesh
    a fused prefill kernel (cuDNN's, ``model.attention: cudnn|auto`` on a GPU) runs per
    device on and whose platform "auto" picks by (``Transformer.hidden``).

    ``chunk`` > 0 and < T: ``T / chunk`` slices (T is a multiple of ``chunk``, see
    ``Sampler._inputs``), each run through ``Transformer.hidden``'s cache path, so a slice's
    queries attend to every slot written before them exactly as in one call (same keys, same
    positions ``lengths + rank``, same causal mask) and attention temporaries are [B, heads,
    chunk, capacity]: linear in the prompt instead of quadratic. The loop stops after the last
    slice holding a real token, so padding slices of a short batch cost nothing.
    """
    b, t = tokens.shape
    valid = segment_ids != 0
    last_index = jnp.max(jnp.where(valid, jnp.arange(t)[None], 0), axis=1)  # [B]
    rows = jnp.arange(b)
    if not chunk or t <= chunk:
        positions = cache.lengths[:, None] + jnp.maximum(jnp.cumsum(valid, axis=1) - 1, 0)
        h, cache = model.hidden(
            tokens, positions, segment_ids, cache, fused, attention_sharding=attention_sharding
        )
        return h[rows, last_index], cache
    tok_c = tokens.reshape(b, t // chunk, chunk)
    seg_c = segment_ids.reshape(b, t // chunk, chunk)
    needed = jnp.max(jnp.where(jnp.any(valid, axis=1), last_index, 0)) // chunk + 1

    def body(i, carry):
        h_last, cache = carry
        tok = jax.lax.dynamic_index_in_dim(tok_c, i, axis=1, keepdims=False)
        seg = jax.lax.dynamic_index_in_dim(seg_c, i, axis=1, keepdims=False)
        positions = cache.lengths[:, None] + jnp.maximum(jnp.cumsum(seg != 0, axis=1) - 1, 0)
        h, cache = model.hidden(
            tok, positions, seg, cache, fused, attention_sharding=attention_sharding
        )
        local = last_index - i * chunk
        here = (local >= 0) & (local < chunk)
        h_last = jnp.where(here[:, None], h[rows, jnp.clip(local, 0, chunk - 1)], h_last)
        return h_last, cache

    h0 = jnp.zeros((b, model.config.hidden_size), model.config.jnp_dtype)
    return jax.lax.fori_loop(0, needed, body, (h0, cache))


def _take_rows(cache: KVCache, index: jax.Array) -> KVCache:
    """The cache whose row b is row ``index[b]`` of ``cache`` (rows are dimension 0, or 1
    after the layer axis of a stacked cache)."""
    axis = 1 if cache.stacked else 0
    return KVCache(
        keys=jax.tree.map(lambda k: jnp.take(k, index, axis=axis), cache.keys),
        values=jax.tree.map(lambda v: jnp.take(v, index, axis=axis), cache.values),
        lengths=cache.lengths[index],
    )


def _row_sharding(params, batch_size: int) -> Optional[NamedSharding]:
    """How the rows of a call are split: over the batch axes of the mesh the parameters live
    on (``jaxagent.parallel.mesh``'s default rules), or None for unsharded parameters. Each device
    then holds the KV cache of its own rows only; rows that do not divide evenly are
    replicated instead. (The cache's KV heads are split further by ``_shard_cache_rows``.)"""
    sharding = getattr(jax.tree.leaves(params)[0], "sharding", None)
    if not isinstance(sharding, NamedSharding) or sharding.mesh.size == 1:
        return None
    mesh = sharding.mesh
    axes = batch_mesh_axes(mesh)
    n = int(np.prod([mesh.shape[a] for a in axes]))
    if not axes or batch_size % n:
        return NamedSharding(mesh, P())
    return NamedSharding(mesh, P(axes if len(axes) > 1 else axes[0]))


def attention_sharding(params, rows: Optional[NamedSharding]) -> Optional[NamedSharding]:
    """The sharding a prefill's fused attention kernel runs on (``_prefill``): the rows' own
    (``_row_sharding``), or, for rows that are not split, the parameters' mesh with the rows
    whole (a one-device mesh included: its platform is the compile's target), or None for
    parameters without a mesh (JAX's default backend)."""
    if rows is not None:
        return rows
    sharding = getattr(jax.tree.leaves(params)[0], "sharding", None)
    if not isinstance(sharding, NamedSharding):
        return None
    return NamedSharding(sharding.mesh, P())


def _kv_head_axis(rows: NamedSharding, num_kv_heads: int) -> Optional[str]:
    """The mesh axis the cache's KV-head dimension is split over: 'tensor' when it has more
    than one device, divides ``num_kv_heads`` and does not already split the rows. The
    attention projections split their (KV) heads over the same axis (``DEFAULT_RULES``), so
    each device attends its own heads over its own slice of the cache (Megatron-style
    tensor parallelism, Shoeybi et al. 2019), and a row's cache is spread over the tensor
    group instead of copied on each of its devices."""
    size = dict(rows.mesh.shape).get("tensor", 1)
    spec = rows.spec[0] if len(rows.spec) else None
    used = spec if isinstance(spec, tuple) else (spec,)
    if size > 1 and num_kv_heads % size == 0 and "tensor" not in used:
        return "tensor"
    return None


def _shard_cache_rows(cache: KVCache, rows: NamedSharding) -> KVCache:
    """Constrain every cache buffer's row dimension to the rows' sharding (dimension 0, or 1
    after the layer axis of a stacked cache), and its KV-head dimension (the next one: keys
    [B, K, hd, S], values [B, K, S, hd]) to the mesh's tensor axis where it divides the heads
    (``_kv_head_axis``)."""
    row = rows.spec[0] if len(rows.spec) else None
    first = cache.keys if cache.stacked else cache.keys[0]
    heads = _kv_head_axis(rows, first.shape[2 if cache.stacked else 1])

    def one(x, lead=(), head=None):
        dims = (*lead, row) if head is None else (*lead, row, head)
        rest = [None] * (x.ndim - len(dims))
        return jax.lax.with_sharding_constraint(x, NamedSharding(rows.mesh, P(*dims, *rest)))

    layer = (None,) if cache.stacked else ()
    return KVCache(
        keys=jax.tree.map(lambda k: one(k, layer, heads), cache.keys),
        values=jax.tree.map(lambda v: one(v, layer, heads), cache.values),
        lengths=one(cache.lengths),
    )
