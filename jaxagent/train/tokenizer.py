"""Tokenizers trained from scratch for the tiny from-scratch policies.

``build_tokenizer`` trains a byte-level BPE (Hugging Face ``tokenizers``) on a small corpus
(the environment's prompts, tool documentation and expert demonstrations) and wraps it as a
``transformers.PreTrainedTokenizerFast`` with ``jaxagent.agents.chat.CHAT_TEMPLATE``, so that
``save_pretrained`` next to a checkpoint gives a directory ``jaxagent.models.load_tokenizer``
(``AutoTokenizer``) loads. Byte-level BPE round-trips any text exactly
(``decode(encode(s)) == s``), which matters because the policy's sampled text is parsed by the
environment. ``build_word_tokenizer`` is the one-token-a-word variant for closed vocabularies.
The chat format over these tokenizers is ``jaxagent.agents.chat.ChatFormat``.
"""

from __future__ import annotations

from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from jaxagent.agents.chat import (
    ASSISTANT,
    BOS,
    CHAT_TEMPLATE,
    END,
    PAD,
    SPECIAL_TOKENS,
    SYSTEM,
    UNK,
    USER,
)


def _wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=END,
        unk_token=UNK,
        additional_special_tokens=[SYSTEM, USER, ASSISTANT],
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def build_word_tokenizer(words: Iterable[str]) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over a closed vocabulary (whitespace-separated words).

    For worlds whose every text is single-space separated words from a known vocabulary
    (the quickstart world's ``vocabulary()``): one token a word gives the shortest sequences,
    and ``decode`` joins words with single spaces, so text round-trips exactly. Words outside
    the vocabulary map to ``<|unk|>``.
    """
    vocab: dict[str, int] = {}
    for w in list(SPECIAL_TOKENS) + sorted(set(words)):
        if w and not any(c.isspace() for c in w):
            vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return _wrap(tok)


def build_tokenizer(corpus: Iterable[str], vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on ``corpus`` and wrap it for ``transformers``.

    Args:
      corpus: texts the tokenizer should encode compactly (prompts, tool docs, demonstrations).
      vocab_size: total vocabulary size including the 256 byte symbols and special tokens.

    Returns:
      A ``PreTrainedTokenizerFast`` with pad/bos/eos set and ``CHAT_TEMPLATE``.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus), trainer=trainer)
    return _wrap(tok)
