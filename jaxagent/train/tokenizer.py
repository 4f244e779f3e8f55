"""Tokenizers trained from scratch for the tiny from-scratch policies.

``build_tokenizer`` trains a byte-level BPE (Hugging Face ``tokenizers``) on a small corpus
(the environment's prompts, tool documentation and expert demonstrations) and wraps it as a
``transformers.PreTrainedTokenizerFast`` with ``jaxagent.agents.chat.CHAT_TEMPLATE``, so that
``save_pretrained`` next to a checkpoint gives a directory ``jaxagent.models.load_tokenizer``
(``AutoTokenizer``) loads. Byte-level BPE round-trips any text exactly
(``decode(encode(s)) == s``), which matters because the policy's sampled text is parsed by the
environment. ``build_word_tokenizer`` is the one-token-a-word variant for closed vocabularies.
The chat format over these tokenizers is ``jaxagent.agents.chat.ChatFormat``.

``build_chatml_tokenizer`` is the same BPE with the special tokens and chat template of a
real instruction-tuned model: ChatML (``<|im_start|>role\n...<|im_end|>\n``) with a tools
block in the system turn (``tools=``), ``<tool_call>`` JSON calls and tool results in
``<tool_response>`` (the Hermes / Qwen2.5 conventions, ``CHATML_TEMPLATE``, written by this
project). Saved with ``save_pretrained`` it is what a downloaded checkpoint's directory holds,
and ``jaxagent.agents.chat.TemplateChat`` drives it like any third-party template.
"""

from __future__ import annotations

import re

from typing import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
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


IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
CHATML_SPECIAL = (ENDOFTEXT, IM_START, IM_END) + TOOL_TOKENS

# ChatML with tools. Newlines are Jinja expressions ({{ nl }}) because transformers renders
# templates with trim_blocks / lstrip_blocks, which would eat literal ones next to tags. Each
# message renders on its own, so the whole conversation is the concatenation of its turns.
_NL = "{%- set nl = '\\n' -%}"
CHATML_TEMPLATE = (
    _NL + "{%- set sys = messages[0]['content'] if messages and messages[0]['role'] == "
    "'system' else '' -%}"
    "{%- if sys or tools -%}" + IM_START + "system{{ nl }}{{ sys }}"
    "{%- if tools -%}{%- if sys -%}{{ nl }}{{ nl }}{%- endif -%}"
    "Tools:{{ nl }}<tools>"
    "{%- for t in tools -%}{{ nl }}{{ (t['function'] if t['function'] is defined else t) "
    "| tojson }}{%- endfor -%}{{ nl }}</tools>{{ nl }}"
    'Call a tool as <tool_call>{"name": ..., "arguments": {...}}</tool_call>.'
    "{%- endif -%}" + IM_END + "{{ nl }}{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' and loop.first -%}"
    "{%- elif m['role'] == 'tool' -%}" + IM_START + "user{{ nl }}<tool_response>{{ nl }}"
    "{{ m['content'] }}{{ nl }}</tool_response>" + IM_END + "{{ nl }}"
    "{%- else -%}" + IM_START + "{{ m['role'] }}{{ nl }}{{ m['content'] or '' }}"
    "{%- if m['tool_calls'] is defined and m['tool_calls'] -%}"
    "{%- for c in m['tool_calls'] -%}"
    "{%- set f = c['function'] if c['function'] is defined else c -%}"
    "{%- if m['content'] or not loop.first -%}{{ nl }}{%- endif -%}"
    '<tool_call>{{ nl }}{"name": {{ f[\'name\'] | tojson }}, "arguments": '
    "{{ (f['arguments'] if f['arguments'] is string else f['arguments'] | tojson) }}}"
    "{{ nl }}</tool_call>"
    "{%- endfor -%}{%- endif -%}" + IM_END + "{{ nl }}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}" + IM_START + "assistant{{ nl }}{%- endif -%}"
)


def build_chatml_tokenizer(
    corpus: Iterable[str], vocab_size: int = 2048
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on ``corpus`` with ChatML's special tokens and ``CHATML_TEMPLATE``.

    ``<|im_end|>`` is the end-of-turn and eos token, ``<|endoftext|>`` pads (as in Qwen2.5's
    instruct tokenizers); the ``<tool_call>`` / ``<tool_response>`` tags are single tokens.
    """
    tok = Tokenizer(models.BPE())
    # Digits and space-led words (task sentences, observations) are pieces of their own, so
    # a number or a name is the same token wherever it appears (copying it into a call is
    # easy); the JSON around them (the tool schemas, the call syntax) may merge across
    # punctuation and quotes up to 32 bytes, so the schemas that recur verbatim take few
    # tokens (whole quickstart conversations: ~140 tokens, ~300 with GPT-2's word regex).
    # Still byte-level: every text round-trips exactly.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\p{N}| \p{L}+"), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(CHATML_SPECIAL),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        max_token_length=32,
        show_progress=False,
    )
    # Special tokens are cut out of the corpus so that no merge learns a piece of one.
    split = re.compile("|".join(re.escape(t) for t in CHATML_SPECIAL))
    pieces = [p for text in corpus for p in split.split(text) if p]
    tok.train_from_iterator(pieces, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=ENDOFTEXT,
        eos_token=IM_END,
        unk_token=None,
        additional_special_tokens=[IM_START, *TOOL_TOKENS],
        clean_up_tokenization_spaces=False,
    )
    wrapped.chat_template = CHATML_TEMPLATE
    return wrapped
