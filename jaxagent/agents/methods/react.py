"""ReAct prompting (Yao et al., 2023): a thought before every action.

For an LM, ReAct is a prompt: ``REACT_INSTRUCTION`` is appended to the system prompt and the
model writes ``Thought : ... Action : tool ( ... )`` (or ``Final : ...``); the action parsers
(``jaxagent.envs.actions.parse_action``) read the action and keep the thought apart, so every
text environment accepts it. For a policy that writes no thought itself (a scripted one),
``ReActPolicy`` prefixes one from ``thought(observation, action)``; its tokens are on the
trajectory, so the eval record's tokens include what reasoning costs.

The environment gets the action without its thought (``ThoughtRunner``: the text from the
last ``Action :`` or ``Final :`` on): line-based ReAct parsers need the keywords at a line
start, which word-level tokenizers (one line, single spaces) cannot produce.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Optional, Sequence

import jax

from jaxagent.agents.chat import Chat
from jaxagent.agents.episode import Episode
from jaxagent.agents.rollout import RolloutSpec, collect_episodes
from jaxagent.agents.runner import BlockingRunner, EnvRunner
from jaxagent.agents.turn_policy import TurnOutput, TurnPolicy
from jaxagent.envs.base import Task

REACT_INSTRUCTION = "before each Action or Final write Thought : what the next step is and why ."


def name_thought(observation: str, action: str) -> str:
    """The default thought of a scripted policy: ``call <tool>`` or ``answer`` (never a ReAct
    keyword: the parser would read a section there)."""
    m = re.search(r"Action\s*:\s*(\w+)", action)
    return f"call {m.group(1)}" if m else "answer"


_KEY = re.compile(r"\b(Action|Final)\s*:")


def strip_thought(action: str) -> str:
    """``action`` from its last ``Action :`` / ``Final :`` on (unchanged when it has none)."""
    keys = list(_KEY.finditer(action))
    return action[keys[-1].start() :] if keys else action


class ThoughtRunner(BlockingRunner):
    """An ``EnvRunner`` passing the environment each action without its thought."""

    def __init__(self, inner: EnvRunner):
        super().__init__()
        self.inner = inner

    def reset(self, slots, tasks):
        return self.inner.reset(slots, tasks)

    def step(self, slots, actions):
        return self.inner.step(slots, [strip_thought(a) for a in actions])

    def health(self):
        return self.inner.health()

    def close(self) -> None:  # the inner runner belongs to the caller
        pass


class ReActPolicy:
    """A ``TurnPolicy`` that puts ``Thought : <thought> `` before actions lacking one."""

    def __init__(self, inner: TurnPolicy, chat: Chat, thought: Callable[[str, str], str]):
        self.inner, self.chat, self.thought = inner, chat, thought
        self._obs: list[Optional[str]] = []

    @property
    def recompiles(self) -> int:
        return self.inner.recompiles

    driver = None  # a wrapper's turns run in the lock-step rounds

    def release(self) -> None:
        self.inner.release()

    def rebase(self) -> None:
        self.inner.rebase()

    def start(self, params, prompts, key, *, tasks: Sequence[Task], observations) -> TurnOutput:
        self._obs = list(observations)
        return self._think(
            self.inner.start(params, prompts, key, tasks=tasks, observations=observations)
        )

    def resume(self, params, chunks, key, *, observations) -> TurnOutput:
        self._obs = list(observations)
        return self._think(self.inner.resume(params, chunks, key, observations=observations))

    def _think(self, out: TurnOutput) -> TurnOutput:
        for i, ids in enumerate(out.tokens):
            text = self.chat.decode(ids) if ids else ""
            if not text or "Thought" in text:
                continue
            new = self.chat.action(f"Thought : {self.thought(self._obs[i] or '', text)} {text}")
            out.tokens[i], out.logprobs[i], out.stopped[i] = new, [0.0] * len(new), True
        return out


@dataclasses.dataclass
class ReAct:
    """ReAct prompting around any turn policy.

    Args:
      chat: tokenises the prefixed thoughts.
      thought: for policies that write no thought; None leaves actions as the policy wrote
        them (an LM prompted with ``REACT_INSTRUCTION`` writes its own).
    """

    chat: Chat
    thought: Optional[Callable[[str, str], str]] = name_thought
    name: str = "react"

    def run(
        self,
        policy: TurnPolicy,
        params: Any,
        tasks: Sequence[Task],
        *,
        samples_per_task: int,
        spec: RolloutSpec,
        key: jax.Array,
    ) -> list[Episode]:
        system = f"{spec.system_prompt} {REACT_INSTRUCTION}".strip()
        spec = dataclasses.replace(spec, system_prompt=system, runner=ThoughtRunner(spec.runner))
        wrapped = policy if self.thought is None else ReActPolicy(policy, self.chat, self.thought)
        eps, _ = collect_episodes(
            wrapped, params, tasks, samples_per_task=samples_per_task, spec=spec, key=key
        )
        for ep in eps:
            ep.info["method"] = {"name": self.name}
        return eps
