"""The chat format: how conversation pieces become the token ids of an episode.

``Chat`` is what the rollout driver needs: the first prompt (system + the task's tools +
first observation + assistant header), each later observation chunk (the observation turn +
assistant header), a demonstrator's action with its stop token, and the text of policy tokens
for the environment. The episode's token stream is the concatenation of these chunks and the
policy's tokens, so nothing is ever re-tokenised for training: the learner sees exactly the
ids the sampler was fed and produced (``tests/test_chat_stream.py``).

Two implementations:

* ``ChatFormat``: the project's from-scratch template (``CHAT_TEMPLATE`` and the special
  tokens below; tools are plain text in the observation, observations are user turns).
* ``TemplateChat``: a real model's Hugging Face chat template (``model.init_from``; or the
  project's ChatML one, ``jaxagent.train.tokenizer.CHATML_TEMPLATE``). The task's tool
  schemas go through the template's own ``tools=`` argument (``tools_of(task)``), the
  results of a turn's tool calls go back in the template's tool role (user role where the
  template has none), an observation after a turn without calls goes back as a user turn
  (OpenAI's rule: a tool message answers a call; so an OpenAI client's conversation and the
  driver's are the same tokens), and demonstrations are written in the template's native
  tool-call syntax (``jaxagent.envs.tool_calls``; detected from the template).

The token stream per template family (``|`` separates what the driver appends; ``<eot>`` is
the token that ends a policy turn, which the sampler stops on and keeps):

* project (``<|bos|>``): ``<|bos|>[<|system|>S<|end|>]<|user|>O<|end|><|assistant|>`` | policy
  ``...<|end|>`` | ``<|user|>O<|end|><|assistant|>`` | ...
* ChatML (Qwen2.5, Hermes, the project's ChatML): ``<|im_start|>system\nS+tools<|im_end|>\n
  <|im_start|>user\nO<|im_end|>\n<|im_start|>assistant\n`` | policy ``...<|im_end|>`` |
  ``\n<|im_start|>user\n<tool_response>\nO\n</tool_response><|im_end|>\n<|im_start|>
  assistant\n`` (after a turn with calls; after one without, ``\n<|im_start|>user\nO
  <|im_end|>\n<|im_start|>assistant\n``) | ... The template's newline after ``<|im_end|>`` opens the next chunk (the
  sampler stops at ``<|im_end|>``), so the decoded stream equals the template's rendering of
  the whole conversation.
* Llama 3.x: ``<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS...<|eot_id|>
  ...assistant<|end_header_id|>\n\n`` | policy ``...<|eot_id|>`` | ``<|start_header_id|>
  ipython<|end_header_id|>\n\nO<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n``.
* Mistral: ``<s>[INST] ... [/INST]`` | policy ``...</s>`` | ``[INST] O [/INST]`` (its
  templates reject a tool message without a preceding structured call: observations go back
  as user turns).

An observation chunk is what the template renders after ``<eot>`` of a stand-in assistant
turn in ``[user, assistant, observation]`` + generation prompt: it is computed from the
latest turn alone, so templates that are not prefix-stable (that rewrite earlier turns, e.g.
drop old reasoning) still give a consistent stream; for those the stream is the conversation
as the model saw it turn by turn, not the template's re-rendering of the whole of it. A turn
cut by ``max_new_tokens`` has no ``<eot>``; the next chunk follows it directly.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Protocol, Sequence, runtime_checkable

from jaxagent.envs.base import Task
from jaxagent.envs.actions import to_native
from jaxagent.envs.tool_calls import native_calls, syntax_of_template

PAD, BOS, END, UNK = "<|pad|>", "<|bos|>", "<|end|>", "<|unk|>"
SYSTEM, USER, ASSISTANT = "<|system|>", "<|user|>", "<|assistant|>"
SPECIAL_TOKENS = (PAD, BOS, END, SYSTEM, USER, ASSISTANT, UNK)

# Special tokens that end a turn or a message in the chat families jaxagent renders. A model
# may close its turn with any of them, not only the one its template writes: Llama 3.1 ends a
# tool-call message with <|eom_id|> (its generation_config stops on <|end_of_text|>,
# <|eom_id|> and <|eot_id|>), Qwen2.5 may end with <|endoftext|> (its generation_config stops
# on <|im_end|> and <|endoftext|>). Missing one runs such a turn to max_new_tokens.
END_OF_TURN_TOKENS = (
    END,  # the project's template
    "<|im_end|>",  # ChatML (Qwen2.5, Hermes)
    "<|endoftext|>",  # Qwen2 / GPT-2 end of text
    "<|eot_id|>",  # Llama 3.x end of turn
    "<|eom_id|>",  # Llama 3.1 end of message (a tool call awaiting its result)
    "<|end_of_text|>",  # Llama 3.x end of text
    "<end_of_turn>",  # Gemma
)


def stop_ids_of(tokenizer, *extra: int | None) -> tuple[int, ...]:
    """The token ids that end a policy turn: the tokenizer's eos, every ``END_OF_TURN_TOKENS``
    entry its vocabulary holds, and ``extra`` (a template's own end-of-turn token, a model
    directory's ``generation_config.json`` eos ids). Sorted, no duplicates."""
    stop = {tokenizer.eos_token_id, *extra}
    vocab = tokenizer.get_vocab()
    for name in END_OF_TURN_TOKENS:
        tid = vocab.get(name)
        if tid is not None and tid != tokenizer.unk_token_id:
            stop.add(int(tid))
    return tuple(sorted(int(t) for t in stop if t is not None))


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
    # How actions write tool calls: "react" (an ``Action :`` line) or a template's native
    # syntax ("hermes", "llama3", "mistral": ``jaxagent.envs.tool_calls``).
    syntax: str
    observation_role: str  # the role a turn's tool results are rendered in: "user" or "tool"
    eot_text: str  # the text that ends an assistant turn ("" where the chat writes none)

    def prompt(self, system: str, observation: str, task: Optional[Task] = None) -> list[int]:
        """Token ids of the first prompt: system (+ the task's tools, for chats that render
        them) + first observation + assistant header."""

    def observation(self, observation: str, *, after_call: bool = True) -> list[int]:
        """Token ids appended after a policy turn: the observation turn and the assistant
        header. ``after_call``: the turn made tool calls (``makes_call``) and the observation
        is their result, rendered in ``observation_role``; else it is a user turn."""

    def makes_call(self, text: str) -> bool:
        """Whether a policy turn's text (``decode``) makes tool calls: what the serve endpoint
        returns as the answer's ``tool_calls``, which a tool message then answers."""

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

    syntax = "react"  # actions are plain text
    observation_role = "user"

    def __init__(self, tokenizer, *, extra_stop_ids: Sequence[int] = ()):
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                "the tokenizer has no chat_template; set tokenizer.chat_template "
                "(a Jinja string) or use jaxagent.train.tokenizer.build_tokenizer"
            )
        self.tokenizer = tokenizer
        self._ours = tokenizer.chat_template == CHAT_TEMPLATE
        self.stop_ids: tuple[int, ...] = stop_ids_of(tokenizer, *extra_stop_ids)
        # The turn end a demonstration writes: the template's <|end|>, else the eos.
        self.eot_id: int = tokenizer.get_vocab()[END] if self._ours else tokenizer.eos_token_id
        self.pad_id: int = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_ids[0]
        )

    @property
    def eot_text(self) -> str:
        """The turn end a demonstration writes, as the tokenizer spells the token."""
        return self.tokenizer.convert_ids_to_tokens(self.eot_id)

    def _render(self, messages: Sequence[dict], **kwargs) -> str:
        return self.tokenizer.apply_chat_template(list(messages), tokenize=False, **kwargs)

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt(self, system: str, observation: str, task: Optional[Task] = None) -> list[int]:
        del task  # this format shows tools as observation text
        msgs = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": observation}
        ]
        return self._ids(self._render(msgs, add_generation_prompt=True))

    def observation(self, observation: str, *, after_call: bool = True) -> list[int]:
        del after_call  # every observation is a user turn
        msg = [{"role": "user", "content": observation}]
        if self._ours:
            return self._ids(self._render(msg, add_generation_prompt=True, add_bos=False))
        before = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
        head = self._render(before, add_generation_prompt=False)
        full = self._render(before + msg, add_generation_prompt=True)
        if not full.startswith(head):
            raise ValueError("the chat template is not prefix-stable; cannot append turns")
        return self._ids(full[len(head) :])

    def makes_call(self, text: str) -> bool:
        del text
        return False  # actions are plain text: no structured calls, no tool role

    def action(self, text: str) -> list[int]:
        return self._ids(text) + [self.eot_id]

    def decode(self, ids: Sequence[int]) -> str:
        keep = [int(t) for t in ids if int(t) not in self.stop_ids and int(t) != self.pad_id]
        return self.tokenizer.decode(keep, skip_special_tokens=False)


def role_after(chat: Chat, after_call: bool) -> str:
    """The role of the observation after a policy turn: the chat's tool role
    (``observation_role``) when the turn made tool calls (``makes_call``), else "user" (a
    tool message answers a call; the serve endpoint refuses one that does not)."""
    return chat.observation_role if after_call else "user"


def observation_after(chat: Chat, turn: str, observation: str) -> list[int]:
    """The ids appended after the policy turn whose text is ``turn`` (``Chat.decode``): the
    results of its tool calls in the chat's tool role, or, after a turn without calls, the
    observation as a user turn (as an OpenAI client sends it: a tool message answers a call;
    the serve endpoint refuses one that does not)."""
    return chat.observation(observation, after_call=chat.makes_call(turn))


ToolsOf = Callable[[Task], Optional[list[dict]]]
_SENTINEL = "ZqxAssistantTurnZqx"  # a stand-in assistant turn, found again in the rendering


class TemplateChat:
    """``Chat`` over a real model's chat template, with tools and a tool role.

    Args:
      tokenizer: a ``transformers`` tokenizer with a ``chat_template``.
      tools_of: ``tools_of(task)`` -> the task's tool schemas (OpenAI-style function dicts)
        for the template's ``tools=`` argument, or None (no tools block).
      tool_call_syntax: how demonstrations write calls ("hermes", "llama3", "mistral",
        "react"); None detects it from the template.
      observation_role: "tool" (the template's tool role; "user" where it fails to render
        one) or "user".
      extra_stop_ids: more ids that end a turn (a model directory's generation_config.json
        eos ids), besides ``stop_ids_of``'s.
    """

    def __init__(
        self,
        tokenizer,
        *,
        tools_of: Optional[ToolsOf] = None,
        tool_call_syntax: Optional[str] = None,
        observation_role: str = "tool",
        extra_stop_ids: Sequence[int] = (),
    ):
        template = getattr(tokenizer, "chat_template", None)
        if not template:
            raise ValueError(
                "the tokenizer has no chat_template; save the model's template with its "
                "tokenizer (tokenizer_config.json or chat_template.jinja)"
            )
        if observation_role not in ("tool", "user"):
            raise ValueError(f"observation_role={observation_role!r}; choose 'tool' or 'user'")
        self.tokenizer, self.tools_of = tokenizer, tools_of
        self.syntax = tool_call_syntax or syntax_of_template(template)
        self.observation_role = observation_role
        if observation_role == "tool" and not self._renders_tool_role():
            self.observation_role = "user"
        self.eot_text, self.eot_id = self._end_of_turn()
        self.stop_ids: tuple[int, ...] = stop_ids_of(tokenizer, self.eot_id, *extra_stop_ids)
        pad = tokenizer.pad_token_id
        self.pad_id: int = pad if pad is not None else self.eot_id

    def _render(self, messages: Sequence[dict], **kwargs) -> str:
        return self.tokenizer.apply_chat_template(list(messages), tokenize=False, **kwargs)

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _stand_in(self, role: str) -> list[dict]:
        return [
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": _SENTINEL},
            {"role": role, "content": "ZqxObservationZqx"},
        ]

    def _renders_tool_role(self) -> bool:
        try:  # Mistral-style templates raise on a tool message without a structured call
            text = self._render(self._stand_in("tool"), add_generation_prompt=True)
        except Exception:  # jinja2 TemplateError or the template's raise_exception
            return False
        return "ZqxObservationZqx" in text

    def _end_of_turn(self) -> tuple[str, int]:
        """The special token the template closes an assistant turn with (the sampler's stop)."""
        text = self._render(self._stand_in("user")[:2], add_generation_prompt=False)
        after = text[text.index(_SENTINEL) + len(_SENTINEL) :]
        candidates = [t for t in self.tokenizer.all_special_tokens if t and after.startswith(t)]
        if not candidates:
            eos = self.tokenizer.eos_token
            if eos is None:
                raise ValueError(
                    f"the chat template ends an assistant turn with {after[:20]!r}, not a "
                    "special token, and the tokenizer has no eos_token: cannot stop turns"
                )
            return "", self.tokenizer.convert_tokens_to_ids(eos)
        eot = max(candidates, key=len)
        return eot, self.tokenizer.convert_tokens_to_ids(eot)

    def tools(self, task: Optional[Task]) -> Optional[list[dict]]:
        """The task's tool schemas as passed to the template (None: no tools block)."""
        return None if task is None or self.tools_of is None else self.tools_of(task)

    def render_prompt(self, system: str, observation: str, task: Optional[Task] = None) -> str:
        """The first prompt as text (what ``jaxagent rollout`` prints)."""
        msgs = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": observation}
        ]
        tools = self.tools(task)
        kwargs: dict[str, Any] = {"tools": tools} if tools else {}
        return self._render(msgs, add_generation_prompt=True, **kwargs)

    def prompt(self, system: str, observation: str, task: Optional[Task] = None) -> list[int]:
        return self._ids(self.render_prompt(system, observation, task))

    def observation_text(self, observation: str, *, after_call: bool = True) -> str:
        """The chunk after a policy turn's ``<eot>``: the template's text between turns, the
        observation turn (in ``observation_role`` after a turn with tool calls, else in the
        user role) and the assistant header."""
        role = role_after(self, after_call)
        full = self._render(
            self._stand_in(role)[:2] + [{"role": role, "content": observation}],
            add_generation_prompt=True,
        )
        start = full.index(_SENTINEL) + len(_SENTINEL)
        if self.eot_text and full.startswith(self.eot_text, start):
            start += len(self.eot_text)
        return full[start:]

    def observation(self, observation: str, *, after_call: bool = True) -> list[int]:
        return self._ids(self.observation_text(observation, after_call=after_call))

    def makes_call(self, text: str) -> bool:
        # The serve endpoint's rule (``tool_calls.native_calls``): a template without a native
        # syntax answers every turn with a user turn.
        return bool(native_calls(text, self.syntax))

    def action(self, text: str) -> list[int]:
        return self._ids(to_native(text, self.syntax)) + [self.eot_id]

    def decode(self, ids: Sequence[int]) -> str:
        keep = [int(t) for t in ids if int(t) not in self.stop_ids and int(t) != self.pad_id]
        return self.tokenizer.decode(
            keep, skip_special_tokens=False, clean_up_tokenization_spaces=False
        )


def make_chat(
    tokenizer, *, tools_of: Optional[ToolsOf] = None, extra_stop_ids: Sequence[int] = ()
) -> Chat:
    """The chat for a tokenizer: ``ChatFormat`` for the project's from-scratch template,
    ``TemplateChat`` (tools, tool role, native calls) for any other template. Its turns end
    on ``stop_ids_of(tokenizer)`` plus ``extra_stop_ids``."""
    if getattr(tokenizer, "chat_template", None) == CHAT_TEMPLATE:
        return ChatFormat(tokenizer, extra_stop_ids=extra_stop_ids)
    return TemplateChat(tokenizer, tools_of=tools_of, extra_stop_ids=extra_stop_ids)
