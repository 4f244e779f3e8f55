"""The cache-free reference sampler of the turn-policy protocol.

``ReferenceSampler`` implements ``jaxagent.agents.turn_policy.TurnPolicy`` by re-running a
full forward pass over each row's context for every new token: no cache, quadratic cost, but
simple enough to trust. Tests use it as the reference for the cached sampler
(``jaxagent.agents.cached.CachedTurnSampler``, built on ``jaxagent.generate``). Both take one
``jaxagent.generate.SamplingConfig`` and report log-probs as
``jaxagent.generate.sample_tokens`` defines them: under ``softmax(logits / temperature)``
before top-k / top-p filtering (temperature 1 gives exactly the learner's log-probs; greedy
reports temperature-1 log-probs).
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.agents.turn_policy import HostPolicy, TurnOutput
from jaxagent.buckets import bucket
from jaxagent.generate import SamplingConfig, sample_tokens


class ReferenceSampler(HostPolicy):
    """A cache-free sampler: one full forward pass over the context per new token.

    Args:
      logits_fn: ``logits_fn(params, tokens [B,T], positions [B,T], segment_ids [B,T]) ->
        logits [B,T,V]``.
      sampling: static sampling settings.
      max_len: the longest row (context + new tokens) the sampler accepts.
      pad_id: token id for padding.
    """

    def __init__(
        self, logits_fn: Callable, sampling: SamplingConfig, max_len: int, pad_id: int = 0
    ):
        self.sampling, self.max_len, self.pad_id = sampling, max_len, pad_id
        self._contexts: list[list[int]] = []
        self._decode = jax.jit(partial(_reference_decode, logits_fn, sampling, pad_id))
        self._shapes: set[tuple[int, int]] = set()  # one compilation per distinct buffer shape
        self._round = 0  # the driver passes one key per rollout: each call folds in its own
        self._rebased = False

    @property
    def recompiles(self) -> int:
        return len(self._shapes)

    def start(self, params, prompts, key, *, tasks=(), observations=()) -> TurnOutput:
        del tasks, observations  # an LM acts on tokens alone
        self._contexts = [list(map(int, p)) for p in prompts]
        self._round = 0
        return self._run(params, [True] * len(prompts), key)

    def resume(self, params, chunks, key, *, observations=()) -> TurnOutput:
        del observations
        if len(chunks) != len(self._contexts):
            raise ValueError(f"resume got {len(chunks)} chunks for {len(self._contexts)} rows")
        active = []
        for ctx, chunk in zip(self._contexts, chunks):
            active.append(chunk is not None)
            if chunk is not None:
                if self._rebased:  # the chunk is the row's whole context
                    ctx.clear()
                ctx.extend(int(t) for t in chunk)
        self._rebased = False
        return self._run(params, active, key)

    def rebase(self) -> None:
        """The next ``resume`` gets every running row's whole context (each token re-encodes
        its context anyway: no state of the old weights to drop)."""
        self._rebased = True

    def _run(self, params, active, key) -> TurnOutput:
        key, self._round = jax.random.fold_in(key, self._round), self._round + 1
        n_new = self.sampling.max_new_tokens
        longest = max(len(c) for c in self._contexts) + n_new
        if longest > self.max_len:
            raise ValueError(
                f"a row needs {longest} tokens > max_len={self.max_len}; the "
                "rollout budget (max_total_tokens) must keep rows within it"
            )
        width = bucket(longest, pow2=True, minimum=16, cap=self.max_len)
        buf = np.full((len(self._contexts), width), self.pad_id, np.int32)
        self._shapes.add(buf.shape)
        lengths = np.zeros(len(self._contexts), np.int32)
        for i, ctx in enumerate(self._contexts):
            buf[i, : len(ctx)] = ctx
            lengths[i] = len(ctx)
        new, logp, n = jax.device_get(
            self._decode(
                params,
                jnp.asarray(buf),
                jnp.asarray(lengths),
                jnp.asarray(~np.asarray(active)),
                key,
            )
        )
        out = TurnOutput([], [], [])
        for i, ctx in enumerate(self._contexts):
            k = int(n[i]) if active[i] else 0
            toks = [int(t) for t in new[i, :k]]
            ctx.extend(toks)
            out.tokens.append(toks)
            out.logprobs.append([float(x) for x in logp[i, :k]])
            out.stopped.append(bool(k and toks[-1] in self.sampling.stop_token_ids))
        return out


def _reference_decode(
    logits_fn, sampling: SamplingConfig, pad_id: int, params, buf_bt, lengths_b, done_b, key
):
    """Decode ``max_new_tokens`` with full re-encoding; returns (new [B,N], logp [B,N], n [B])."""
    b, t = buf_bt.shape
    n_new = sampling.max_new_tokens
    stop = jnp.asarray(sampling.stop_token_ids or (-1,), jnp.int32)
    pos_bt = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))

    def body(i, carry):
        buf, lengths, done, new, logp, n, key = carry
        key, sub = jax.random.split(key)
        seg = (pos_bt < lengths[:, None]).astype(jnp.int32)
        logits = logits_fn(params, buf, pos_bt, seg)
        last = jnp.take_along_axis(logits, (lengths - 1)[:, None, None], axis=1)[:, 0]
        tok, lp = sample_tokens(sub, last, sampling)
        write = ~done
        buf = jnp.where(write[:, None] & (pos_bt == lengths[:, None]), tok[:, None], buf)
        new = new.at[:, i].set(jnp.where(write, tok, pad_id))
        logp = logp.at[:, i].set(jnp.where(write, lp, 0.0))
        lengths = lengths + write
        n = n + write
        done = done | (write & jnp.isin(tok, stop))
        return buf, lengths, done, new, logp, n, key

    init = (
        buf_bt,
        lengths_b,
        done_b,
        jnp.zeros((b, n_new), jnp.int32),
        jnp.zeros((b, n_new), jnp.float32),
        jnp.zeros((b,), jnp.int32),
        key,
    )
    _, _, _, new, logp, n, _ = jax.lax.fori_loop(0, n_new, body, init)
    return new, logp, n
