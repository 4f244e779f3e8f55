"""Model adapters for the update step: per-token log-probs, entropies and values.

The update step needs, for a batch of token rows, ``logp [B,T]``, ``entropy [B,T]`` and
optionally ``values [B,T]``; it never needs the full ``[B, T, V]`` logits at once. Two
adapters:

- ``logits_logprob_fn(apply_fn)``: from any ``apply_fn(params, tokens, positions,
  segment_ids) -> (logits, values)``; simple, holds the whole logits tensor.
- ``model_logprob_fn(graphdef, remat=True, head_chunk=32)``: for jaxagent models, memory-lean:
  each transformer block is rematerialised in the backward pass (only its input is kept),
  and the vocabulary head runs over chunks of ``head_chunk`` positions under
  ``jax.checkpoint``, so at most one chunk of logits is alive. This is what lets an update
  of LOOP hold about one model's worth of memory (params + grads + Adam) and little more.

The lean path calls ``Transformer.hidden(..., remat=True)`` and chunks only the vocabulary head
(a parity test checks it against ``apply_model``).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
from flax import nnx

from jaxagent.rl.losses import token_logprobs_and_entropy

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
                     skip_unmasked_chunks: bool = False) -> LogprobFn:
    """Memory-lean ``logprob_fn(params, tokens, positions, segment_ids) -> (logp, entropy,
    values)`` for a jaxagent model (see module docstring).

    Args:
      graphdef: from ``jaxagent.models.init_model`` / ``load_hf``.
      remat: recompute each block in the backward pass instead of storing its activations.
      head_chunk: positions per vocabulary-head chunk (T - 1 is padded up to a multiple).

      skip_unmasked_chunks: with a ``loss_mask`` given, skip at run time (``lax.cond``) the
        head chunks that hold no loss token in any row (prompts, observations); their log-probs
        and entropies come back as 0. Saves compute (the rl_step benchmark: prompts are half of
        each row) but, measured with XLA's memory analysis on the 768 x 12 model, the cond
        costs about 0.8 GiB of extra temporaries in the backward pass, so it is off by default.

    The returned function takes an optional ``loss_mask`` [B, T] (the update step passes it).
    """
    def logprob_fn(params, tokens, positions, segment_ids, loss_mask=None):
        model = nnx.merge(graphdef, params)
        b, t = tokens.shape
        h, _ = model.hidden(tokens, positions, segment_ids, remat=remat)
        values = model.values(h)
        # Position t predicts token t + 1: chunk the T - 1 predictions, padded to the chunk.
        n = t - 1
        c = max(1, min(head_chunk, n))
        pad = (-n) % c
        h_pred = jnp.pad(h[:, :-1], ((0, 0), (0, pad), (0, 0)))
        targets = jnp.pad(tokens[:, 1:], ((0, 0), (0, pad)))
        hs = h_pred.reshape(b, -1, c, h.shape[-1]).swapaxes(0, 1)  # [n_chunks, B, C, D]
        ts = targets.reshape(b, -1, c).swapaxes(0, 1)  # [n_chunks, B, C]
        if loss_mask is None or not skip_unmasked_chunks:
            needed = jnp.ones((ts.shape[0],), bool)
        else:  # chunks without a loss token (prompt, observations) skip the vocabulary head
            m = jnp.pad(loss_mask[:, 1:], ((0, 0), (0, pad))).reshape(b, -1, c)
            needed = jnp.any(m > 0, axis=(0, 2))  # [n_chunks]
        # Only the head weight enters the chunked computation (mirrors Transformer.logits).
        tied = model.config.tie_embeddings
        w = model.embed[...] if tied else model.lm_head[...]

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

        if loss_mask is None or not skip_unmasked_chunks:
            lp, ent = jax.lax.map(lambda xs: chunk_fn(w, *xs), (hs, ts))
        else:
            lp, ent = jax.lax.map(one, (hs, ts, needed))
        lp = lp.swapaxes(0, 1).reshape(b, -1)[:, :n]
        ent = ent.swapaxes(0, 1).reshape(b, -1)[:, :n]
        zero = jnp.zeros((b, 1), jnp.float32)
        return (jnp.concatenate([zero, lp], axis=1), jnp.concatenate([zero, ent], axis=1), values)

    return logprob_fn
