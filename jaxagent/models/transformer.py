"""Decoder-only transformer (Llama / Qwen2 family) written with Flax NNX.

RMSNorm, rotary embeddings, grouped-query attention with optional QKV bias, SwiGLU MLP, tied
or untied embeddings and an optional scalar value head. Parameters carry logical axis names
(metadata ``logical_axes``) for sharding: 'vocab', 'embed', 'heads', 'kv_heads', 'mlp'.

Callers use the pure functions in ``jaxagent.models.api`` on ``(graphdef, params)``; the
modules here are merged inside jit, so the NNX graph walk costs trace time only.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
from flax import nnx

from jaxagent.models.blockwise import (
    BLOCK,
    CachedQueries,
    Segments,
    attend_cached,
    attend_segments,
    platform_of,
    prefill_kernel,
    row_shards,
)
from jaxagent.models.cache import KVCache, write_slots
from jaxagent.models.config import ModelConfig
from jaxagent.models.rope import apply_rope, rope_cos_sin

# A large finite negative instead of -inf: a fully masked row (padding) then gives a uniform
# softmax rather than NaN, and its output is ignored by every caller.
_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)
_init = nnx.initializers.normal(0.02)


def _param(rngs, shape, dtype, axes, init=_init, layers=0):
    """A parameter; ``layers`` > 0 stacks that many along a leading, unsharded layer axis."""
    if layers:
        shape, axes = (layers, *shape), (None, *axes)
    return nnx.Param(init(rngs.params(), shape, dtype), logical_axes=axes)


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, dtype, param_dtype, layers: int = 0):
        self.eps, self.dtype = eps, dtype
        shape, axes = ((layers, dim), (None, "embed")) if layers else ((dim,), ("embed",))
        self.scale = nnx.Param(jnp.ones(shape, param_dtype), logical_axes=axes)

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.scale[...].astype(self.dtype) * y.astype(self.dtype)


def dense_t(x: jax.Array, w_t: jax.Array, out_dtype=None) -> jax.Array:
    """``x @ w_t.T`` for x [..., K] and a kernel stored output-major, w_t [N, K].

    Computed as ``w_t @ x.T`` ([N, M], then a transpose of the small result): with few rows
    M (a decode step) the CPU backend streams an output-major kernel about 1.5x faster than
    the row-major [K, N] form, which it repacks every call. The optimisation barrier keeps
    XLA from folding the transpose back into the slow form.
    """
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    out_t = jax.lax.dot_general(
        w_t.astype(x.dtype), x2, (((1,), (1,)), ((), ())), preferred_element_type=out_dtype
    )
    return jax.lax.optimization_barrier(out_t).T.reshape(*lead, w_t.shape[0])


def dense_fused(x: jax.Array, fused: dict, name: str, out_dtype=None) -> jax.Array:
    """``x`` times the kernel ``name`` of a ``fused_weights`` dict, in whichever layout it has:
    ``fused[name]`` row-major [K, N], or ``fused[name + "_t"]`` output-major [N, K]."""
    if name + "_t" in fused:
        return dense_t(x, fused[name + "_t"], out_dtype)
    return jnp.matmul(x, fused[name].astype(x.dtype), preferred_element_type=out_dtype)


def attend(q: jax.Array, keys: jax.Array, values: jax.Array, mask: jax.Array) -> jax.Array:
    """Grouped-query attention.

    Args:
      q: [B, T, K, G, hd] queries, already scaled by hd**-0.5.
      keys, values: [B, K, S, hd] (the cache's layout has its own ``attend_cache``).
      mask: [B, T, S] bool, True where query t may attend slot s.

    Returns:
      [B, T, K, G, hd] attention output.
    """
    scores = jnp.einsum("btkgh,bksh->bkgts", q, keys, preferred_element_type=jnp.float32)
    scores = jnp.where(mask[:, None, None], scores, _MASK_VALUE)
    probs = jax.nn.softmax(scores, axis=-1).astype(values.dtype)
    # Output as [B, K, G, T, hd]: a plain batched (row-major) matmul over the cache, which
    # the CPU backend runs far faster than the transposed form; the small result is moved.
    out = jnp.einsum("bkgts,bksh->bkgth", probs, values)
    return out.transpose(0, 3, 1, 2, 4)


def attend_cache(q, keys, values, mask):
    """``attend`` over the cache layout: keys [B, K, hd, S], values [B, K, S, hd].

    Queries are laid out [B, K, T*G, hd] (a free reshape when T = 1) so both products are
    row-major batched matmuls, ``q @ keys`` and ``p @ values``, each of output width S or hd.
    """
    b, t, k, g, hd = q.shape
    q = q.transpose(0, 2, 1, 3, 4).reshape(b, k, t * g, hd)
    dims = (((3,), (2,)), ((0, 1), (0, 1)))
    scores = jax.lax.dot_general(q, keys, dims, preferred_element_type=jnp.float32)
    scores = scores.reshape(b, k, t, g, -1)
    scores = jnp.where(mask[:, None, :, None], scores, _MASK_VALUE)
    probs = jax.nn.softmax(scores, axis=-1).astype(values.dtype).reshape(b, k, t * g, -1)
    out = jax.lax.dot_general(probs, values, dims)  # [B, K, T*G, hd]
    return out.reshape(b, k, t, g, hd).transpose(0, 2, 1, 3, 4)


class Attention(nnx.Module):
    def __init__(self, config: ModelConfig, rngs: nnx.Rngs, layers: int = 0):
        d, h, k, hd = config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim
        pdt = config.jnp_param_dtype
        self.config = config
        self.q_proj = _param(rngs, (d, h, hd), pdt, ("embed", "heads", None), layers=layers)
        self.k_proj = _param(rngs, (d, k, hd), pdt, ("embed", "kv_heads", None), layers=layers)
        self.v_proj = _param(rngs, (d, k, hd), pdt, ("embed", "kv_heads", None), layers=layers)
        self.o_proj = _param(rngs, (h, hd, d), pdt, ("heads", None, "embed"), layers=layers)
        if config.qkv_bias:
            zeros = nnx.initializers.zeros
            self.q_bias = _param(rngs, (h, hd), pdt, ("heads", None), zeros, layers)
            self.k_bias = _param(rngs, (k, hd), pdt, ("kv_heads", None), zeros, layers)
            self.v_bias = _param(rngs, (k, hd), pdt, ("kv_heads", None), zeros, layers)

    def _project(self, x, name):
        out = jnp.einsum("btd,dnh->btnh", x, getattr(self, f"{name}_proj")[...].astype(x.dtype))
        if self.config.qkv_bias:
            out = out + getattr(self, f"{name}_bias")[...].astype(x.dtype)
        return out

    def fused_weights(self, output_major: bool = False) -> dict:
        """q/k/v kernels concatenated to [D, (H + 2K) * hd] (and biases): one matmul a step;
        the output kernel flattened to [H * hd, D]. ``output_major``: kernels transposed."""
        cfg = self.config
        w = jnp.concatenate(
            [getattr(self, f"{n}_proj")[...].reshape(cfg.hidden_size, -1) for n in ("q", "k", "v")],
            axis=1,
        )
        o = self.o_proj[...].reshape(-1, cfg.hidden_size)
        out = {"qkv_t": w.T, "o_t": o.T} if output_major else {"qkv": w, "o": o}
        if cfg.qkv_bias:
            out["qkv_bias"] = jnp.concatenate(
                [getattr(self, f"{n}_bias")[...].reshape(-1) for n in ("q", "k", "v")]
            )
        return out

    def _project_fused(self, x, fused):
        cfg = self.config
        b, t, _ = x.shape
        out = dense_fused(x, fused, "qkv")
        if cfg.qkv_bias:
            out = out + fused["qkv_bias"].astype(x.dtype)
        out = out.reshape(b, t, cfg.num_heads + 2 * cfg.num_kv_heads, cfg.head_dim)
        h, k = cfg.num_heads, cfg.num_kv_heads
        return out[:, :, :h], out[:, :, h : h + k], out[:, :, h + k :]

    def __call__(self, x, cos, sin, mask, cache_kv=None, slots=None, fused=None, layer=None):
        """x [B,T,D]; mask [B,T,S]; cache_kv (keys [B,K,hd,S], values [B,K,S,hd]) or None;
        slots [B,T].

        ``fused``: optional output of ``fused_weights`` (same numbers, fewer matmuls).
        ``layer``: an index into a stacked cache (keys [L,B,K,hd,S], values [L,B,K,S,hd],
        ``scan_layers``): this layer's tokens are written into the stacked buffers in place
        and the updated stacked buffers come back."""
        cfg = self.config
        b, t, _ = x.shape
        if fused is None:
            q, k, v = (self._project(x, n) for n in ("q", "k", "v"))
        else:
            q, k, v = self._project_fused(x, fused)
        q = apply_rope(q, cos, sin) * (cfg.head_dim**-0.5)
        k = apply_rope(k, cos, sin)
        if cache_kv is None:
            keys, values = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B, K, T, hd]
            new_kv = None
        else:
            cache_k, cache_v = cache_kv
            rows = jnp.arange(b)[:, None]
            # keys [B, K, hd, S], values [B, K, S, hd]: both index [B, T, K, hd] per token.
            at = () if layer is None else (layer,)
            keys = cache_k.at[(*at, rows, slice(None), slice(None), slots)].set(
                k.astype(cache_k.dtype), mode="drop"
            )
            values = cache_v.at[(*at, rows, slice(None), slots)].set(
                v.astype(cache_v.dtype), mode="drop"
            )
            new_kv = (keys, values)
            if layer is not None:
                keys = jax.lax.dynamic_index_in_dim(keys, layer, keepdims=False)
                values = jax.lax.dynamic_index_in_dim(values, layer, keepdims=False)
        q = q.reshape(b, t, cfg.num_kv_heads, cfg.num_groups, cfg.head_dim)
        if isinstance(mask, CachedQueries):  # a prefill through a fused kernel
            out = attend_cached(q, keys.astype(x.dtype), values.astype(x.dtype), mask)
            return self._output(out, fused), new_kv
        if cache_kv is not None and mask.shape[-1] < keys.shape[-1]:
            # A window narrower than the cache (``hidden``'s ``window``): only the slots in
            # use are read, so a decode step costs what the rows' lengths need.
            w = mask.shape[-1]
            keys, values = keys[..., :w], values[..., :w, :]
        keys, values = keys.astype(x.dtype), values.astype(x.dtype)
        if isinstance(mask, Segments):
            out = attend_segments(q, keys, values, mask)
        else:
            out = (attend if cache_kv is None else attend_cache)(q, keys, values, mask)
        return self._output(out, fused), new_kv

    def _output(self, out, fused):
        """The output projection of the attention output [B, T, K, G, hd]."""
        cfg = self.config
        b, t = out.shape[:2]
        # [B, T, H*hd] @ [H*hd, D]: both reshapes are free, so the (large) kernel is read in
        # place every step instead of being transposed to fit a 3-index contraction.
        out = out.reshape(b, t, cfg.num_heads * cfg.head_dim)
        if fused is not None:
            return dense_fused(out, fused, "o")
        o_w = self.o_proj[...].reshape(cfg.num_heads * cfg.head_dim, cfg.hidden_size)
        return out @ o_w.astype(out.dtype)


class MLP(nnx.Module):
    def __init__(self, config: ModelConfig, rngs: nnx.Rngs, layers: int = 0):
        d, f, pdt = config.hidden_size, config.intermediate_size, config.jnp_param_dtype
        self.gate_proj = _param(rngs, (d, f), pdt, ("embed", "mlp"), layers=layers)
        self.up_proj = _param(rngs, (d, f), pdt, ("embed", "mlp"), layers=layers)
        self.down_proj = _param(rngs, (f, d), pdt, ("mlp", "embed"), layers=layers)

    def fused_weights(self, output_major: bool = False) -> dict:
        """gate and up kernels concatenated to [D, 2F]: one matmul a step."""
        gate_up = jnp.concatenate([self.gate_proj[...], self.up_proj[...]], axis=1)
        if output_major:
            return {"gate_up_t": gate_up.T, "down_t": self.down_proj[...].T}
        return {"gate_up": gate_up, "down": self.down_proj[...]}

    def __call__(self, x, fused=None):
        if fused is None:
            gate = x @ self.gate_proj[...].astype(x.dtype)
            up = x @ self.up_proj[...].astype(x.dtype)
        else:
            gate, up = jnp.split(dense_fused(x, fused, "gate_up"), 2, axis=-1)
            return dense_fused(jax.nn.silu(gate) * up, fused, "down")
        return (jax.nn.silu(gate) * up) @ self.down_proj[...].astype(x.dtype)


class Block(nnx.Module):
    """One transformer block; ``layers`` > 0 builds that many blocks' parameters stacked along
    a leading axis (``scan_layers``), which only ``Transformer.hidden``'s scan runs: its
    methods apply to one layer's slice, merged back into this module's graphdef."""

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs, layers: int = 0):
        dt, pdt, eps = config.jnp_dtype, config.jnp_param_dtype, config.rms_norm_eps
        self.input_norm = RMSNorm(config.hidden_size, eps, dt, pdt, layers)
        self.attn = Attention(config, rngs, layers)
        self.post_attn_norm = RMSNorm(config.hidden_size, eps, dt, pdt, layers)
        self.mlp = MLP(config, rngs, layers)

    def fused_weights(self, output_major: bool = False) -> dict:
        return {**self.attn.fused_weights(output_major), **self.mlp.fused_weights(output_major)}

    def __call__(self, x, cos, sin, mask, cache_kv=None, slots=None, fused=None, layer=None):
        attn_out, new_kv = self.attn(
            self.input_norm(x), cos, sin, mask, cache_kv, slots, fused, layer
        )
        x = x + attn_out
        return x + self.mlp(self.post_attn_norm(x), fused), new_kv


@runtime_checkable
class LayerScan(Protocol):
    """A ``remat`` for ``scan_layers`` that runs the whole scan over the stacked blocks itself
    (the fused optimiser's hook, ``jaxagent.rl.fused_step.ScanHook``, whose backward pass
    steps each layer's slice of the stacked parameters): ``scan(block, stacked, x, consts)``
    applies ``block(layer_state, x, *consts)`` layer by layer and returns the last output."""

    def scan(self, block: Callable, stacked: Any, x: jax.Array, consts: tuple) -> jax.Array: ...


class Transformer(nnx.Module):
    """The policy LM. ``hidden`` runs the blocks; ``logits`` / ``values`` are the heads."""

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        self.config = config
        d, v, pdt = config.hidden_size, config.vocab_size, config.jnp_param_dtype
        self.embed = _param(rngs, (v, d), pdt, ("vocab", "embed"))
        if config.scan_layers:  # one stacked module, run by a scan (see ``hidden``)
            self.blocks = Block(config, rngs, layers=config.num_layers)
        else:
            for i in range(config.num_layers):
                setattr(self, f"layer_{i}", Block(config, rngs))
        self.final_norm = RMSNorm(d, config.rms_norm_eps, config.jnp_dtype, pdt)
        if not config.tie_embeddings:
            self.lm_head = _param(rngs, (d, v), pdt, ("embed", "vocab"))
        if config.value_head:
            self.value_kernel = _param(rngs, (d,), pdt, ("embed",))
            self.value_bias = _param(rngs, (), pdt, (), nnx.initializers.zeros)

    def layers(self):
        """The unrolled blocks ``layer_0 .. layer_{L-1}`` (not with ``scan_layers``)."""
        if self.config.scan_layers:
            raise ValueError("Transformer.layers: scan_layers=True keeps one stacked `blocks`")
        return [getattr(self, f"layer_{i}") for i in range(self.config.num_layers)]

    def fused_weights(self, output_major: bool = False) -> dict:
        """Decode-friendly copies of the kernels, built once outside a decode loop.

        ``layers``: per-layer concatenated q/k/v and gate/up kernels (see ``hidden``);
        ``lm_head``: the head kernel as [D, V] (with tied embeddings, the embedding
        transposed, so each step reads it row-major instead of transposing it).
        ``output_major``: every kernel stored [out, in] instead (keys ``*_t``, see
        ``dense_t``): faster on CPU when a step has few rows and the weights do not fit in
        cache; slower for wide chunks.
        """
        if self.config.scan_layers:  # the same per-layer dict, each entry stacked [L, ...]
            block_def, state = nnx.split(self.blocks)

            def per_layer(st):
                return nnx.merge(block_def, st).fused_weights(output_major)

            out = {"layers": jax.vmap(per_layer)(state)}
        else:
            out = {"layers": tuple(layer.fused_weights(output_major) for layer in self.layers())}
        tied = self.config.tie_embeddings
        if output_major:  # [V, D]: the embedding itself when tied
            out["lm_head_t"] = self.embed[...] if tied else self.lm_head[...].T
        else:
            out["lm_head"] = self.embed[...].T if tied else self.lm_head[...]
        return out

    def hidden(
        self,
        tokens,
        positions,
        segment_ids,
        cache: KVCache | None = None,
        fused: dict | None = None,
        remat=False,
        activation_sharding=None,
        window: int | None = None,
        attention_sharding=None,
    ):
        """Final-normed hidden states [B, T, D] and the updated cache (or None).

        Without a cache, query t attends key s when s <= t and both share a nonzero segment
        id (causal, packed, padding-aware); rows longer than ``blockwise.BLOCK`` tokens are
        attended tile by tile, so attention memory grows linearly with their length. With a cache, the chunk's real tokens are
        appended at each row's own length and attend to everything stored before them.
        ``fused`` (from ``fused_weights``, computed once outside a decode loop) replaces the
        separate q/k/v and gate/up matmuls by one each; results are the same. ``remat``
        (no-cache only) recomputes each block in the backward pass instead of storing its
        activations, for memory-lean training; a callable ``remat`` replaces ``jax.checkpoint``
        as the wrapper of ``block(layer_state, x, cos, sin, mask)``.
        ``activation_sharding`` (a ``Sharding`` of [B, T, D], e.g. rows over the mesh's batch
        axes) pins the residual stream between blocks: without it, XLA's propagation may take
        the FSDP-sharded weights' layout (hidden dimension split) and compute every row on
        every device.
        ``window`` (with a cache, static): attention reads only the cache's first ``window``
        slots, which must hold every row's tokens, old and new (a length-aware decode step:
        its cost follows the rows' lengths, not the cache's capacity).
        ``attention_sharding`` (with a cache, static): the rows' ``NamedSharding`` (of [B, ...])
        a fused prefill kernel runs per device on, and whose devices' platform "auto" picks
        it for (``blockwise.prefill_kernel``): a chunk of several tokens whose kernel is cuDNN
        attends through cuDNN's flash attention (``blockwise.attend_cached``) instead of
        ``attend_cache``'s float32 scores; the cache write is the same. None: JAX's default
        backend, one device.
        With ``config.scan_layers`` the blocks run as one ``jax.lax.scan`` over the stacked
        parameters (and the stacked cache, ``init_cache``): one block is traced and compiled
        whatever the depth; ``remat`` wraps the scanned block the same way, or, a
        ``LayerScan`` (the fused optimiser's hook), runs the scan itself.
        """
        cfg = self.config

        def pin(x):
            if activation_sharding is None or x.shape[0] % row_shards(activation_sharding):
                return x  # rows that do not split evenly are left to XLA
            return jax.lax.with_sharding_constraint(x, activation_sharding)

        x = pin(jnp.take(self.embed[...], tokens, axis=0).astype(cfg.jnp_dtype))
        cos, sin = rope_cos_sin(cfg, positions)
        if cache is None and tokens.shape[1] > BLOCK:
            # Long rows: tile by tile (``blockwise``), no [T, T] scores or mask in memory.
            mask = Segments(segment_ids, cfg.attention, activation_sharding)
            slots = None
        elif cache is None:
            t = tokens.shape[1]
            causal = jnp.arange(t)[None, :, None] >= jnp.arange(t)[None, None, :]
            same = segment_ids[:, :, None] == segment_ids[:, None, :]
            mask = causal & same & (segment_ids[:, None, :] != 0)
            slots = None
        else:
            slots, query_slots = write_slots(cache, segment_ids)
            width = cache.capacity if window is None else min(window, cache.capacity)
            platform = platform_of(attention_sharding)
            if tokens.shape[1] > 1 and prefill_kernel(cfg.attention, platform, x.dtype) == "cudnn":
                mask = CachedQueries(query_slots, width, "cudnn", attention_sharding)
            else:
                mask = jnp.arange(width)[None, None, :] <= query_slots[:, :, None]
        if cfg.scan_layers:
            return self._scan_blocks(
                x, cos, sin, mask, slots, cache, fused, remat, pin, segment_ids
            )
        new_keys, new_values = [], []
        for i, layer in enumerate(self.layers()):
            kv = None if cache is None else (cache.keys[i], cache.values[i])
            layer_fused = None if fused is None else fused["layers"][i]
            if remat and cache is None:
                wrap = remat if callable(remat) else jax.checkpoint
                x, new_kv = pin(_remat_block(layer, x, cos, sin, mask, wrap)), None
                continue
            x, new_kv = layer(x, cos, sin, mask, kv, slots, layer_fused)
            x = pin(x)
            if new_kv is not None:
                new_keys.append(new_kv[0])
                new_values.append(new_kv[1])
        x = self.final_norm(x)
        if cache is None:
            return x, None
        lengths = cache.lengths + jnp.sum(segment_ids != 0, axis=1).astype(jnp.int32)
        return x, KVCache(keys=tuple(new_keys), values=tuple(new_values), lengths=lengths)

    def _scan_blocks(self, x, cos, sin, mask, slots, cache, fused, remat, pin, segment_ids):
        """``hidden``'s loop over the stacked ``blocks``: one scan step a layer.

        Without a cache the carry is the residual stream; with one it also carries the
        stacked key / value buffers, which each layer updates in place at its own index
        (a scan's per-layer outputs would be fresh buffers, copying the cache every step).
        """
        block_def, state = nnx.split(self.blocks)
        layer_fused = None if fused is None else fused["layers"]
        if cache is None:

            def block(st, x, cos, sin, mask, fused_l=None):
                return nnx.merge(block_def, st)(x, cos, sin, mask, fused=fused_l)[0]

            if isinstance(remat, LayerScan):  # the hook runs the scan (and its backward)
                step = lambda st, x, *consts: pin(block(st, x, *consts))  # noqa: E731
                x = remat.scan(step, state, x, (cos, sin, mask))
                return self.final_norm(x), None

            if remat:  # as ``_remat_block``: the wrapper sees ``block(state, x, *consts)``
                block = (remat if callable(remat) else jax.checkpoint)(block)
                layer_fused = None  # the unrolled remat path runs the plain kernels too

            def body(x, xs):
                st, fused_l = xs
                extra = () if fused_l is None else (fused_l,)
                return pin(block(st, x, cos, sin, mask, *extra)), None

            x, _ = jax.lax.scan(body, x, (state, layer_fused))
            return self.final_norm(x), None

        def body(carry, xs):
            x, keys, values = carry
            st, fused_l, i = xs
            layer = nnx.merge(block_def, st)
            x, (keys, values) = layer(x, cos, sin, mask, (keys, values), slots, fused_l, i)
            return (pin(x), keys, values), None

        if not cache.stacked:
            raise ValueError(
                "Transformer.hidden: scan_layers=True needs a stacked KV cache; build it with "
                "jaxagent.models.cache.init_cache(config, ...) from the same config"
            )
        index = jnp.arange(self.config.num_layers, dtype=jnp.int32)
        carry = (x, cache.keys, cache.values)
        (x, keys, values), _ = jax.lax.scan(body, carry, (state, layer_fused, index))
        lengths = cache.lengths + jnp.sum(segment_ids != 0, axis=1).astype(jnp.int32)
        return self.final_norm(x), KVCache(keys=keys, values=values, lengths=lengths)

    def logits(self, h: jax.Array, fused: dict | None = None) -> jax.Array:
        """[..., D] -> [..., V] float32 (``fused`` from ``fused_weights``, optional)."""
        if fused is not None:
            return dense_fused(h, fused, "lm_head", jnp.float32)
        if self.config.tie_embeddings:
            w = self.embed[...].astype(h.dtype)
            return jnp.einsum("...d,vd->...v", h, w, preferred_element_type=jnp.float32)
        w = self.lm_head[...].astype(h.dtype)
        return jnp.einsum("...d,dv->...v", h, w, preferred_element_type=jnp.float32)

    def values(self, h: jax.Array) -> jax.Array | None:
        """[..., D] -> [...] float32 scalar values, or None without a value head."""
        if not self.config.value_head:
            return None
        w = self.value_kernel[...].astype(jnp.float32)
        return h.astype(jnp.float32) @ w + self.value_bias[...].astype(jnp.float32)


def _remat_block(layer, x, cos, sin, mask, wrap=jax.checkpoint):
    """One block under ``jax.checkpoint``: only its input is kept for the backward pass."""
    layer_def, layer_state = nnx.split(layer)

    def block(state, x, cos, sin, mask):
        return nnx.merge(layer_def, state)(x, cos, sin, mask)[0]

    return wrap(block)(layer_state, x, cos, sin, mask)
