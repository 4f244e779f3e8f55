"""Blockwise (flash) attention for training: temporaries linear in sequence length.

``attend`` in ``transformer.py`` materialises the [B, K, G, T, S] score tensor, and autodiff
keeps it (and the probabilities) for the backward pass: 4x memory per doubling of the
sequence. This module computes the same causal, packed, padding-aware attention one
(query block, key block) tile at a time with an online softmax (Dao et al. 2022,
"FlashAttention", arXiv 2205.14135; Rabe & Staats 2021, arXiv 2112.05682), and its backward
pass recomputes each tile's probabilities from the saved row log-sum-exp (FlashAttention-2,
arXiv 2307.08691, Algorithm 2) instead of storing them. Key blocks entirely above the causal
diagonal are skipped in both passes.

The mask is rebuilt per tile from the segment ids (query t sees key s when s <= t, both share
a segment and the segment is not 0), so no [T, S] mask exists either. Rows of padding
(segment 0) see no key; their output is the mean of the visited values rather than of all
values as in ``attend`` — every caller ignores padding outputs, and their cotangents are
zero, so gradients agree.

Pure JAX: it runs on every backend; accumulation is in float32 whatever the input dtype.
The same mask also runs through two vendor kernels (``attend_segments``): JAX's Pallas
splash kernel on TPU and cuDNN's fused flash attention on NVIDIA GPUs.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import NamedSharding, PartitionSpec as P

# The same large finite negative as ``transformer._MASK_VALUE``: a row whose first visited
# block is fully masked keeps a finite running maximum, and exp(mask - real max) is 0.
_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)

# Sequences up to this length use the reference ``attend`` (one tile would cover them).
BLOCK = 512
# The shortest tile ``tiling`` picks; rows that no longer tile divides are padded instead.
MIN_TILE = 128
# The splash kernel's blocks are multiples of a TPU vector register's 128 lanes.
_LANES = 128


@struct.dataclass
class Segments:
    """The attention mask of a packed, causal batch given by its segment ids [B, T] (0 =
    padding): what the no-cache forward passes instead of a [B, T, T] boolean mask, with how
    the long rows are attended (static: ``kernel``, one of ``KERNELS``; ``sharding``, the
    [B, T, D] activations' sharding, which the Pallas kernel needs to run per device)."""

    ids: jax.Array
    kernel: str = struct.field(pytree_node=False, default="blockwise")
    sharding: Any = struct.field(pytree_node=False, default=None)


def tiling(length: int, block: int = BLOCK) -> tuple[int, int]:
    """(tile length, padded row length) for rows of ``length`` tokens: ``block`` halved until
    it divides the row, the row padded with masked tokens to a multiple of ``MIN_TILE`` (or
    of ``block`` when smaller) when that would take tiles shorter than it. Tiny tiles make
    the loops long and each matmul a few rows: a 626-token row in tiles of 2 took an SFT step
    of the web recipe 11x longer than the same row padded to 640 in tiles of 128."""
    floor = min(block, MIN_TILE)
    b = block
    while length % b and b > floor:
        b //= 2
    if length % b == 0:
        return b, length
    padded = -(-length // floor) * floor
    return tiling(padded, block)[0], padded


def _tile_mask(seg_q, seg_k, q0, k0):
    """[B, bq, bk] bool: causal by index, same nonzero segment."""
    pos_q = q0 + jnp.arange(seg_q.shape[1])
    pos_k = k0 + jnp.arange(seg_k.shape[1])
    causal = pos_k[None, None, :] <= pos_q[None, :, None]
    same = seg_q[:, :, None] == seg_k[:, None, :]
    return causal & same & (seg_k[:, None, :] != 0)


def _slice_t(x, start, size, axis):
    return jax.lax.dynamic_slice_in_dim(x, start, size, axis)


def _forward(q, keys, values, seg, bq, bk):
    """Output [B, K, G, T, hd] (float32) and row log-sum-exp [B, K, G, T]."""
    b, t, k, g, hd = q.shape
    nq = t // bq

    def q_block(i):
        q0 = i * bq
        qi = _slice_t(q, q0, bq, 1)  # [B, bq, K, G, hd]
        seg_q = _slice_t(seg, q0, bq, 1)

        def body(j, carry):
            o, m, l = carry
            k0 = j * bk
            kj, vj = _slice_t(keys, k0, bk, 2), _slice_t(values, k0, bk, 2)
            s = jnp.einsum("bqkgh,bksh->bkgqs", qi, kj, preferred_element_type=jnp.float32)
            mask = _tile_mask(seg_q, _slice_t(seg, k0, bk, 1), q0, k0)
            s = jnp.where(mask[:, None, None], s, _MASK_VALUE)
            m_new = jnp.maximum(m, s.max(-1))
            p = jnp.exp(s - m_new[..., None])
            corr = jnp.exp(m - m_new)
            l = l * corr + p.sum(-1)
            pv = jnp.einsum(
                "bkgqs,bksh->bkgqh", p.astype(vj.dtype), vj, preferred_element_type=jnp.float32
            )
            return o * corr[..., None] + pv, m_new, l

        init = (
            jnp.zeros((b, k, g, bq, hd), jnp.float32),
            jnp.full((b, k, g, bq), _MASK_VALUE, jnp.float32),
            jnp.zeros((b, k, g, bq), jnp.float32),
        )
        last = (q0 + bq + bk - 1) // bk  # key blocks that hold any s <= t
        o, m, l = jax.lax.fori_loop(0, last, body, init)
        return o / l[..., None], m + jnp.log(l)

    out, lse = jax.lax.map(q_block, jnp.arange(nq))  # [nq, B, K, G, bq, (hd)]
    out = jnp.moveaxis(out, 0, 3).reshape(b, k, g, t, hd)
    lse = jnp.moveaxis(lse, 0, 3).reshape(b, k, g, t)
    return out, lse


def _backward(q, keys, values, seg, out, lse, d_out, bq, bk):
    """Cotangents of q [B, T, K, G, hd], keys and values [B, K, S, hd]."""
    b, t, k, g, hd = q.shape
    nq, nk = t // bq, t // bk
    # D_t = sum_h dO * O: the softmax backward's row term (FlashAttention-2, line 19).
    delta = jnp.sum(d_out * out, axis=-1)  # [B, K, G, T]

    def k_block(dq, j):
        k0 = j * bk
        kj, vj = _slice_t(keys, k0, bk, 2), _slice_t(values, k0, bk, 2)
        seg_k = _slice_t(seg, k0, bk, 1)

        def body(i, carry):
            dk, dv, dq = carry
            q0 = i * bq
            qi = _slice_t(q, q0, bq, 1)
            s = jnp.einsum("bqkgh,bksh->bkgqs", qi, kj, preferred_element_type=jnp.float32)
            mask = _tile_mask(_slice_t(seg, q0, bq, 1), seg_k, q0, k0)
            s = jnp.where(mask[:, None, None], s, _MASK_VALUE)
            p = jnp.exp(s - _slice_t(lse, q0, bq, 3)[..., None])  # [B, K, G, bq, bk]
            do_i = _slice_t(d_out, q0, bq, 3)  # [B, K, G, bq, hd]
            dv = dv + jnp.einsum("bkgqs,bkgqh->bksh", p, do_i)
            dp = jnp.einsum("bkgqh,bksh->bkgqs", do_i, vj.astype(jnp.float32))
            ds = p * (dp - _slice_t(delta, q0, bq, 3)[..., None])
            dk = dk + jnp.einsum("bkgqs,bqkgh->bksh", ds, qi.astype(jnp.float32))
            dq_i = jnp.einsum("bkgqs,bksh->bqkgh", ds, kj.astype(jnp.float32))
            dq = jax.lax.dynamic_update_slice_in_dim(dq, _slice_t(dq, q0, bq, 1) + dq_i, q0, axis=1)
            return dk, dv, dq

        zeros = jnp.zeros((b, k, bk, hd), jnp.float32)
        first = k0 // bq  # query blocks that hold any t >= s
        dk, dv, dq = jax.lax.fori_loop(first, nq, body, (zeros, zeros, dq))
        return dq, (dk, dv)

    dq0 = jnp.zeros(q.shape, jnp.float32)
    dq, (dk, dv) = jax.lax.scan(k_block, dq0, jnp.arange(nk))  # dk, dv: [nk, B, K, bk, hd]
    dk = jnp.moveaxis(dk, 0, 2).reshape(b, k, t, hd)
    dv = jnp.moveaxis(dv, 0, 2).reshape(b, k, t, hd)
    return dq.astype(q.dtype), dk.astype(keys.dtype), dv.astype(values.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _attention(q, keys, values, seg, bq, bk):
    return _forward(q, keys, values, seg, bq, bk)[0]


def _attention_fwd(q, keys, values, seg, bq, bk):
    out, lse = _forward(q, keys, values, seg, bq, bk)
    return out, (q, keys, values, seg, out, lse)


def _attention_bwd(bq, bk, residuals, d_out):
    q, keys, values, seg, out, lse = residuals
    dq, dk, dv = _backward(q, keys, values, seg, out, lse, d_out.astype(jnp.float32), bq, bk)
    return dq, dk, dv, None


_attention.defvjp(_attention_fwd, _attention_bwd)


def _padded(q, keys, values, segment_ids, length: int):
    """q [B, T, K, G, hd], keys / values [B, K, T, hd] and int32 segment ids [B, T] padded to
    ``length`` tokens: padding tokens are segment 0, so no query sees them, and the callers
    cut their rows off."""
    seg = segment_ids.astype(jnp.int32)
    extra = length - q.shape[1]
    if not extra:
        return q, keys, values, seg
    q = jnp.pad(q, ((0, 0), (0, extra), (0, 0), (0, 0), (0, 0)))
    keys = jnp.pad(keys, ((0, 0), (0, 0), (0, extra), (0, 0)))
    values = jnp.pad(values, ((0, 0), (0, 0), (0, extra), (0, 0)))
    return q, keys, values, jnp.pad(seg, ((0, 0), (0, extra)))


def attend_blockwise(
    q: jax.Array, keys: jax.Array, values: jax.Array, segment_ids: jax.Array, block: int = BLOCK
) -> jax.Array:
    """``transformer.attend`` for the no-cache (training) pass, tile by tile.

    Args:
      q: [B, T, K, G, hd] queries, already scaled by hd**-0.5.
      keys, values: [B, K, T, hd].
      segment_ids: [B, T] int, 0 = padding (the mask: causal within a nonzero segment).

    Returns:
      [B, T, K, G, hd] in ``values``' dtype.
    """
    t = q.shape[1]
    size, padded = tiling(t, block)
    q, keys, values, seg = _padded(q, keys, values, segment_ids, padded)
    out = _attention(q, keys, values, seg, size, size)  # [B, K, G, T', hd] float32
    return out[:, :, :, :t].transpose(0, 3, 1, 2, 4).astype(values.dtype)


@functools.lru_cache(maxsize=32)
def _splash_kernel(padded: int, g: int, size: int, interpret: bool):
    """The splash kernel for one shape, built once: its block-sparse mask is computed on the
    host, which every layer of every trace would otherwise repeat."""
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_kernel as splash,
        splash_attention_mask as masks,
    )

    sizes = splash.BlockSizes(
        block_q=size,
        block_kv=size,
        block_kv_compute=size,
        block_q_dkv=size,
        block_kv_dkv=size,
        block_kv_dkv_compute=size,
        block_q_dq=size,
        block_kv_dq=size,
    )
    mask = masks.MultiHeadMask([masks.CausalMask((padded, padded))] * g)
    # Built while a caller traces, its mask arrays must be constants, not that trace's values.
    with jax.ensure_compile_time_eval():
        return splash.make_splash_mqa_single_device(mask, block_sizes=sizes, interpret=interpret)


def attend_splash(
    q: jax.Array,
    keys: jax.Array,
    values: jax.Array,
    segment_ids: jax.Array,
    block: int = BLOCK,
    interpret: bool = False,
) -> jax.Array:
    """``attend_blockwise`` through the Pallas TPU splash-attention kernel (JAX's
    ``splash_attention``: flash attention with block-sparse masks, Mosaic on TPU), one
    (row, KV head) at a time as multi-query attention over the head's G query heads, the
    mask causal within equal segment ids. Same arguments and result; ``interpret`` runs the
    kernel in the Pallas interpreter (any backend: how it is tested on CPU). Padding queries
    (segment 0) attend to padding keys here instead of to none; no caller reads them, and
    real queries never see a segment-0 key."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash

    b, t, k, g, hd = q.shape
    size, padded = tiling(t, max(block, _LANES))  # its tiles are whole 128-lane vectors
    q, keys, values, seg = _padded(q, keys, values, segment_ids, padded)
    kernel = _splash_kernel(padded, g, size, interpret)

    def head(qh, kh, vh, sh):  # [G, T, hd], [T, hd], [T, hd], [T]
        return kernel(qh, kh, vh, segment_ids=splash.SegmentIds(q=sh, kv=sh))

    qh = q.transpose(0, 2, 3, 1, 4)  # [B, K, G, T, hd]
    per_row = jax.vmap(head, in_axes=(0, 0, 0, None))  # over KV heads
    out = jax.vmap(per_row)(qh, keys, values, seg)  # [B, K, G, T, hd]
    return out[:, :, :, :t].transpose(0, 3, 1, 2, 4).astype(values.dtype)


def attend_cudnn(
    q: jax.Array,
    keys: jax.Array,
    values: jax.Array,
    segment_ids: jax.Array,
    implementation: str = "cudnn",
):
    """``attend_blockwise`` through cuDNN's fused flash attention
    (``jax.nn.dot_product_attention(..., implementation="cudnn")``; FlashAttention-2,
    arXiv 2307.08691, as NVIDIA's cuDNN implements it): no [T, T] scores or probabilities
    are kept, the backward pass recomputes them. Same arguments and result.

    The public API masks causally and by sequence lengths, not by packed segments, so the
    segment mask goes in as its ``mask`` (turned into an additive bias [B, 1, T, T] in the
    compute dtype: 32 MiB a 4,096-token bf16 row, 2 GiB a 32,768-token one). Under a mesh
    ``attend_segments`` runs it per device. GPU only: XLA's
    CPU and TPU backends have no cuDNN; ``implementation="xla"`` runs the same call through
    XLA's plain attention (how its arguments are checked on CPU)."""
    b, t, k, g, hd = q.shape
    seg = segment_ids.astype(jnp.int32)
    same = (seg[:, :, None] == seg[:, None, :]) & (seg[:, None, :] != 0)
    out = jax.nn.dot_product_attention(
        q.reshape(b, t, k * g, hd),  # query head k * G + g reads KV head k, as ``attend``
        keys.transpose(0, 2, 1, 3).astype(q.dtype),  # [B, T, K, hd]
        values.transpose(0, 2, 1, 3).astype(q.dtype),
        mask=same[:, None],
        scale=1.0,  # the queries arrive scaled by hd**-0.5
        is_causal=True,
        implementation=implementation,
    )
    return out.reshape(b, t, k, g, hd).astype(values.dtype)


# "auto" picks by the platform the program is compiled for (``kernel_for``).
KERNELS = ("blockwise", "splash", "cudnn", "auto")


def kernel_for(kernel: str, platform: str) -> str:
    """The kernel ``kernel`` names on ``platform`` (a device's ``platform``: "cpu", "tpu",
    "gpu" or "cuda"): "auto" is cuDNN on an NVIDIA GPU, splash on TPU, the pure-JAX tiles
    elsewhere; any other name is itself."""
    if kernel != "auto":
        return kernel
    return {"tpu": "splash", "gpu": "cudnn", "cuda": "cudnn"}.get(platform, "blockwise")


def row_axes(sharding) -> tuple[str, ...]:
    """The mesh axes a sharding of [B, ...] splits the rows (dimension 0) over."""
    spec = sharding.spec[0] if len(sharding.spec) else None
    return () if spec is None else (spec,) if isinstance(spec, str) else tuple(spec)


def row_shards(sharding) -> int:
    """How many ways ``sharding`` (of [B, ...]) splits the rows."""
    n = 1
    for a in row_axes(sharding):
        n *= sharding.mesh.shape[a]
    return n


def platform_of(sharding) -> str:
    """The platform a program runs on: of a ``NamedSharding``'s mesh devices (the target of
    an ahead-of-time compile), else JAX's default backend."""
    if isinstance(sharding, NamedSharding):
        return sharding.mesh.devices.flat[0].platform
    return jax.default_backend()


def attend_segments(q: jax.Array, keys: jax.Array, values: jax.Array, mask: Segments):
    """The no-cache pass's attention over long rows with ``mask.kernel``: the pure-JAX tiles
    (every backend) or the Pallas splash kernel (TPU; the interpreter elsewhere). Under a
    mesh (``mask.sharding``) either kernel runs per device on its own rows and KV heads
    (``jax.shard_map``). "auto" picks by the platform of the mesh's
    devices (the target of an ahead-of-time compile), else of JAX's default backend."""
    sharding = mask.sharding
    platform = platform_of(sharding)
    kernel = kernel_for(mask.kernel, platform)
    if kernel == "blockwise":
        return attend_blockwise(q, keys, values, mask.ids)
    if kernel == "cudnn":
        fn = attend_cudnn
    else:
        interpret = platform != "tpu"
        fn = functools.partial(attend_splash, interpret=interpret)
    # Per device: a Pallas call is not partitioned by XLA, and JAX's rule for cuDNN's
    # attention wants queries, keys and values split alike, which grouped heads are not.
    return _per_device(fn, sharding, q, keys, values, mask.ids)


def _per_device(fn, sharding, q, keys, values, rows_arg):
    """``fn(q, keys, values, rows_arg)`` run per device under ``sharding``'s mesh: rows over
    the rows' axes, (KV) heads over 'tensor' where they divide; as is without a mesh."""
    if not isinstance(sharding, NamedSharding) or sharding.mesh.size == 1:
        return fn(q, keys, values, rows_arg)
    mesh = sharding.mesh
    axes = row_axes(sharding)
    rows = axes if axes and q.shape[0] % row_shards(sharding) == 0 else None
    tensor = mesh.shape.get("tensor", 1)
    heads = "tensor" if tensor > 1 and q.shape[2] % tensor == 0 else None
    fn = jax.shard_map(
        fn,
        mesh=mesh,
        in_specs=(P(rows, None, heads), P(rows, heads), P(rows, heads), P(rows)),
        out_specs=P(rows, None, heads),
        check_vma=False,
    )
    return fn(q, keys, values, rows_arg)


@struct.dataclass
class CachedQueries:
    """The attention mask of a chunk written into a KV cache (a prefill) when it runs through a
    fused kernel: query t of row b sees the cache slots ``0 .. slots[b, t]`` (``cache.
    write_slots``' query slots) of the first ``width`` slots, instead of a [B, T, width]
    boolean mask. Static: ``kernel`` (``prefill_kernel``'s "cudnn"), ``sharding`` (of the
    rows [B, ...], whose mesh the kernel runs per device on; None: one device)."""

    slots: jax.Array
    width: int = struct.field(pytree_node=False, default=0)
    kernel: str = struct.field(pytree_node=False, default="cudnn")
    sharding: Any = struct.field(pytree_node=False, default=None)


def prefill_kernel(kernel: str, platform: str, dtype) -> str:
    """The kernel a cached chunk of several tokens (a prefill) attends with: "cudnn" when
    ``kernel`` names it (or "auto" on an NVIDIA GPU with 16-bit activations, cuDNN's flash
    attention takes no float32), else "plain" (``transformer.attend_cache``). The splash
    kernel has no cache form; the blockwise tiles are for the no-cache pass."""
    if kernel == "cudnn":
        return "cudnn"
    if kernel_for(kernel, platform) == "cudnn" and jnp.dtype(dtype).itemsize == 2:
        return "cudnn"
    return "plain"


def attend_cache_cudnn(q, keys, values, slots, implementation: str = "cudnn"):
    """``transformer.attend_cache`` through cuDNN's flash attention
    (``jax.nn.dot_product_attention(implementation="cudnn")``): no [B, H, T, S] float32
    scores or probabilities in memory. The keys and values are the cache's own, as written
    for this layer (the write is unchanged); query t of row b sees slots ``<= slots[b, t]``,
    which goes in as the API's ``mask`` (an additive bias [B, 1, T, S] in the compute dtype,
    H times smaller than the scores): the chunk's causal mask is offset by each row's own
    cache length, which the API's ``is_causal`` (aligned at slot 0) cannot say.

    Args:
      q: [B, T, K, G, hd] queries, already scaled by hd**-0.5.
      keys: [B, K, hd, S] and values [B, K, S, hd]: the cache layout (``KVCache``).
      slots: [B, T] int, the last slot each query sees.
      implementation: "xla" runs the same call through XLA's plain attention (any backend:
        how its arguments are checked on CPU).

    Returns:
      [B, T, K, G, hd] in ``values``' dtype.
    """
    b, t, k, g, hd = q.shape
    s = values.shape[2]
    mask = jnp.arange(s)[None, None, :] <= slots[:, :, None]  # [B, T, S]
    out = jax.nn.dot_product_attention(
        q.reshape(b, t, k * g, hd),  # query head k * G + g reads KV head k, as ``attend``
        keys.transpose(0, 3, 1, 2).astype(q.dtype),  # [B, S, K, hd]
        values.transpose(0, 2, 1, 3).astype(q.dtype),
        mask=mask[:, None],
        scale=1.0,  # the queries arrive scaled by hd**-0.5
        implementation=implementation,
    )
    return out.reshape(b, t, k, g, hd).astype(values.dtype)


def attend_cached(q, keys, values, mask: CachedQueries):
    """``attend_cache_cudnn`` over the cache layout, per device under a mesh
    (``mask.sharding``): rows over the rows' axes, KV heads over 'tensor' where they divide,
    as ``attend_segments`` runs the no-cache kernels (JAX's partitioning rule for cuDNN's
    attention wants queries, keys and values split alike, which grouped heads are not)."""
    keys, values = keys[..., : mask.width], values[..., : mask.width, :]
    return _per_device(attend_cache_cudnn, mask.sharding, q, keys, values, mask.slots)
