"""KV cache with per-row lengths.

Row ``b`` holds ``lengths[b]`` tokens in slots ``0 .. lengths[b]-1`` of every layer's buffers,
with no padding inside: a left-padded prompt is compacted when written. New tokens (a prefill
chunk, one decode token, or an environment observation of any length) are appended at each
row's own offset, so rows of one batch can sit at different positions and a multi-turn episode
never re-encodes its history.

Layout per layer: keys ``[B, K, hd, S]`` (slots minor) and values ``[B, K, S, hd]``. Both
attention products are then plain row-major batched matmuls over the cache: ``q [G, hd] @
keys [hd, S]`` and ``p [G, S] @ values [S, hd]``. (With keys stored ``[S, hd]`` the CPU
backend runs ``q . k`` as ``keys @ q^T``, a matmul of output width G = heads per KV head,
and a transpose: in isolation, one decode attention of the tiny benchmark model at batch
32 took twice as long as in this layout.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxagent.models.config import ModelConfig


@struct.dataclass
class KVCache:
    """Per-layer key/value buffers.

    Attributes:
      keys: tuple of L arrays [B, K, hd, S] (slots minor; one array a layer, so the decode
        loop updates each in place without slicing a stacked buffer), or, for a model with
        ``scan_layers``, one stacked array [L, B, K, hd, S] that the layer scan carries and
        each layer updates in place at its own index.
      values: tuple of L arrays [B, K, S, hd], or one stacked [L, B, K, S, hd].
      lengths: [B] int32 number of tokens stored per row.
    """

    keys: tuple
    values: tuple
    lengths: jax.Array

    @property
    def batch_size(self) -> int:
        return self.lengths.shape[0]

    @property
    def stacked(self) -> bool:
        """Whether the buffers are stacked along a leading layer axis (``scan_layers``)."""
        return not isinstance(self.keys, (tuple, list))

    @property
    def capacity(self) -> int:
        return (self.values if self.stacked else self.values[0]).shape[-2]


def init_cache(config: ModelConfig, batch_size: int, capacity: int, dtype=None) -> KVCache:
    """An empty cache for ``batch_size`` rows of up to ``capacity`` tokens each."""
    if batch_size <= 0 or capacity <= 0:
        raise ValueError(f"init_cache: batch_size={batch_size} and capacity={capacity} must be > 0")
    dtype = dtype or config.jnp_kv_cache_dtype
    k_shape = (batch_size, config.num_kv_heads, config.head_dim, capacity)
    v_shape = (batch_size, config.num_kv_heads, capacity, config.head_dim)
    if config.scan_layers:
        return KVCache(
            keys=jnp.zeros((config.num_layers, *k_shape), dtype),
            values=jnp.zeros((config.num_layers, *v_shape), dtype),
            lengths=jnp.zeros((batch_size,), jnp.int32),
        )
    layers = range(config.num_layers)
    return KVCache(
        keys=tuple(jnp.zeros(k_shape, dtype) for _ in layers),
        values=tuple(jnp.zeros(v_shape, dtype) for _ in layers),
        lengths=jnp.zeros((batch_size,), jnp.int32),
    )


def grow_cache(cache: KVCache, capacity: int) -> KVCache:
    """Copy ``cache`` into buffers of a larger ``capacity`` (lengths unchanged)."""
    extra = capacity - cache.capacity
    if extra < 0:
        raise ValueError(f"grow_cache: capacity={capacity} is below the current {cache.capacity}")
    if extra == 0:
        return cache
    # Slots are the last axis of keys and the second-to-last of values (stacked or not).
    lead = ((0, 0),) * (4 if cache.stacked else 3)
    k_pad, v_pad = (*lead, (0, extra)), (*lead[1:], (0, extra), (0, 0))
    return KVCache(
        keys=jax.tree.map(lambda k: jnp.pad(k, k_pad), cache.keys),
        values=jax.tree.map(lambda v: jnp.pad(v, v_pad), cache.values),
        lengths=cache.lengths,
    )


def write_slots(cache: KVCache, segment_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Where the tokens of a chunk go.

    Args:
      cache: the cache before the chunk.
      segment_ids: [B, T] int; 0 marks padding (left, right or interior).

    Returns:
      slots: [B, T] int32 slot of each token (its own position in the row for real tokens;
        ``capacity`` for padding, which scatter drops).
      query_slots: [B, T] int32 slot each query attends up to, inclusive.
    """
    valid = segment_ids != 0
    rank = jnp.cumsum(valid.astype(jnp.int32), axis=1) - 1  # [B, T]
    query_slots = cache.lengths[:, None] + rank
    slots = jnp.where(valid, query_slots, cache.capacity)
    return slots.astype(jnp.int32), query_slots.astype(jnp.int32)
