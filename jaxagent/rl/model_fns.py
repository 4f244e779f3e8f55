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
  little more (``benchmarks/update_memory.py``).

The lean path calls ``Transformer.hidden(..., remat=checkpoint_in_backward)``; parity tests
check it against ``apply_model``.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
from flax import nnx

from jaxagent.rl.losses import token_logprobs_and_entropy
from jaxagent.rl.vocab_head import checkpoint_in_backward, vocab_chunked_logprobs

LogprobFn = Callable[..., tuple[jax.Array, jax.Array, Optional[jax.Array]]]


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

    def logprob_fn(params, tokens, positions, segment_ids, loss_mask=None):
        del loss_mask  # the full logits are computed anyway
        logits, values = apply_fn(params, tokens, positions, segment_ids)
        logp, entropy = token_logprobs_and_entropy(logits, tokens)
        return logp, entropy, values

    return logprob_fn


def _head_chunk_stats(logits_fn, h_chunk, next_tokens):
    """log p and entropy of ``next_tokens`` [B, C] under ``logits_fn(h_chunk [B, C, D])``."""
    logp_all = jax.nn.log_softmax(logits_fn(h_chunk).astype(jnp.float32), axis=-1)
    lp = jnp.take_along_axis(logp_all, next_tokens[..., None], axis=-1)[..., 0]
    ent = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
    return lp, ent


def model_logprob_fn(graphdef: Any, *, remat: bool = True, head_chunk: int = 32,
                     skip_unmasked_chunks: bool = False, vocab_chunk: int = 4096) -> LogprobFn:
    """Memory-lean ``logprob_fn(params, tokens, positions, segment_ids) -> (logp, entropy,
    values)`` for a jaxagent model (see module docstring).

    Args:
      graphdef: from ``jaxagent.models.init_model`` / ``load_hf``.
      remat: recompute each block in the backward pass instead of storing its activations
        (``checkpoint_in_backward``: the recomputation is ordered after the cotangent).
      head_chunk: positions per head chunk, used only with ``skip_unmasked_chunks``.
      skip_unmasked_chunks: with a ``loss_mask`` given, chunk the head over positions and
        skip at run time (``lax.cond``) the chunks that hold no loss token in any row
        (prompts, observations); their log-probs and entropies come back as 0. Saves compute
        (the rl_step benchmark: prompts are half of each row) but keeps a whole head-gradient
        accumulator per chunk, so it is off by default.
      vocab_chunk: otherwise the head runs over all positions at once, over chunks of this
        many vocabulary entries (``vocab_chunked_logprobs``: no [T, V] logits, the head's
        gradient written in place).

    The returned function takes an optional ``loss_mask`` [B, T] (the update step passes it).
    """
    def logprob_fn(params, tokens, positions, segment_ids, loss_mask=None):
        model = nnx.merge(graphdef, params)
        b, t = tokens.shape
        wrap = checkpoint_in_backward if remat else False
        h, _ = model.hidden(tokens, positions, segment_ids, remat=wrap)
        values = model.values(h)
        # Only the head weight enters the head computation (mirrors Transformer.logits).
        tied = model.config.tie_embeddings
        w = model.embed[...] if tied else model.lm_head[...]
        if loss_mask is None or not skip_unmasked_chunks:
            # Position t predicts token t + 1.
            lp, ent = vocab_chunked_logprobs(h[:, :-1].reshape(b * (t - 1), -1), w,
                                             tokens[:, 1:].reshape(-1), vocab_chunk, tied)
            lp, ent = lp.reshape(b, t - 1), ent.reshape(b, t - 1)
        else:
            lp, ent = _skipping_position_chunks(h, w, tokens, loss_mask, head_chunk, tied, remat)
        zero = jnp.zeros((b, 1), jnp.float32)
        return (jnp.concatenate([zero, lp], axis=1), jnp.concatenate([zero, ent], axis=1), values)

    return logprob_fn


def _skipping_position_chunks(h, w, tokens, loss_mask, head_chunk, tied, remat):
    """(logp, entropy) [B, T - 1] over chunks of ``head_chunk`` positions; chunks without a
    loss token in any row skip the vocabulary head (``lax.cond``) and give 0."""
    b, t = tokens.shape
    n = t - 1
    c = max(1, min(head_chunk, n))
    pad = (-n) % c
    h_pred = jnp.pad(h[:, :-1], ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(tokens[:, 1:], ((0, 0), (0, pad)))
    hs = h_pred.reshape(b, -1, c, h.shape[-1]).swapaxes(0, 1)  # [n_chunks, B, C, D]
    ts = targets.reshape(b, -1, c).swapaxes(0, 1)  # [n_chunks, B, C]
    m = jnp.pad(loss_mask[:, 1:], ((0, 0), (0, pad))).reshape(b, -1, c)
    needed = jnp.any(m > 0, axis=(0, 2))  # [n_chunks]

    def chunk(w, hc, tc):
        eq = "bcd,vd->bcv" if tied else "bcd,dv->bcv"
        logits_fn = lambda x: jnp.einsum(eq, x, w.astype(x.dtype),
                                         preferred_element_type=jnp.float32)
        return _head_chunk_stats(logits_fn, hc, tc)

    chunk_fn = jax.checkpoint(chunk) if remat else chunk

    def one(xs):
        hc, tc, need = xs
        zeros = jnp.zeros(tc.shape, jnp.float32)
        return jax.lax.cond(need, lambda: chunk_fn(w, hc, tc), lambda: (zeros, zeros))

    lp, ent = jax.lax.map(one, (hs, ts, needed))
    lp = lp.swapaxes(0, 1).reshape(b, -1)[:, :n]
    ent = ent.swapaxes(0, 1).reshape(b, -1)[:, :n]
    return lp, ent
