"""Model adapters for the update step: per-token log-probs, entropies and values.

The update step needs, for a batch of token rows, ``logp [B,T]``, ``entropy [B,T]`` and
optionally ``values [B,T]``; it never needs the full ``[B, T, V]`` logits at once. Two
adapters:

- ``logits_logprob_fn(apply_fn)``: from any ``apply_fn(params, tokens, positions,
  segment_ids) -> (logits, values)``; simple, holds the whole logits tensor.
- ``model_logprob_fn(graphdef, remat=True)``: for jaxagent models, memory-lean: each
  transformer block is rematerialised in the backward pass (only its input is kept; the
  recomputation waits for the block's cotangent, see ``jaxagent.rl.vocab_head``), and the
  vocabulary head runs over vocabulary chunks with an online log-sum-exp and a hand-written
  backward pass, so neither the [T, V] logits nor their gradient ever exist. This is what
  lets a LOOP update hold about one model's worth of memory (params + grads + Adam) and
  little more (``benchmarks/update_memory.py``). Under LoRA it takes ``LoraParams`` (base and
  adapters unmerged) and merges each block's kernels inside the block's rematerialisation,
  so no merged copy of the model is kept for the backward pass.

The lean path calls ``Transformer.hidden(..., remat=checkpoint_in_backward)``; parity tests
check it against ``apply_model``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

from jaxagent.models.api import layer_of
from jaxagent.rl.lora import LoraParams, merge_kernels, merge_lora, with_lora_kernels
from jaxagent.models import token_logprobs_and_entropy, token_values
from jaxagent.models.blockwise import row_axes, row_shards
from jaxagent.rl.vocab_head import checkpoint_in_backward, chunked_head_logprobs

LogprobFn = Callable[..., tuple[jax.Array, jax.Array, Optional[jax.Array]]]


@dataclasses.dataclass(frozen=True)
class LoraAwareLogprobFn:
    """A ``LogprobFn`` that takes ``LoraParams`` (base and adapters unmerged) and merges the
    adapters itself, inside each rematerialised block; the update step hands such a function
    the unmerged parameters instead of merging a full model copy first."""

    fn: LogprobFn
    # whether ``fn`` takes ``block_wrap`` (the fused optimiser's block hook): the model's own
    # rematerialised function does (``model_logprob_fn(remat=True)``)
    block_wrap: bool = False

    def __call__(self, params, tokens, positions, segment_ids, *args, **kwargs):
        return self.fn(params, tokens, positions, segment_ids, *args, **kwargs)


def model_apply_fn(graphdef: Any) -> Callable:
    """``apply_fn(params, tokens, positions, segment_ids) -> (logits, values)`` for a jaxagent
    model (``jaxagent.models.apply_model``)."""
    from jaxagent.models import apply_model

    def apply_fn(params, tokens, positions, segment_ids):
        out = apply_model(graphdef, params, tokens, positions, segment_ids)
        return out.logits, out.values

    return apply_fn


def logits_logprob_fn(apply_fn: Callable) -> LogprobFn:
    """Adapt an ``apply_fn`` returning logits into ``(logp, entropy, values)``."""

    def logprob_fn(params, tokens, positions, segment_ids, loss_mask=None, constraint=None):
        del loss_mask  # the full logits are computed anyway
        logits, values = apply_fn(params, tokens, positions, segment_ids)
        logp, entropy = token_logprobs_and_entropy(logits, tokens)
        if constraint is not None:
            logp = logp - _log_mass(logits.astype(jnp.float32), *constraint)
        return logp, entropy, values

    return logprob_fn


def model_logprob_fn(
    graphdef: Any,
    *,
    remat: bool = True,
    head_chunk: int = 1024,
    skip_unmasked_chunks: bool = False,
    vocab_chunk: int = 4096,
    activation_sharding: Any = None,
) -> LogprobFn:
    """Memory-lean ``logprob_fn(params, tokens, positions, segment_ids) -> (logp, entropy,
    values)`` for a jaxagent model (see module docstring).

    Args:
      graphdef: from ``jaxagent.models.init_model`` / ``load_hf``.
      remat: recompute each block in the backward pass instead of storing its activations
        (``checkpoint_in_backward``: the recomputation is ordered after the cotangent).
      head_chunk: predicted positions (over all rows) per block of the vocabulary head.
      skip_unmasked_chunks: with a ``loss_mask`` given, the head runs only over the
        positions that predict a loss token (blocks of them, selected at run time); the
        others' log-probs and entropies come back as 0. Saves compute when prompts or
        observations are a large part of each row (the rl_step benchmark: half).
      vocab_chunk: vocabulary entries per head chunk (``chunked_head_logprobs``: no [T, V]
        logits, the head's gradient written in place).

      activation_sharding: ``Sharding`` of the [B, T, D] residual stream under a mesh
        (``Transformer.hidden``): rows over the batch axes, so no device computes others' rows.

    The returned function takes an optional ``loss_mask`` [B, T] (the update step passes it)
    and an optional ``constraint`` = ``(constraint_ids, constraint_masks)`` of a batch
    sampled under constrained decoding (``TokenBatch``): the log-probs are then those of the
    masked distributions the sampler drew from (``constrained_log_mass``).
    """

    def logprob_fn(
        params,
        tokens,
        positions,
        segment_ids,
        loss_mask=None,
        block_wrap=None,
        constraint=None,
    ):
        wrap = checkpoint_in_backward if remat else False
        if isinstance(params, LoraParams):
            if block_wrap is not None:
                raise ValueError("block_wrap (the fused optimiser) takes full params, not LoRA")
            params, wrap = _lazy_lora(params) if remat else (params.merged(), False)
        if block_wrap is not None:  # jaxagent.rl.fused_step: each block's own backward
            wrap = block_wrap
        model = nnx.merge(graphdef, params)
        b, t = tokens.shape
        h, _ = model.hidden(
            tokens, positions, segment_ids, remat=wrap, activation_sharding=activation_sharding
        )
        values = model.values(h)
        # Only the head weight enters the head computation (mirrors Transformer.logits).
        tied = model.config.tie_embeddings
        w = model.embed[...] if tied else model.lm_head[...]
        rows = None
        if loss_mask is not None and skip_unmasked_chunks:
            rows = loss_mask[:, 1:] > 0

        # Position t predicts token t + 1.
        def head(h, targets, rows, w):
            n, t1 = targets.shape
            lp, ent = chunked_head_logprobs(
                h.reshape(n * t1, -1),
                w,
                targets.reshape(-1),
                None if rows is None else rows.reshape(-1),
                head_chunk,
                vocab_chunk,
                tied,
            )
            return lp.reshape(n, t1), ent.reshape(n, t1)

        args = (h[:, :-1], tokens[:, 1:], rows, w)
        axes = () if activation_sharding is None else row_axes(activation_sharding)
        shards = 1 if not axes else row_shards(activation_sharding)
        if shards > 1 and b % shards == 0:
            # Under a mesh each device runs the head over its own rows only (the head's
            # row blocks slice the flattened batch: left to XLA, every device would gather
            # and compute every row); the weight is whole per device, its gradient summed.
            spec = P(activation_sharding.spec[0])
            head = jax.shard_map(
                head,
                mesh=activation_sharding.mesh,
                in_specs=(spec, spec, None if rows is None else spec, P()),
                out_specs=(spec, spec),
                axis_names=set(axes),
                check_vma=False,
            )
        lp, ent = head(*args)
        if constraint is not None:
            lp = lp - constrained_log_mass(h[:, :-1], w, tied, *constraint)[:, 1:]
        zero = jnp.zeros((b, 1), jnp.float32)
        return (
            jnp.concatenate([zero, lp], axis=1),
            jnp.concatenate([zero, ent], axis=1),
            values,
        )

    return LoraAwareLogprobFn(logprob_fn, block_wrap=bool(remat))


def _log_mass(logits, ids, masks):
    """[B, T] log of the probability mass the allowed tokens hold: for token t drawn under
    mask ``masks[b, ids[b, t]]`` (``ids`` -1: unconstrained, 0), from the logits that predict
    it (``logits[:, t - 1]``); 0 at t = 0."""
    shifted = jnp.pad(logits[:, :-1], ((0, 0), (1, 0), (0, 0)))
    return jax.lax.map(jax.checkpoint(lambda a: _row_log_mass(*a)), (shifted, ids, masks))


def _row_log_mass(z, idx, masks):
    """One row: ``z`` [T, V] logits, ``idx`` [T] mask index per token (-1: free), ``masks``
    [K, W] packed -> [T] log allowed mass (0 where free)."""
    allowed = jnp.unpackbits(masks, axis=-1, count=z.shape[-1]).astype(bool)[jnp.maximum(idx, 0)]
    full = jax.nn.logsumexp(z, axis=-1)
    kept = jax.nn.logsumexp(jnp.where(allowed, z, -jnp.inf), axis=-1)
    return jnp.where(idx >= 0, kept - full, 0.0)


def constrained_log_mass(h, w, tied: bool, ids, masks) -> jax.Array:
    """``_log_mass`` from hidden states: ``h`` [B, T', D] predicting tokens 1..T' (the head
    weight ``w``: [V, D] tied, [D, V] not), row by row with each row's logits recomputed in the
    backward pass (one [T', V] block at a time, never [B, T', V]). Returns [B, T' + 1] aligned
    with the tokens (0 at t = 0). Sampling under a grammar masks the logits before the draw
    (``jaxagent.generate.grammar``), so the learner's log-prob of such a token is its
    unmasked log-prob less this log-mass."""

    def row(args):
        hb, idx, m = args  # [T', D], [T'], [K, W]
        spec = "td,vd->tv" if tied else "td,dv->tv"
        z = jnp.einsum(spec, hb, w.astype(hb.dtype), preferred_element_type=jnp.float32)
        return _row_log_mass(z, idx, m)

    out = jax.lax.map(jax.checkpoint(row), (h, ids[:, 1:], masks))
    return jnp.pad(out, ((0, 0), (1, 0)))


@functools.partial(jax.jit, static_argnums=0)
def model_values(graphdef: Any, params: Any, tokens, positions, segment_ids) -> jax.Array:
    """The critic's values alone: ``[B, T]`` float32 aligned as ``values[:, t] =
    V(tokens[:, :t])`` (``token_values``), from the blocks and the value head only.

    The vocabulary head never runs, so no ``[B, T, V]`` logits exist (the full pass,
    ``apply_model``, builds them in float32: 19.9 GB for 8 rows of 4096 tokens over
    Qwen2.5's 152,064-entry vocabulary). Same blocks and value head as ``apply_model``, so
    the values are the full pass's up to XLA's fusion of a different program."""
    model = nnx.merge(graphdef, params)
    if not model.config.value_head:
        raise ValueError(
            "model_values: the model has no value head (build it with value_head=True)"
        )
    h, _ = model.hidden(tokens, positions, segment_ids)
    return token_values(model.values(h))


def _lazy_lora(params: LoraParams):
    """(base params, block wrapper) that merge each block's adapters inside the block's
    ``checkpoint_in_backward``: the merged kernels are recomputed in the backward pass
    instead of being kept. Adapters outside the blocks (none by default) merge eagerly.

    Each adapted kernel of the blocks travels with its adapters as one ``LoraKernel`` leaf,
    so a block receives its own adapters with its own slice of the parameters: an unrolled
    block its ``layer_<i>`` entries, a ``scan_layers`` scan step its layer of the stacked
    kernels and adapters (``jaxagent.models.api.layer_of`` says which names are blocks)."""
    in_blocks = {
        k: v for k, v in params.adapters.items() if layer_of(k) is not None and "full" not in v
    }
    eager = {k: v for k, v in params.adapters.items() if k not in in_blocks}
    base = merge_lora(params.base, eager, params.alpha, params.rank) if eager else params.base
    base = with_lora_kernels(base, in_blocks)
    scale = params.alpha / params.rank

    def wrap(block):
        # The merge depends on x through a zero term: otherwise XLA hoists it out of the
        # microbatch loop (it is loop-invariant) and keeps every merged kernel alive, and in
        # the backward pass (where x is tied to the cotangent) it would be merged with the
        # forward's copy.
        def merged_block(state, x, *consts):
            tie = jnp.ravel(x)[0] * 0
            return block(merge_kernels(state, scale, tie), x, *consts)

        return checkpoint_in_backward(merged_block)

    return base, wrap
