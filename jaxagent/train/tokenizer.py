"""A tiny tokenizer trained from scratch, and the chat format the rollout driver uses.

``build_tokenizer`` trains a byte-level BPE (Hugging Face ``tokenizers``) on a small corpus
(the environment's prompts, tool documentation and expert demonstrations) and wraps it as a
``transformers.PreTrainedTokenizerFast`` with a chat template, so that ``save_pretrained`` next
to a checkpoint gives a directory ``AutoTokenizer.from_pretrained`` loads. Byte-level BPE
round-trips any text exactly (``decode(encode(s)) == s``), which matters because the policy's
sampled text is parsed by the environment.

``ChatFormat`` renders the pieces of a conversation as token ids: the first prompt (system +
first observation + assistant header) and each later observation chunk (user turn + assistant
header). The episode's token stream is the concatenation of these chunks and the policy's
sampled tokens, so nothing is ever re-tokenised for training.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

PAD, BOS, END, UNK = "<|pad|>", "<|bos|>", "<|end|>", "<|unk|>"
SYSTEM, USER, ASSISTANT = "<|system|>", "<|user|>", "<|assistant|>"
SPECIAL_TOKENS = (PAD, BOS, END, SYSTEM, USER, ASSISTANT, UNK)

# Each message renders on its own (no cross-message whitespace), so the rendering of a whole
# conversation is the concatenation of per-message renderings: the incremental chunks the
# rollout driver appends are exactly what apply_chat_template gives for the full conversation.
CHAT_TEMPLATE = (
    "{% if add_bos is not defined or add_bos %}" + BOS + "{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}" + END + "{% endfor %}"
    "{% if add_generation_prompt %}" + ASSISTANT + "{% endif %}"
)


def _wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, bos_token=BOS, eos_token=END, unk_token=UNK,
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


def load_tokenizer_dir(path: str) -> PreTrainedTokenizerBase:
    """Load a tokenizer saved with ``save_pretrained`` (ours or any Hugging Face one)."""
    return AutoTokenizer.from_pretrained(path)


class ChatFormat:
    """Renders conversation pieces to token ids with the tokenizer's chat template.

    For tokenizers whose template is not concatenative (most Hugging Face ones), an
    observation chunk is the text the template adds for ``[..., user]`` + generation prompt
    beyond the rendering of the conversation so far; it is tokenised once and appended.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("the tokenizer has no chat_template; set tokenizer.chat_template "
                             "(a Jinja string) or use jaxagent.train.tokenizer.build_tokenizer")
        self.tokenizer = tokenizer
        self._ours = tokenizer.chat_template == CHAT_TEMPLATE
        stop = {tokenizer.eos_token_id}
        for name in (END, "<|im_end|>", "<|eot_id|>"):
            tid = tokenizer.convert_tokens_to_ids(name)
            if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid is not None:
                stop.add(tid)
        self.stop_ids: tuple[int, ...] = tuple(sorted(t for t in stop if t is not None))
        self.pad_id: int = (tokenizer.pad_token_id if tokenizer.pad_token_id is not None
                            else self.stop_ids[0])

    def _render(self, messages: Sequence[dict], **kwargs) -> str:
        return self.tokenizer.apply_chat_template(list(messages), tokenize=False, **kwargs)

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt(self, system: str, observation: str) -> list[int]:
        """Token ids of BOS + system + first observation + the assistant header."""
        msgs = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": observation}]
        return self._ids(self._render(msgs, add_generation_prompt=True))

    def observation(self, observation: str) -> list[int]:
        """Token ids appended after a policy turn: the user turn and the assistant header."""
        msg = [{"role": "user", "content": observation}]
        if self._ours:
            return self._ids(self._render(msg, add_generation_prompt=True, add_bos=False))
        before = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
        head = self._render(before, add_generation_prompt=False)
        full = self._render(before + msg, add_generation_prompt=True)
        if not full.startswith(head):
            raise ValueError("the chat template is not prefix-stable; cannot append turns")
        return self._ids(full[len(head):])

    def action(self, text: str) -> list[int]:
        """Token ids of an assistant turn written by a demonstrator, ending with the stop id."""
        return self._ids(text) + [self.stop_ids[0] if self._ours else self.tokenizer.eos_token_id]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of policy tokens for the environment (stop tokens dropped)."""
        keep = [int(t) for t in ids if int(t) not in self.stop_ids and int(t) != self.pad_id]
        return self.tokenizer.decode(keep, skip_special_tokens=False)
