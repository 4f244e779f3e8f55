"""The cached multi-turn sampler: one KV-cache row per episode, ragged continuation.

``CachedTurnSampler`` adapts ``jaxagent.generate.Sampler`` to the rollout driver's
``TurnPolicy`` protocol (``jaxagent.agents.turn_policy``). The sampler's cache keeps one row per episode; each turn appends
every active row's new chunk (the prompt, then each observation chunk: ragged lengths) at
that row's own length and decodes, so episodes at different turns share one batched call and
history is never re-encoded. Finished episodes are passed as empty rows and append nothing.

The cache lives only as long as its episodes: ``collect_episodes`` calls ``release()`` when
they have all ended, so the cache's buffers (layers x rows x capacity x KV heads x head dim,
twice) are not held through the learner's update, whose gradients and optimiser moments need
that memory.

The first turn's prompts of one task group (its K samples) are usually the same token list:
``start`` has the sampler prefill each distinct prompt once and copy its cache rows to the
rows that share it (``Sampler``'s ``share_prompts``), a K-fold saving of prefill work that
samples exactly what K prefills would.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

import jax

from jaxagent.agents.turn_policy import TurnOutput

if TYPE_CHECKING:
    from jaxagent.agents.rollout import Driver
from jaxagent.generate import Sampler, SamplingConfig


class CachedTurnSampler:
    """Multi-turn sampler over ``jaxagent.generate.Sampler``'s per-row KV cache.

    Args:
      graphdef: the model graphdef.
      sampling: static sampling settings.
      max_len: the longest row (the sampler also enforces the model's ``max_seq_len``).
      pad_id: token id for padding.
      share_prompts: prefill identical first prompts once (see the module docstring).
    """

    driver: Optional[Driver] = None  # the lock-step rounds

    def __init__(
        self,
        graphdef,
        sampling: SamplingConfig,
        max_len: int,
        pad_id: int = 0,
        share_prompts: bool = True,
    ):
        self.sampling, self.max_len, self.share_prompts = sampling, max_len, share_prompts
        self._sampler = Sampler(graphdef, pad_id=pad_id)
        self._cache = None
        self._turns: list[int] = []  # each row's turn number (its next turn's)
        # Each row draws from its own stream keyed by (row_offset + its index, its turn
        # number) (``Sampler``'s ``row_ids`` / ``turn_ids``): how the episodes are split over
        # hosts (a host's first global row is its offset) and which call serves a turn (the
        # lock-step rounds or ``jaxagent.agents.engine``'s slots) do not change what is
        # sampled.
        self.row_offset: int = 0
        # Constrained decoding (``jaxagent.agents.constrained.TurnGrammar``): every turn of a
        # row starts in its task's start state; None: free decoding.
        self.grammar = None
        self._gstarts: list[int] = []
        self._rebased = False

    @property
    def recompiles(self) -> int:
        return self._sampler.num_compiles

    @property
    def prefilled_tokens(self) -> int:
        """Tokens fed through the model's prefill so far (prompts and observation chunks)."""
        return self._sampler.prefilled_tokens

    def start(
        self, params, prompts: Sequence[Sequence[int]], key, *, tasks=(), observations=()
    ) -> TurnOutput:
        del observations  # an LM acts on tokens alone
        self.release()
        self._turns = [0] * len(prompts)
        if self.grammar is not None:
            self._gstarts = self.grammar.starts(tasks)
        return self._run(params, [list(p) for p in prompts], key, share=self.share_prompts)

    def resume(
        self, params, chunks: Sequence[Optional[Sequence[int]]], key, *, observations=()
    ) -> TurnOutput:
        del observations
        if len(chunks) != len(self._turns) or (self._cache is None and not self._rebased):
            raise ValueError("resume() needs start() first and one chunk (or None) per row")
        self._rebased = False
        for i, c in enumerate(chunks):
            self._turns[i] += c is not None
        return self._run(params, [[] if c is None else list(c) for c in chunks], key)

    def rebase(self) -> None:
        """Drop the KV cache between turns (new weights: partial rollouts); the next
        ``resume`` takes each running row's whole context and prefills it again, with the
        rows' turn numbers (so their random streams) unchanged."""
        self.release()
        self._rebased = True

    def release(self) -> None:
        """Free the KV cache's device buffers now (the episodes it served have ended); the
        next ``start`` builds a new one. ``resume`` needs ``start`` again afterwards."""
        cache, self._cache = self._cache, None
        if cache is not None:
            for x in jax.tree.leaves(cache):
                if isinstance(x, jax.Array) and not x.is_deleted():
                    x.delete()

    def _run(self, params, rows, key, share: bool = False) -> TurnOutput:
        lengths = (
            [0] * len(rows) if self._cache is None else jax.device_get(self._cache.lengths).tolist()
        )
        need = max(n + len(r) for n, r in zip(lengths, rows) if r) + self.sampling.max_new_tokens
        if need > self.max_len:
            raise ValueError(
                f"a row may need {need} tokens > max_len={self.max_len}; the "
                "rollout budget (max_total_tokens) must keep rows within it"
            )
        out = self._sampler(
            params,
            rows,
            self.sampling,
            key,
            cache=self._cache,
            row_ids=range(self.row_offset, self.row_offset + len(rows)),
            turn_ids=self._turns,
            share_prompts=share,
            grammar=self._grammar_inputs(),
        )
        self._cache = out.cache
        tokens, logp, n = jax.device_get((out.tokens, out.logprobs, out.lengths))
        res = TurnOutput([], [], [])
        if out.grammar_states is not None:
            counts = [int(n[i]) if rows[i] else 0 for i in range(len(rows))]
            res.masks = self.grammar.row_masks(jax.device_get(out.grammar_states), counts)
        for i in range(len(rows)):
            k = int(n[i]) if rows[i] else 0
            toks = [int(t) for t in tokens[i, :k]]
            res.tokens.append(toks)
            res.logprobs.append([float(x) for x in logp[i, :k]])
            res.stopped.append(bool(k and toks[-1] in self.sampling.stop_token_ids))
        return res

    def _grammar_inputs(self):
        """``(table, starts)`` for the sampler, or None when decoding is free."""
        if self.grammar is None or not any(s >= 0 for s in self._gstarts):
            return None
        return self.grammar.table.device_table(), self._gstarts
