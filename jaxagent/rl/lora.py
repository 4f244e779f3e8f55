"""LoRA adapters on any parameter pytree: only the adapters are trained and held by the optimiser.

An adapter for a kernel ``W`` of shape ``in_shape + out_shape`` is a pair ``a [prod(in), r]``,
``b [r, prod(out)]`` with ``b = 0`` at start, so the adapted model equals the base model before
the first update. The effective kernel is ``W + (alpha / r) * (a @ b).reshape(W.shape)``, computed in float32
and rounded once to W's dtype; the adapters are float32 by default over any base. Leaves that
must train in full while the base is frozen (a critic's value head) ride along as
``{"full": leaf}`` entries that replace the base's leaf in the merge.
Which leading axes are "input" is looked up by kernel name (``o_proj`` of jaxagent's attention
is ``[heads, head_dim, embed]``: two input axes); everything else has one input axis. The
stacked blocks of a ``scan_layers`` model (``[L, ...]`` kernels, ``jaxagent.models.api.
stacked_layer_axes``) get adapters stacked the same way, ``a [L, in, r]``, ``b [L, r, out]``:
layer l's pair is the unrolled model's ``layer_l`` pair.

References: Hu et al. 2021, LoRA (2106.09685). LOOP 2502.01600 uses r = 16, alpha = 32.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from jaxagent.models.api import stacked_layer_axes

# Number of leading "input" axes of a kernel, by its name (default 1).
LORA_INPUT_AXES = {"o_proj": 2}


def path_name(path) -> str:
    """'layer_0/attn/q_proj' from a jax key path (NNX's trailing '.value' is dropped)."""
    parts = []
    for key in path:
        name = getattr(key, "key", None)
        if name is None:
            name = getattr(key, "name", None)
        if name is None:
            name = getattr(key, "idx", None)
        if name == "value" and key is path[-1]:
            continue
        parts.append(str(name))
    return "/".join(parts)


def _is_target(name: str, leaf: jax.Array, targets: tuple[str, ...]) -> bool:
    return name.split("/")[-1] in targets and getattr(leaf, "ndim", 0) >= 2


def init_lora(
    params: Any,
    rank: int,
    targets: tuple[str, ...],
    key: jax.Array,
    dtype: Any = jnp.float32,
    full: tuple[str, ...] = (),
) -> dict:
    """Adapters for every kernel whose last path component is in ``targets``, and full
    trainable copies of the leaves named in ``full``.

    Args:
      params: the base parameter pytree.
      rank: r > 0.
      targets: kernel names, e.g. ("q_proj", "v_proj").
      key: PRNG key for the ``a`` matrices (Kaiming-uniform-like scale 1 / sqrt(in)).
      dtype: the adapters' dtype (float32 by default, whatever the base's: a bfloat16
        adapter's small updates round away); None for each kernel's own dtype.
      full: leaf names (last path component) trained in full beside the adapters, e.g. the
        value head a critic trains (``VALUE_HEAD_LEAVES``); the base keeps its own copy
        unchanged.

    Returns:
      ``{path_name: {"a": [in, r], "b": [r, out]}}`` for adapted kernels (``[L, in, r]``,
      ``[L, r, out]`` for a ``scan_layers`` model's stacked kernels) and
      ``{path_name: {"full": leaf}}`` for the leaves trained in full; both in ``dtype``.

    Raises:
      ValueError if no parameter matches ``targets``.
    """
    if rank <= 0:
        raise ValueError(f"LoRA rank={rank} must be > 0")
    flat = [(path_name(p), x) for p, x in jax.tree_util.tree_flatten_with_path(params)[0]]
    leaves = [(name, x) for name, x in flat if _is_target(name, x, targets)]
    if not leaves:
        raise ValueError(
            f"LoRA targets {targets} match no kernel of the model; names end with e.g. "
            f"{sorted({name.split('/')[-1] for name, _ in flat})}"
        )
    adapters = {}
    keys = jax.random.split(key, len(leaves))
    for k, (name, w) in zip(keys, leaves):
        lead = w.shape[: stacked_layer_axes(name)]  # (L,) for stacked blocks, else ()
        shape = w.shape[len(lead) :]
        n_in = LORA_INPUT_AXES.get(name.split("/")[-1], 1)
        d_in, d_out = math.prod(shape[:n_in]), math.prod(shape[n_in:])
        bound = 1.0 / math.sqrt(d_in)
        dt = w.dtype if dtype is None else dtype
        adapters[name] = {
            "a": jax.random.uniform(k, (*lead, d_in, rank), dt, -bound, bound),
            "b": jnp.zeros((*lead, rank, d_out), dt),
        }
    for name, w in flat:
        if name.split("/")[-1] in full:
            # A copy (not the base's buffer) even in the same dtype: the state donates it.
            adapters[name] = {"full": jnp.array(w, dtype=w.dtype if dtype is None else dtype)}
    return adapters


# The value head's leaves (jaxagent.models.transformer.Transformer): trained in full beside
# the adapters when a critic is trained over a frozen base.
VALUE_HEAD_LEAVES = ("value_kernel", "value_bias")


def merge_lora(params: Any, adapters: dict, alpha: float, rank: int) -> Any:
    """Base params with ``(alpha / r) a @ b`` added to every adapted kernel, and the leaves
    trained in full (``{"full": x}`` entries) replacing the base's (differentiable in
    ``adapters``; the base gets no gradient when it is not differentiated).

    The delta and the sum are computed in float32 (a matmul at ``HIGHEST`` precision: TPUs
    and TF32 GPUs otherwise round float32 operands to fewer mantissa bits) and rounded once
    to the kernel's dtype."""
    scale = alpha / rank

    def add(path, w):
        ad = adapters.get(path_name(path))
        if ad is None:
            return w
        if "full" in ad:
            return ad["full"].astype(w.dtype)
        return _merged(w, ad["a"], ad["b"], scale)

    return jax.tree_util.tree_map_with_path(add, params)


def _merged(w, a, b, scale):
    """``w + scale * a @ b`` in float32, rounded once to w's dtype (a batched matmul over
    the stacked layers of a ``scan_layers`` kernel)."""
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    delta = jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST).reshape(w.shape) * scale
    return (w.astype(jnp.float32) + delta).astype(w.dtype)


@struct.dataclass
class LoraKernel:
    """A base kernel and its adapters travelling together as one parameter leaf, unmerged:
    a lazily merged model (``jaxagent.rl.model_fns``) puts these in place of the adapted
    kernels of its blocks, so each block's slice, unrolled or cut from the stacked blocks
    by ``scan_layers``' scan, carries its own adapters into the block, which merges them
    (``merge_kernels``) inside its rematerialisation."""

    base: Any
    a: Any
    b: Any

    def merged(self, scale: float) -> Any:
        return _merged(self.base, self.a, self.b, scale)


def with_lora_kernels(params: Any, adapters: dict) -> Any:
    """``params`` with every kernel named in ``adapters`` (``{"a", "b"}`` entries) replaced
    by a ``LoraKernel`` of the kernel and its pair."""

    def attach(path, w):
        ad = adapters.get(path_name(path))
        return w if ad is None else LoraKernel(w, ad["a"], ad["b"])

    return jax.tree_util.tree_map_with_path(attach, params)


def merge_kernels(tree: Any, scale: float, tie=None) -> Any:
    """Every ``LoraKernel`` of ``tree`` merged (``tie``: a zero scalar added to the adapters,
    a data dependence that orders the merge, see ``jaxagent.rl.model_fns``)."""

    def merge(x):
        if not isinstance(x, LoraKernel):
            return x
        if tie is not None:
            x = x.replace(a=x.a + tie.astype(x.a.dtype), b=x.b + tie.astype(x.b.dtype))
        return x.merged(scale)

    return jax.tree.map(merge, tree, is_leaf=lambda x: isinstance(x, LoraKernel))


def lora_param_count(adapters: dict) -> int:
    return sum(int(x.size) for x in jax.tree_util.tree_leaves(adapters))


@struct.dataclass
class LoraParams:
    """Base parameters and adapters, not merged: a log-prob function that accepts them (a
    ``jaxagent.rl.model_fns.LoraAwareLogprobFn``, e.g. ``model_logprob_fn``) merges each
    block's kernels inside the block's rematerialisation, so that no merged copy of the
    model is kept for the backward pass."""

    base: Any
    adapters: dict
    alpha: float = struct.field(pytree_node=False)
    rank: int = struct.field(pytree_node=False)

    def merged(self) -> Any:
        return merge_lora(self.base, self.adapters, self.alpha, self.rank)
