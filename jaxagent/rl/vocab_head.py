"""Memory-lean pieces of the training forward pass, with hand-written backward passes.

- ``chunked_head_logprobs(h, w, targets, row_mask)``: log-probs of the targets and entropies
  of the next-token distributions, computed over blocks of rows and chunks of the vocabulary
  with an online log-sum-exp, so that no ``[N, V]`` logits (nor their gradient) ever exist
  at once. The backward pass recomputes each chunk's logits and adds that chunk's slice of
  the head gradient in place: the head costs one block of logits and one copy of its own
  gradient. Rows outside ``row_mask`` (prompt tokens, observations) are skipped at run time.
  All matmuls are plain 2-D ones (no batched einsums whose operands XLA would transpose).
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


def _backward_rows(h, w, targets, lse, mean_z, g_lp, g_ent, dw, c, k, tied):
    """One block of rows: (dh [R, D] float32, dw with these rows' head gradient added).

    d logp_n / dz_v = 1[v = y_n] - p_nv;  d H_n / dz_v = -p_nv (z_nv - E_p[z_n])."""
    vocab = w.shape[0] if tied else w.shape[1]

    def body(carry, i):
        dh, dw = carry
        z, cols, valid, start, wc = _chunk_logits(h, w, i, c, vocab, tied)
        p = jnp.where(valid[None], jnp.exp(z - lse[:, None]), 0.0)
        onehot = (cols[None] == targets[:, None]) & valid[None]
        dz = g_lp[:, None] * (onehot.astype(jnp.float32) - p) - g_ent[:, None] * p * (
            z - mean_z[:, None]
        )
        dzh = dz.astype(h.dtype)
        if tied:
            dh = dh + jnp.einsum(
                "nv,vd->nd", dzh, wc.astype(h.dtype), preferred_element_type=jnp.float32
            )
            g_wc = jnp.einsum("nv,nd->vd", dzh, h, preferred_element_type=jnp.float32)
            prev = jax.lax.dynamic_slice_in_dim(dw, start, c, axis=0)
            dw = jax.lax.dynamic_update_slice_in_dim(dw, prev + g_wc.astype(dw.dtype), start, 0)
        else:
            dh = dh + jnp.einsum(
                "nv,dv->nd", dzh, wc.astype(h.dtype), preferred_element_type=jnp.float32
            )
            g_wc = jnp.einsum("nd,nv->dv", h, dzh, preferred_element_type=jnp.float32)
            prev = jax.lax.dynamic_slice_in_dim(dw, start, c, axis=1)
            dw = jax.lax.dynamic_update_slice_in_dim(dw, prev + g_wc.astype(dw.dtype), start, 1)
        return (dh, dw), None

    (dh, dw), _ = jax.lax.scan(body, (jnp.zeros(h.shape, jnp.float32), dw), jnp.arange(k))
    return dh, dw


def _row_plan(n, row_mask, row_chunk):
    """Blocks of ``r`` rows: (r, padded n, take(x, i), put(buf, i, v), number of blocks).

    Without a mask, block i is rows [i r, (i + 1) r). With one, the rows are reordered so the
    masked-in rows come first (a stable sort) and only the blocks holding them are visited
    (the count is data-dependent: the loops are ``fori_loop``s with traced bounds)."""
    r = max(1, min(row_chunk, n))
    n_pad = math.ceil(n / r) * r
    if row_mask is None:
        take = lambda x, i: jax.lax.dynamic_slice_in_dim(x, i * r, r)  # noqa: E731
        put = lambda buf, i, v: jax.lax.dynamic_update_slice_in_dim(buf, v, i * r, 0)  # noqa: E731
        return r, n_pad, take, put, n_pad // r
    m = jnp.pad(row_mask, (0, n_pad - n))
    order = jnp.argsort(jnp.logical_not(m), stable=True)
    idx = lambda i: jax.lax.dynamic_slice_in_dim(order, i * r, r)  # noqa: E731
    take = lambda x, i: x[idx(i)]  # noqa: E731
    put = lambda buf, i, v: buf.at[idx(i)].set(v, unique_indices=True)  # noqa: E731
    return r, n_pad, take, put, (jnp.sum(m.astype(jnp.int32)) + r - 1) // r


def _pad_rows(x, n_pad):
    return (
        x
        if x.shape[0] == n_pad
        else jnp.pad(x, [(0, n_pad - x.shape[0])] + [(0, 0)] * (x.ndim - 1))
    )


def _head_forward(h, w, targets, row_mask, row_chunk, vocab_chunk, tied):
    n = h.shape[0]
    c, k = _chunk_plan(w.shape[0] if tied else w.shape[1], vocab_chunk)
    r, n_pad, take, put, blocks = _row_plan(n, row_mask, row_chunk)
    h_p, t_p = _pad_rows(h, n_pad), _pad_rows(targets, n_pad)

    def body(i, carry):
        lse, mean_z, tl = carry
        out = _forward_stats(take(h_p, i), w, take(t_p, i), c, k, tied)
        return tuple(put(buf, i, v) for buf, v in zip(carry, out))

    zeros = jnp.zeros((n_pad,), jnp.float32)
    lse, mean_z, tl = jax.lax.fori_loop(0, blocks, body, (zeros, zeros, zeros))
    lse, mean_z, tl = lse[:n], mean_z[:n], tl[:n]
    lp, ent = tl - lse, lse - mean_z
    if row_mask is not None:
        lp, ent = jnp.where(row_mask, lp, 0.0), jnp.where(row_mask, ent, 0.0)
    return (lp, ent), (lse, mean_z)


@partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def chunked_head_logprobs(
    h, w, targets, row_mask=None, row_chunk: int = 1024, vocab_chunk: int = 4096, tied: bool = False
):
    """Target log-probs and entropies of ``softmax(h @ W)`` without materialising logits.

    Args:
      h: [N, D] hidden states (one per predicted token).
      w: the head kernel, [D, V] (``tied=False``) or the embedding [V, D] (``tied=True``).
      targets: [N] int token ids to score.
      row_mask: optional [N] bool: rows to score; the others are skipped at run time (no
        head compute) and come back as 0 with no gradient. None scores every row.
      row_chunk: rows per block (N need not divide; a block of masked-out rows is skipped).
      vocab_chunk: vocabulary columns per chunk (the last chunk is clamped, V need not divide).
      tied: layout of ``w`` (static).

    Returns:
      (logp [N], entropy [N]) float32: log softmax(h W)[n, targets[n]] and the entropy of
      row n's distribution.
    """
    return _head_forward(h, w, targets, row_mask, row_chunk, vocab_chunk, tied)[0]


def _chl_fwd(h, w, targets, row_mask, row_chunk, vocab_chunk, tied):
    out, (lse, mean_z) = _head_forward(h, w, targets, row_mask, row_chunk, vocab_chunk, tied)
    return out, (h, w, targets, row_mask, lse, mean_z)


def _chl_bwd(row_chunk, vocab_chunk, tied, res, cts):
    h, w, targets, row_mask, lse, mean_z = res
    g_lp, g_ent = cts
    if row_mask is not None:
        g_lp, g_ent = jnp.where(row_mask, g_lp, 0.0), jnp.where(row_mask, g_ent, 0.0)
    n = h.shape[0]
    c, k = _chunk_plan(w.shape[0] if tied else w.shape[1], vocab_chunk)
    r, n_pad, take, put, blocks = _row_plan(n, row_mask, row_chunk)
    pad = lambda x: _pad_rows(x, n_pad)  # noqa: E731
    h_p, t_p, lse, mean_z, g_lp, g_ent = map(pad, (h, targets, lse, mean_z, g_lp, g_ent))

    def body(i, carry):
        dh, dw = carry
        dh_i, dw = _backward_rows(
            take(h_p, i),
            w,
            take(t_p, i),
            take(lse, i),
            take(mean_z, i),
            take(g_lp, i),
            take(g_ent, i),
            dw,
            c,
            k,
            tied,
        )
        return put(dh, i, dh_i), dw

    init = (jnp.zeros((n_pad, h.shape[1]), jnp.float32), jnp.zeros(w.shape, w.dtype))
    dh, dw = jax.lax.fori_loop(0, blocks, body, init)
    return dh[:n].astype(h.dtype), dw, None, None


chunked_head_logprobs.defvjp(_chl_fwd, _chl_bwd)
