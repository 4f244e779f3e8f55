"""Pure functions over ``(graphdef, params)``: the model's public interface.

``params`` is a plain nested dict of arrays (``nnx.to_pure_dict``), so optax, orbax and
``jax.tree`` work on it directly; ``graphdef`` is static (hashable) and carries the config.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
from flax import nnx, struct

from jaxagent.models.cache import KVCache
from jaxagent.models.config import ModelConfig
from jaxagent.models.transformer import Transformer

Params = dict[str, Any]


@struct.dataclass
class ModelOutput:
    """logits [B, T, V] float32; values [B, T] float32 or None; cache (KVCache or None)."""

    logits: jax.Array
    values: Optional[jax.Array]
    cache: Optional[KVCache]


def init_model(
    config: ModelConfig, key: jax.Array, shardings: Any = None
) -> tuple[nnx.GraphDef, Params]:
    """Randomly initialised model: (graphdef, params as a nested dict of arrays).

    ``shardings`` (a pytree of ``jax.sharding.Sharding`` shaped like the params, e.g. a device
    layout's): every parameter is created in its shards, never whole on one device."""
    if not isinstance(config, ModelConfig):
        raise TypeError(f"init_model: config must be a ModelConfig, got {type(config).__name__}")

    def make(key):
        return nnx.to_pure_dict(nnx.state(Transformer(config, nnx.Rngs(params=key))))

    graphdef = abstract_graphdef(config)
    return graphdef, jax.jit(make, out_shardings=shardings)(key)


def abstract_params(config: ModelConfig) -> Params:
    """The parameters' shapes and dtypes (``jax.ShapeDtypeStruct``), allocating nothing."""
    return nnx.to_pure_dict(nnx.state(nnx.eval_shape(lambda: Transformer(config, nnx.Rngs(0)))))


def abstract_graphdef(config: ModelConfig) -> nnx.GraphDef:
    """The graphdef alone, without allocating parameters."""
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: Transformer(config, nnx.Rngs(params=0))))
    return graphdef


def model_config(graphdef: nnx.GraphDef) -> ModelConfig:
    """The ModelConfig a graphdef was built from (the root module's static ``config``)."""
    for name, attr in graphdef.attributes:
        if name == "config" and isinstance(getattr(attr, "value", None), ModelConfig):
            return attr.value
    raise ValueError("model_config: graphdef was not built by jaxagent.models (no config found)")


def apply_model(
    graphdef: nnx.GraphDef,
    params: Params,
    tokens: jax.Array,
    positions: jax.Array,
    segment_ids: jax.Array,
    cache: Optional[KVCache] = None,
) -> ModelOutput:
    """Forward pass.

    Args:
      graphdef, params: from ``init_model`` / ``load_hf``.
      tokens: [B, T] int32 token ids.
      positions: [B, T] int32 rotary positions (restart at 0 for each packed sequence; for a
        cached call, the position of each new token in its row).
      segment_ids: [B, T] int32; 0 marks padding, equal nonzero ids attend to each other.
        With a cache, only ``!= 0`` matters: real tokens are appended to their row.
      cache: optional KVCache; the chunk's real tokens are appended at each row's length.

    Returns:
      ModelOutput(logits [B, T, V] float32, values [B, T] float32 or None, cache).
    """
    model = nnx.merge(graphdef, params)
    h, new_cache = model.hidden(tokens, positions, segment_ids, cache)
    return ModelOutput(logits=model.logits(h), values=model.values(h), cache=new_cache)


def token_logprobs(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    """log p(tokens[t] | tokens[<t]) aligned with tokens.

    Args:
      logits: [B, T, V] logits where logits[:, t] predicts tokens[:, t + 1].
      tokens: [B, T] int token ids.

    Returns:
      [B, T] float32; entry 0 is 0 (no prediction for the first token).
    """
    logits = logits[:, :-1].astype(jnp.float32)
    targets = tokens[:, 1:]
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    lp = picked - jax.nn.logsumexp(logits, axis=-1)
    return jnp.pad(lp, ((0, 0), (1, 0)))


def token_logprobs_and_entropy(logits: jax.Array, tokens: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``token_logprobs`` and the entropy of each predicting distribution, aligned the same way.

    Args:
      logits: [B, T, V] logits where logits[:, t] predicts tokens[:, t + 1].
      tokens: [B, T] int token ids.

    Returns:
      (logprobs [B, T], entropy [B, T]) float32; entry 0 is 0 for both.
    """
    logp_all = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)  # [B, T-1, V]
    entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
    return token_logprobs(logits, tokens), jnp.pad(entropy, ((0, 0), (1, 0)))


def token_values(values: jax.Array) -> jax.Array:
    """Critic values aligned with tokens like ``token_logprobs``: entry t is V(tokens[<t]).

    Args:
      values: [B, T] the value head's output, where values[:, t] is V(tokens[:t + 1]).

    Returns:
      [B, T] float32; entry 0 is 0 (no state before the first token).
    """
    v = values.astype(jnp.float32)
    return jnp.concatenate([jnp.zeros_like(v[:, :1]), v[:, :-1]], axis=1)


# The stacked blocks of a ``scan_layers`` model (``Transformer.blocks``).
STACKED_BLOCKS = "blocks"


def stack_layers(params: Params, num_layers: int) -> Params:
    """Unrolled params (``layer_0 .. layer_{L-1}``) as a ``scan_layers`` model's: the blocks'
    leaves stacked along a leading axis under ``blocks``; other entries are kept."""
    layers = [params[f"layer_{i}"] for i in range(num_layers)]
    out = {k: v for k, v in params.items() if not _is_layer_key(k)}
    out[STACKED_BLOCKS] = jax.tree.map(lambda *xs: jnp.stack(xs), *layers)
    return out


def unstack_layers(params: Params) -> Params:
    """The inverse of ``stack_layers``: a ``scan_layers`` model's params as unrolled ones."""
    blocks = params[STACKED_BLOCKS]
    n = jax.tree.leaves(blocks)[0].shape[0]
    out = {k: v for k, v in params.items() if k != STACKED_BLOCKS}
    for i in range(n):
        out[f"layer_{i}"] = jax.tree.map(lambda x, i=i: x[i], blocks)
    return out


def _is_layer_key(key) -> bool:
    return isinstance(key, str) and key.startswith("layer_") and key[6:].isdigit()


def layer_of(name: str) -> Optional[str]:
    """The transformer block a parameter belongs to, from its path name: ``'layer_3'`` for
    ``'layer_3/attn/q_proj'``, ``'blocks'`` (every layer, stacked) for a ``scan_layers``
    model's ``'blocks/attn/q_proj'``, None outside the blocks (embedding, final norm, heads).
    Code that treats the blocks apart (LoRA's per-block merge, the fused optimiser's
    per-block step) asks this instead of knowing the model's names."""
    top = name.split("/", 1)[0]
    return top if _is_layer_key(top) or top == STACKED_BLOCKS else None


def layer_index(block: str) -> int:
    """The position of an unrolled block (``'layer_3'`` -> 3)."""
    if not _is_layer_key(block):
        raise ValueError(f"layer_index: {block!r} is not an unrolled block (layer_<i>)")
    return int(block[6:])


def stacked_layer_axes(name: str) -> int:
    """Leading axes of a parameter that index layers: 1 for the stacked blocks of a
    ``scan_layers`` model (``[L, ...]``), 0 otherwise."""
    return 1 if layer_of(name) == STACKED_BLOCKS else 0


def param_logical_axes(graphdef: nnx.GraphDef, params: Params) -> Params:
    """A nested dict like ``params`` whose leaves are tuples of logical axis names.

    Names: 'vocab', 'embed', 'heads', 'kv_heads', 'mlp', or None (replicated dimension).
    Tuples are pytrees, so map over both with ``is_leaf=lambda x: isinstance(x, tuple)``.
    """
    model = nnx.merge(graphdef, params)
    out: Params = {}
    for path, var in nnx.to_flat_state(nnx.state(model)):
        meta = var.get_metadata()  # params may be abstract (ShapeDtypeStruct): no var[...]
        axes = tuple(meta["logical_axes"] if "logical_axes" in meta else (None,) * len(var.shape))
        node = out
        for key in path[:-1]:
            node = node.setdefault(str(key), {})
        node[str(path[-1])] = axes
    return out
