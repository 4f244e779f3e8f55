"""The chat format: how conversation pieces become the token ids of an episode.

``Chat`` is what the rollout driver needs: the first prompt (system + first observation +
assistant header), each later observation chunk (user turn + assistant header), a
demonstrator's action with its stop token, and the text of policy tokens for the
environment. The episode's token stream is the concatenation of these chunks and the policy's
tokens, so nothing is ever re-tokenised for training.

``ChatFormat`` implements it over any Hugging Face tokenizer with a chat template; the
special tokens and ``CHAT_TEMPLATE`` below are those of the tokenizers
``jaxagent.train.tokenizer`` builds from scratch.
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

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


@runtime_checkable
class Chat(Protocol):
    """Renders conversation pieces to token ids and policy tokens back to text."""

    stop_ids: tuple[int, ...]  # a policy turn ends after one of these
    pad_id: int  # padding in batches

    def prompt(self, system: str, observation: str) -> list[int]:
        """Token ids of the first prompt: system + first observation + assistant header."""

    def observation(self, observation: str) -> list[int]:
        """Token ids appended after a policy turn: the user turn and the assistant header."""

    def action(self, text: str) -> list[int]:
        """Token ids of an assistant turn written by a demonstrator, stop token included."""

    def decode(self, ids: Sequence[int]) -> str:
        """Text of policy tokens for the environment (stop and pad tokens dropped)."""


class ChatFormat:
    """``Chat`` over a Hugging Face tokenizer's chat template.

    For tokenizers whose template is not concatenative (most Hugging Face ones), an
    observation chunk is the text the template adds for ``[..., user]`` + generation prompt
    beyond the rendering of the conversation so far; it is tokenised once and appended.
    """

    def __init__(self, tokenizer):
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                "the tokenizer has no chat_template; set tokenizer.chat_template "
                "(a Jinja string) or use jaxagent.train.tokenizer.build_tokenizer"
            )
        self.tokenizer = tokenizer
        self._ours = tokenizer.chat_template == CHAT_TEMPLATE
        stop = {tokenizer.eos_token_id}
        for name in (END, "<|im_end|>", "<|eot_id|>"):
            tid = tokenizer.convert_tokens_to_ids(name)
            if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid is not None:
                stop.add(tid)
        self.stop_ids: tuple[int, ...] = tuple(sorted(t for t in stop if t is not None))
        self.pad_id: int = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_ids[0]
        )

    def _render(self, messages: Sequence[dict], **kwargs) -> str:
        return self.tokenizer.apply_chat_template(list(messages), tokenize=False, **kwargs)

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt(self, system: str, observation: str) -> list[int]:
        msgs = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": observation}
        ]
        return self._ids(self._render(msgs, add_generation_prompt=True))

    def observation(self, observation: str) -> list[int]:
        msg = [{"role": "user", "content": observation}]
        if self._ours:
            return self._ids(self._render(msg, add_generation_prompt=True, add_bos=False))
        before = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
        head = self._render(before, add_generation_prompt=False)
        full = self._render(before + msg, add_generation_prompt=True)
        if not full.startswith(head):
            raise ValueError("the chat template is not prefix-stable; cannot append turns")
        return self._ids(full[len(head) :])

    def action(self, text: str) -> list[int]:
        return self._ids(text) + [self.stop_ids[0] if self._ours else self.tokenizer.eos_token_id]

    def decode(self, ids: Sequence[int]) -> str:
        keep = [int(t) for t in ids if int(t) not in self.stop_ids and int(t) != self.pad_id]
        return self.tokenizer.decode(keep, skip_special_tokens=False)
