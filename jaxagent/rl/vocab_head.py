"""Memory-lean pieces of the training forward pass, with hand-written backward passes.

- ``vocab_chunked_logprobs(h, w, targets)``: log-probs of the targets and entropies of the
  next-token distributions, computed over chunks of the vocabulary with an online
  log-sum-exp, so that no ``[N, V]`` logits (nor their gradient) ever exist at once. The
  backward pass recomputes each chunk's logits and writes that chunk's slice of the head
  gradient in place: the head costs one chunk of logits and one copy of its own gradient.
- ``checkpoint_in_backward(fn)``: ``jax.checkpoint`` whose recomputation waits for the
  incoming cotangent. With plain ``jax.checkpoint`` XLA's CPU scheduler may run every
  block's recomputation early (it depends on the block input only), which keeps all blocks'
  activations alive at once and defeats rematerialisation; an optimisation barrier that ties
  the saved inputs to the cotangent fixes the order.

Both are exact: gradients equal those of the plain computation up to float reassociation
(tests compare them with ``jax.grad`` of the direct formulas).
"""

from __future__ import annotations

import math
from functools import partial
from typing import Callable

import jax
import jax.numpy as jnp


def checkpoint_in_backward(fn: Callable) -> Callable:
    """``fn(params, x, *consts)`` rematerialised in the backward pass, after its cotangent.

    Like ``jax.checkpoint(fn)`` (the forward pass saves the arguments only), but the
    recomputation is ordered after the output's cotangent exists, so each block's
    activations live only while its own backward runs. ``params`` and ``x`` receive
    cotangents; ``consts`` (e.g. rotary tables, masks) are treated as constants.
    """

    @jax.custom_vjp
    def wrapped(params, x, *consts):
        return fn(params, x, *consts)

    def fwd(params, x, *consts):
        return fn(params, x, *consts), (params, x, consts)

    def bwd(res, g):
        (params, x, consts), g = jax.lax.optimization_barrier((res, g))
        # XLA drops the barrier before common-subexpression elimination, which then merges
        # the recomputation with the forward pass (and keeps every block's activations); a
        # zero data dependence of x on the cotangent keeps the two apart.
        tie = jnp.ravel(jax.tree.leaves(g)[0])[0] * 0
        x = jax.tree.map(lambda a: a + tie.astype(a.dtype), x)
        _, vjp = jax.vjp(lambda p, y: fn(p, y, *consts), params, x)
        return tuple(vjp(g)) + (None,) * len(consts)

    wrapped.defvjp(fwd, bwd)
    return wrapped


def _chunk_plan(vocab: int, chunk: int) -> tuple[int, int]:
    """(chunk size, number of chunks); the last chunk's start is clamped to ``vocab - c``."""
    c = max(1, min(chunk, vocab))
    return c, math.ceil(vocab / c)


def _chunk_logits(h, w, i, c, vocab, tied):
    """Logits of vocabulary chunk ``i``: ([N, c] float32, column ids [c], valid [c]).

    The last chunk is clamped to end at ``vocab``; its columns already covered by chunk
    ``i - 1`` are marked invalid (masked out of every sum)."""
    start = jnp.minimum(i * c, vocab - c)
    if tied:  # w: [V, D]
        wc = jax.lax.dynamic_slice_in_dim(w, start, c, axis=0)
        z = jnp.einsum("nd,vd->nv", h, wc.astype(h.dtype), preferred_element_type=jnp.float32)
    else:  # w: [D, V]
        wc = jax.lax.dynamic_slice_in_dim(w, start, c, axis=1)
        z = jnp.einsum("nd,dv->nv", h, wc.astype(h.dtype), preferred_element_type=jnp.float32)
    cols = start + jnp.arange(c)
    return z, cols, cols >= i * c, start, wc


def _forward_stats(h, w, targets, c, n_chunks, tied):
    """Online pass: (lse [N], mean logit under p [N], target logit [N])."""
    vocab = w.shape[0] if tied else w.shape[1]
    n = h.shape[0]
    neg = jnp.float32(-jnp.inf)

    def body(carry, i):
        m, s, t, tl = carry
        z, cols, valid, _, _ = _chunk_logits(h, w, i, c, vocab, tied)
        z = jnp.where(valid[None], z, neg)
        m_new = jnp.maximum(m, jnp.max(z, axis=1))
        scale = jnp.exp(m - m_new)
        e = jnp.exp(z - m_new[:, None])
        zs = jnp.where(valid[None], z, 0.0)
        s = s * scale + jnp.sum(e, axis=1)
        t = t * scale + jnp.sum(e * zs, axis=1)
        tl = tl + jnp.sum(jnp.where(cols[None] == targets[:, None], zs, 0.0), axis=1)
        return (m_new, s, t, tl), None

    init = (jnp.full((n,), neg), jnp.zeros((n,)), jnp.zeros((n,)), jnp.zeros((n,)))
    (m, s, t, tl), _ = jax.lax.scan(body, init, jnp.arange(n_chunks))
    return m + jnp.log(s), t / s, tl


@partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def vocab_chunked_logprobs(h, w, targets, chunk: int = 4096, tied: bool = False):
    """Target log-probs and entropies of ``softmax(h @ W)`` without materialising logits.

    Args:
      h: [N, D] hidden states (one per predicted token).
      w: the head kernel, [D, V] (``tied=False``) or the embedding [V, D] (``tied=True``).
      targets: [N] int token ids to score.
      chunk: vocabulary columns per chunk (the last chunk is clamped, V need not divide).
      tied: layout of ``w`` (static).

    Returns:
      (logp [N], entropy [N]) float32: log softmax(h W)[n, targets[n]] and the entropy of
      row n's distribution.
    """
    c, k = _chunk_plan(w.shape[0] if tied else w.shape[1], chunk)
    lse, mean_z, tl = _forward_stats(h, w, targets, c, k, tied)
    return tl - lse, lse - mean_z


def _vcl_fwd(h, w, targets, chunk, tied):
    c, k = _chunk_plan(w.shape[0] if tied else w.shape[1], chunk)
    lse, mean_z, tl = _forward_stats(h, w, targets, c, k, tied)
    return (tl - lse, lse - mean_z), (h, w, targets, lse, mean_z)


def _vcl_bwd(chunk, tied, res, cts):
    """d logp_n / dz_v = 1[v = y_n] - p_nv;  d H_n / dz_v = -p_nv (z_nv - E_p[z_n])."""
    h, w, targets, lse, mean_z = res
    g_lp, g_ent = cts
    vocab = w.shape[0] if tied else w.shape[1]
    c, k = _chunk_plan(vocab, chunk)

    def body(carry, i):
        dh, dw = carry
        z, cols, valid, start, wc = _chunk_logits(h, w, i, c, vocab, tied)
        p = jnp.where(valid[None], jnp.exp(z - lse[:, None]), 0.0)
        onehot = (cols[None] == targets[:, None]) & valid[None]
        dz = (g_lp[:, None] * (onehot.astype(jnp.float32) - p)
              - g_ent[:, None] * p * (z - mean_z[:, None]))
        dzh = dz.astype(h.dtype)
        if tied:
            dh = dh + jnp.einsum("nv,vd->nd", dzh, wc.astype(h.dtype),
                                 preferred_element_type=jnp.float32)
            g_wc = jnp.einsum("nv,nd->vd", dzh, h, preferred_element_type=jnp.float32)
            prev = jax.lax.dynamic_slice_in_dim(dw, start, c, axis=0)
            dw = jax.lax.dynamic_update_slice_in_dim(dw, prev + g_wc.astype(dw.dtype), start, 0)
        else:
            dh = dh + jnp.einsum("nv,dv->nd", dzh, wc.astype(h.dtype),
                                 preferred_element_type=jnp.float32)
            g_wc = jnp.einsum("nd,nv->dv", h, dzh, preferred_element_type=jnp.float32)
            prev = jax.lax.dynamic_slice_in_dim(dw, start, c, axis=1)
            dw = jax.lax.dynamic_update_slice_in_dim(dw, prev + g_wc.astype(dw.dtype), start, 1)
        return (dh, dw), None

    init = (jnp.zeros(h.shape, jnp.float32), jnp.zeros(w.shape, w.dtype))
    (dh, dw), _ = jax.lax.scan(body, init, jnp.arange(k))
    return dh.astype(h.dtype), dw, None


vocab_chunked_logprobs.defvjp(_vcl_fwd, _vcl_bwd)
