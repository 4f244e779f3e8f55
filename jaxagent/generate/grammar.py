"""Token automata for constrained decoding, run inside the jitted decode loop.

A regular expression over decoded text (``jaxagent.envs.call_grammar``) becomes a finite
automaton over token ids with outlines-core (``outlines_core.Index``: the token-level DFA of a
regex over a vocabulary, as in Willard & Louf 2023, arXiv 2307.09702). ``GrammarTable`` keeps
every automaton a run compiled in one dense table ``next[state, token]`` (-1: the token is not
allowed there), so the decode loop needs no host round trip: each row carries its state, its
logits are masked by ``next[state] >= 0`` before sampling (``constrain_logits``) and the state
advances on the sampled token (``advance``). A row in state -1 is unconstrained.

Stop tokens are allowed exactly at accepting states (they lead to ``DONE``); a state with no
way on (never reached through outlines' pruned automata, but kept safe) allows the stop tokens
only, so no row is ever left with nothing to sample.

The sampled token's log-prob is taken under the masked distribution, and the state each token
was drawn in is recorded (``SampleOutput.grammar_states``); ``mask_bits(state)`` gives that
state's allowed vocabulary (packed bits) for the episode record, from which the learner
computes the same masked log-probs (``jaxagent.rl.model_fns``).

Memory: the table is states x vocabulary int32 on the device (a quickstart turn: ~300 x 330;
``max_bytes`` refuses tables past 256 MiB by default).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.buckets import bucket
from jaxagent.errors import ConfigError

DONE = 0  # the state after a stop token: nothing more is sampled


def token_texts(tokenizer, vocab_size: int) -> list[Optional[str]]:
    """What each token id adds to decoded text (None: ids past the tokenizer's vocabulary and
    byte fragments that decode to no text of their own). Special tokens keep their text
    (``<tool_call>`` is one in ChatML tokenizers): the grammar decides where they may go; the
    stop ids are left to ``GrammarTable``.

    Read as ``decode([a, id])`` less ``decode([a])`` for a plain reference token ``a``, so
    byte-level or sentencepiece tokens carry their own leading space. A word-level tokenizer
    (``decode`` puts one space before every token) gives each word with the space *after* it
    ("price "): a token then always ends at a word boundary, so no automaton state is reached
    in the middle of a longer word that no token could finish (the token "a" inside
    "agenda"), which outlines-core refuses."""
    special = set(getattr(tokenizer, "all_special_ids", ()) or ())
    n = min(vocab_size, len(tokenizer))
    ref = next(i for i in range(n) if i not in special and tokenizer.decode([i]).strip().isalpha())
    base = tokenizer.decode([ref])
    out: list[Optional[str]] = [None] * vocab_size
    for i in range(n):
        text = tokenizer.decode([ref, i])
        if not text.startswith(base):
            continue
        text = text[len(base) :]
        if text and "\ufffd" not in text:
            out[i] = text
    plain = [t for i, t in enumerate(out) if t is not None and i not in special]
    if all(t.startswith(" ") and len(t) > 1 for t in plain):
        out = [t[1:] + " " if t and t.startswith(" ") else t for t in out]  # word-level
    return out


class GrammarTable:
    """Automata of a run's regular expressions over one vocabulary, as one dense table.

    Args:
      texts: ``token_texts`` of the tokenizer (its length is the model's vocabulary).
      stop_ids: the ids that end a turn (allowed at accepting states only).
      max_bytes: the largest table allowed on the device.
    """

    def __init__(
        self,
        texts: Sequence[Optional[str]],
        stop_ids: Sequence[int],
        *,
        max_bytes: int = 256 * 2**20,
    ):
        if not stop_ids:
            raise ConfigError("constrained decoding needs stop token ids (where a turn ends)")
        self.vocab_size = len(texts)
        self.stop_ids = tuple(int(s) for s in stop_ids)
        self.max_bytes = max_bytes
        words: dict[str, list[int]] = {}
        for i, t in enumerate(texts):
            if t is not None and i not in self.stop_ids:
                words.setdefault(t, []).append(i)
        self._words = words
        self._rows: list[np.ndarray] = [np.full(self.vocab_size, -1, np.int32)]  # DONE
        self._starts: dict[str, int] = {}
        self._device: Optional[jax.Array] = None
        self._bits: dict[int, bytes] = {}

    @property
    def num_states(self) -> int:
        return len(self._rows)

    def start(self, regex: str) -> int:
        """The start state of ``regex``'s automaton (compiled once, then cached)."""
        if regex in self._starts:
            return self._starts[regex]
        from outlines_core import Index, Vocabulary

        eos = self.stop_ids[0]
        try:
            index = Index(regex, Vocabulary(eos, self._words))
        except (ValueError, RuntimeError) as err:
            raise ConfigError(
                f"the tokenizer's vocabulary cannot write this constrained language ({err}); "
                "use a tokenizer that covers its characters or drop the constraint"
            ) from None
        trans = index.get_transitions()
        finals = set(index.get_final_states())
        states = set(trans) | finals | {n for d in trans.values() for n in d.values()}
        ids = {s: self.num_states + k for k, s in enumerate(sorted(states))}
        if (self.num_states + len(ids)) * self.vocab_size * 4 > self.max_bytes:
            raise ConfigError(
                f"the constrained language needs {self.num_states + len(ids)} automaton states "
                f"x {self.vocab_size} tokens, over {self.max_bytes >> 20} MiB on the device; "
                "constrain fewer tools or simpler schemas"
            )
        for s, k in ids.items():
            row = np.full(self.vocab_size, -1, np.int32)
            for tok, nxt in trans.get(s, {}).items():
                if tok not in self.stop_ids:
                    row[tok] = ids[nxt]
            if s in finals or not (row >= 0).any():
                row[list(self.stop_ids)] = DONE
            self._rows.append(row)
        self._device = None
        self._starts[regex] = ids[index.get_initial_state()]
        return self._starts[regex]

    def device_table(self) -> jax.Array:
        """The table on the device, rows padded to a power of two (few recompiles as it grows)."""
        if self._device is None:
            rows = bucket(self.num_states, pow2=True, minimum=8)
            table = np.full((rows, self.vocab_size), -1, np.int32)
            table[: self.num_states] = np.stack(self._rows)
            self._device = jnp.asarray(table)
        return self._device

    def allowed(self, state: int) -> np.ndarray:
        """[V] bool: the tokens state ``state`` may emit."""
        return self._rows[state] >= 0

    def mask_bits(self, state: int) -> bytes:
        """``allowed(state)`` as packed bits (``np.packbits``), the episode's record."""
        if state not in self._bits:
            self._bits[state] = np.packbits(self.allowed(state)).tobytes()
        return self._bits[state]

    def masks(self, states) -> list:
        """The record of each token drawn in ``states`` (a row of ``SampleOutput.grammar_states``):
        its ``mask_bits``, None where the row was unconstrained (state -1)."""
        return [None if s < 0 else self.mask_bits(int(s)) for s in states]


def constrain_logits(logits: jax.Array, table: jax.Array, state: jax.Array) -> jax.Array:
    """``logits`` [B, V] with the tokens row b's ``state[b]`` forbids set to -inf (rows in
    state -1 untouched)."""
    allowed = (table[jnp.maximum(state, 0)] >= 0) | (state < 0)[:, None]
    return jnp.where(allowed, logits, -jnp.inf)


def advance(table: jax.Array, state: jax.Array, token: jax.Array) -> jax.Array:
    """Each row's state after emitting ``token`` [B] (-1 stays -1)."""
    nxt = table[jnp.maximum(state, 0), token]
    return jnp.where(state < 0, -1, nxt)


def unpack_mask(bits: jax.Array, vocab_size: int) -> jax.Array:
    """[..., ceil(V / 8)] uint8 packed bits -> [..., V] bool (``GrammarTable.mask_bits``)."""
    return jnp.unpackbits(bits, axis=-1, count=vocab_size).astype(bool)
