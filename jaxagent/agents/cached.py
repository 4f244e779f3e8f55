"""The cached multi-turn sampler: one KV cache row per episode, ragged continuation.

``CachedTurnSampler`` keeps a ``jaxagent.models.KVCache`` with one row per episode. A turn is
one jitted call: the new chunk of each row (the prompt, or the previous turn's last sampled
token followed by the observation chunk; rows of different lengths, right-padded, padding
never written) is appended at that row's own length, then a ``lax.while_loop`` decodes up to
``max_new_tokens`` per row, stopping rows at a stop id. Finished episodes are passed as
``None`` and append nothing, so episodes at different turns share one batch and nothing is
re-encoded. Log-probs follow ``jaxagent.agents.sampling.sample_logits``.
"""

from __future__ import annotations

from functools import partial
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.agents.sampling import SamplingParams, TurnOutput, sample_logits
from jaxagent.models import KVCache, apply_model, init_cache


def _bucket(n: int) -> int:
    size = 8
    while size < n:
        size *= 2
    return size


class CachedTurnSampler:
    """Multi-turn sampler over a per-row KV cache.

    Args:
      graphdef: the model graphdef (its ``ModelConfig`` sizes the cache).
      sampling: static sampling settings.
      max_len: cache capacity per row (prompt + all turns + observations).
      model_config: the model's ``ModelConfig`` (sizes the cache).
    """

    def __init__(self, graphdef, sampling: SamplingParams, max_len: int, model_config):
        self.graphdef, self.sampling, self.max_len = graphdef, sampling, max_len
        self.model_config = model_config
        self.recompiles = 0
        self._shapes: set = set()
        self._cache: Optional[KVCache] = None
        self._pending: list[list[int]] = []
        self._turn = jax.jit(partial(_turn, graphdef, sampling), donate_argnums=(1,))

    def start(self, params, prompts: Sequence[Sequence[int]], key) -> TurnOutput:
        self._cache = init_cache(self.model_config, len(prompts), self.max_len)
        self._lengths = np.zeros(len(prompts), np.int64)
        self._pending = [[] for _ in prompts]
        return self._run(params, [list(map(int, p)) for p in prompts], key)

    def resume(self, params, chunks: Sequence[Optional[Sequence[int]]], key) -> TurnOutput:
        if self._cache is None or len(chunks) != len(self._pending):
            raise ValueError("resume() needs start() first and one chunk (or None) per row")
        return self._run(params, [None if c is None else list(map(int, c)) for c in chunks],
                         key)

    def _run(self, params, chunks, key) -> TurnOutput:
        rows = len(chunks)
        full = [None if c is None else self._pending[i] + c for i, c in enumerate(chunks)]
        width = _bucket(max([len(c) for c in full if c is not None] or [1]))
        n_new = self.sampling.max_new_tokens
        need = max((self._lengths[i] + len(c) + n_new for i, c in enumerate(full)
                    if c is not None), default=0)
        if need > self.max_len:
            raise ValueError(f"a row needs {need} cache slots > max_len={self.max_len}; the "
                             "rollout budget (max_total_tokens) must keep rows within it")
        buf = np.full((rows, width), self.sampling.pad_id, np.int32)
        seg = np.zeros((rows, width), np.int32)
        for i, c in enumerate(full):
            if c:
                buf[i, : len(c)] = c
                seg[i, : len(c)] = 1
        done = np.array([c is None or not c for c in full])
        shape = (rows, width)
        if shape not in self._shapes:
            self._shapes.add(shape)
            self.recompiles += 1
        self._cache, new, logp, n = self._turn(params, self._cache, jnp.asarray(buf),
                                               jnp.asarray(seg), jnp.asarray(done), key)
        new, logp, n = jax.device_get((new, logp, n))
        out = TurnOutput([], [], [])
        for i, c in enumerate(full):
            k = 0 if done[i] else int(n[i])
            toks = [int(t) for t in new[i, :k]]
            if not done[i]:
                # Every sampled token but the last was fed back (it is in the cache); the last
                # one goes in front of the row's next chunk.
                self._lengths[i] += len(c) + k - 1
                self._pending[i] = toks[-1:]
            out.tokens.append(toks)
            out.logprobs.append([float(x) for x in logp[i, :k]])
            out.stopped.append(bool(k and toks[-1] in self.sampling.stop_ids))
        return out


def _turn(graphdef, sampling: SamplingParams, params, cache: KVCache, chunk_bt, seg_bt, done_b,
          key):
    """Append each row's chunk, then decode. Returns (cache, new [B,N], logp [B,N], n [B])."""
    b = chunk_bt.shape[0]
    n_new = sampling.max_new_tokens
    stop = jnp.asarray(sampling.stop_ids or (-1,), jnp.int32)
    rank = jnp.cumsum(seg_bt, axis=1) - 1
    out = apply_model(graphdef, params, chunk_bt, cache.lengths[:, None] + rank, seg_bt, cache)
    last = jnp.maximum(seg_bt.sum(axis=1) - 1, 0)
    logits = jnp.take_along_axis(out.logits, last[:, None, None], axis=1)[:, 0]
    key, sub = jax.random.split(key)
    tok, lp = sample_logits(logits, sub, sampling.temperature, sampling.top_k, sampling.top_p)
    active = ~done_b
    new = jnp.zeros((b, n_new), jnp.int32).at[:, 0].set(jnp.where(active, tok, sampling.pad_id))
    logp = jnp.zeros((b, n_new), jnp.float32).at[:, 0].set(jnp.where(active, lp, 0.0))
    n = active.astype(jnp.int32)
    done = done_b | jnp.isin(tok, stop)

    def cond(carry):
        i, _, done, *_ = carry
        return (i < n_new) & ~jnp.all(done)

    def body(carry):
        i, cache, done, tok, new, logp, n, key = carry
        key, sub = jax.random.split(key)
        feed = ~done  # rows still decoding append their last token and sample the next
        out = apply_model(graphdef, params, tok[:, None], cache.lengths[:, None],
                          feed[:, None].astype(jnp.int32), cache)
        nxt, lp = sample_logits(out.logits[:, 0], sub, sampling.temperature, sampling.top_k,
                                sampling.top_p)
        new = new.at[:, i].set(jnp.where(feed, nxt, new[:, i]))
        logp = logp.at[:, i].set(jnp.where(feed, lp, logp[:, i]))
        n = n + feed
        tok = jnp.where(feed, nxt, tok)
        done = done | (feed & jnp.isin(nxt, stop))
        return i + 1, out.cache, done, tok, new, logp, n, key

    init = (jnp.int32(1), out.cache, done, tok, new, logp, n, key)
    _, cache, _, _, new, logp, n, _ = jax.lax.while_loop(cond, body, init)
    return cache, new, logp, n
