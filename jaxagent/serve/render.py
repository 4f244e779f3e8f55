"""Chat messages to token ids, the way the rollout driver renders them.

A session's token stream is built from the same pieces as a built-in episode
(``jaxagent.agents.chat``): the first request's ``[system, user]`` is ``chat.prompt`` (the
request's tools in the template's tools block), a single observation after a policy turn is
``chat.observation`` (the template's observation role), and the policy's own tokens are never
rendered at all (they are the sampled ids). Anything else (several messages after a turn, a
first request that already holds a history) is rendered with the template itself: the text the
template adds after a stand-in assistant turn's end-of-turn token, as
``TemplateChat.observation_text`` does for one message, tokenised once.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from typing import Any

from jaxagent.agents.chat import CHAT_TEMPLATE, TemplateChat
from jaxagent.envs.base import Task

_SENTINEL = "ZqxServeAssistantZqx"


def _template_call(c: dict) -> dict:
    return {"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}


class Renderer:
    """Renders normalised messages (``protocol.normal_message``) over a run's ``Chat``."""

    def __init__(self, chat):
        self.chat = chat
        self.tokenizer = chat.tokenizer
        self.template = isinstance(chat, TemplateChat)
        self.concatenative = self.tokenizer.chat_template == CHAT_TEMPLATE
        if self.template:
            # The same chat, with the request's tools in the tools block instead of a task's.
            self._chat = copy.copy(chat)
            self._chat.tools_of = lambda task: task.data.get("tools")
        else:
            self._chat = chat

    @property
    def observation_role(self) -> str:
        return self.chat.observation_role

    def _role(self, role: str) -> str:
        # A template without a tool role shows tool results as user turns (as the driver does).
        if role == "tool" and (not self.template or self.observation_role != "tool"):
            return "user"
        return role

    def _messages(self, messages: Sequence[dict]) -> list[dict]:
        out = []
        for m in messages:
            d: dict[str, Any] = {"role": self._role(m["role"]), "content": m["content"]}
            if m.get("tool_calls") and self.template:
                d["tool_calls"] = [_template_call(c) for c in m["tool_calls"]]
            out.append(d)
        return out

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _render(self, messages: list[dict], **kwargs) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)

    def first(self, messages: Sequence[dict], tools: Sequence[dict] | None) -> list[int]:
        """The ids of a conversation's first request, up to the assistant header."""
        roles = [m["role"] for m in messages]
        if roles in (["user"], ["system", "user"]):  # the driver's own first prompt
            system = messages[0]["content"] if roles[0] == "system" else ""
            task = Task(id="serve", split="serve", prompt="", data={"tools": list(tools or [])})
            return self._chat.prompt(system, messages[-1]["content"], task=task)
        kwargs: dict[str, Any] = {"add_generation_prompt": True}
        if tools and self.template:
            kwargs["tools"] = list(tools)
        return self._ids(self._render(self._messages(messages), **kwargs))

    def after_turn(self, messages: Sequence[dict]) -> list[int]:
        """The ids appended after a policy turn: ``messages`` and the assistant header."""
        if len(messages) == 1 and self._role(messages[0]["role"]) == self.observation_role:
            return self.chat.observation(messages[0]["content"])  # the driver's chunk
        msgs = self._messages(messages)
        if self.concatenative:  # each message renders on its own (``CHAT_TEMPLATE``)
            return self._ids(self._render(msgs, add_generation_prompt=True, add_bos=False))
        stand_in = [
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": _SENTINEL},
        ]
        full = self._render(stand_in + msgs, add_generation_prompt=True)
        start = full.index(_SENTINEL) + len(_SENTINEL)
        eot = self.chat.eot_text
        if eot and full.startswith(eot, start):
            start += len(eot)
        return self._ids(full[start:])


def tools_key(tools: Sequence[dict] | None) -> str:
    """A canonical string of a request's tools (a change of tools changes the first prompt)."""
    return json.dumps(list(tools or []), sort_keys=True)
