"""Reflexion (Shinn et al., 2023): retry a failed task with a verbal lesson in memory.

Attempt 1 runs every (task, sample) through ``collect_episodes``. Each failed attempt (the
environment's verdict: ``success`` false; environment errors are not retried, they are not the
policy's failure) is turned into a lesson by a reflector, and the lessons (the last
``memory_size``) are prepended to the first observation of the next attempt
(``base.MemoryRunner``), so any policy reads them and the episode records what they cost.
At most ``max_attempts`` attempts per (task, sample); the returned episode merges them
(``base.merge_attempts``): success is that of the last attempt, the tokens and steps are
those of all, and the reflections' own tokens are in ``info["method_tokens"]``.

Reflectors: ``TranscriptReflector`` (host, no model: the lesson states the failure mode, the
calls made and the final answer of the failed attempt, taken from its transcript) and
``PolicyReflector`` (the policy model writes the lesson from a reflection prompt).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Protocol, Sequence

import jax

from jaxagent.agents.chat import Chat
from jaxagent.agents.episode import Episode
from jaxagent.agents.methods.base import (
    MemoryRunner,
    add_method_tokens,
    merge_attempts,
    transcript,
    with_runner,
)
from jaxagent.agents.rollout import RolloutSpec, collect_episodes
from jaxagent.agents.turn_policy import TurnPolicy
from jaxagent.envs.base import Task

REFLECT_PROMPT = "the attempt failed . write one lesson for the next attempt ."


@dataclasses.dataclass(frozen=True)
class Reflection:
    text: str
    input_tokens: int = 0  # what writing it read (the reflection prompt)
    generated_tokens: int = 0  # what writing it produced


class Reflector(Protocol):
    def reflect(self, failed: Sequence[Episode], attempt: int) -> list[Reflection]: ...


_CALL = re.compile(r"Action\s*:\s*(.*)$")
_FINAL = re.compile(r"Final\s*:\s*(.*)$")


class TranscriptReflector:
    """A lesson from the failed transcript alone: ``lesson : attempt N failed ( <mode> ) after
    <calls> ; final <answer> .`` (the calls and the final answer as the agent wrote them).

    Args:
      chat: when given, the lesson's tokens are counted as generated (what an LM writing the
        same lesson would have produced); the transcript it reads as input.
    """

    def __init__(self, chat: Chat | None = None):
        self.chat = chat

    def reflect(self, failed: Sequence[Episode], attempt: int) -> list[Reflection]:
        out = []
        for ep in failed:
            calls, final = [], "none"
            for t in ep.turns:
                body = t.action.split("Action", 1)
                if len(body) == 2 and (m := _CALL.search("Action" + body[1])):
                    calls.append(" ".join(m.group(1).split()))
                elif m := _FINAL.search(t.action):
                    final = " ".join(m.group(1).split()) or "none"
            mode = ep.failure_mode or "failed"
            text = (
                f"lesson : attempt {attempt + 1} failed ( {mode} ) after "
                f"{' , '.join(calls) if calls else 'no calls'} ; final {final} ."
            )
            n_in = len(self.chat.prompt("", transcript(ep))) if self.chat else 0
            n_gen = len(self.chat.action(text)) if self.chat else 0
            out.append(Reflection(text, n_in, n_gen))
        return out


class PolicyReflector:
    """The policy model writes the lesson: prompt = transcript + ``REFLECT_PROMPT``.

    It calls ``policy.start`` between attempts, when no episode of the policy is running, so
    the same sampler object serves both.
    """

    def __init__(self, policy: TurnPolicy, chat: Chat, params: Any, key: jax.Array, system=""):
        self.policy, self.chat, self.params, self.key, self.system = (
            policy,
            chat,
            params,
            key,
            system,
        )

    def reflect(self, failed: Sequence[Episode], attempt: int) -> list[Reflection]:
        if not failed:
            return []
        texts = [f"{transcript(ep)} {REFLECT_PROMPT}" for ep in failed]
        prompts = [self.chat.prompt(self.system, t) for t in texts]
        key = jax.random.fold_in(self.key, attempt)
        out = self.policy.start(
            self.params, prompts, key, tasks=[ep.task for ep in failed], observations=texts
        )
        self.policy.release()  # one-turn reflections: the KV cache is done with
        return [
            Reflection(f"lesson : {self.chat.decode(ids)}", len(p), len(ids))
            for p, ids in zip(prompts, out.tokens)
        ]


@dataclasses.dataclass
class Reflexion:
    """Reflexion around any turn policy (see the module docstring).

    Args:
      reflector: writes lessons from failed attempts.
      max_attempts: attempts per (task, sample), >= 1 (1 = the wrapped policy alone).
      memory_size: lessons kept in memory (the most recent).
    """

    reflector: Reflector
    max_attempts: int = 3
    memory_size: int = 3
    name: str = "reflexion"

    def __post_init__(self):
        if self.max_attempts < 1:
            raise ValueError(f"reflexion max_attempts={self.max_attempts} must be >= 1")
        if self.memory_size < 1:
            raise ValueError(f"reflexion memory_size={self.memory_size} must be >= 1")

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
        rows = [t for t in tasks for _ in range(samples_per_task)]
        attempts: list[list[Episode]] = [[] for _ in rows]
        lessons: list[list[str]] = [[] for _ in rows]
        pending = list(range(len(rows)))
        for attempt in range(self.max_attempts):
            if not pending:
                break
            memories = [
                "memory : " + " ".join(lessons[r][-self.memory_size :]) if lessons[r] else ""
                for r in pending
            ]
            eps, _ = collect_episodes(
                policy,
                params,
                [rows[r] for r in pending],
                samples_per_task=1,
                spec=with_runner(spec, MemoryRunner(spec.runner, memories)),
                key=jax.random.fold_in(key, attempt),
            )
            for r, ep in zip(pending, eps):
                ep.group = r // samples_per_task
                attempts[r].append(ep)
            # Environment errors are not the policy's failure: no lesson, no retry.
            pending = [
                r for r in pending if not (attempts[r][-1].success or attempts[r][-1].env_failed)
            ]
            if attempt + 1 < self.max_attempts and pending:
                failed = [attempts[r][-1] for r in pending]
                for r, ep, refl in zip(pending, failed, self.reflector.reflect(failed, attempt)):
                    lessons[r].append(refl.text)
                    add_method_tokens(ep, input=refl.input_tokens, generated=refl.generated_tokens)
        return [
            merge_attempts(a, name=self.name, max_attempts=self.max_attempts, lessons=lessons[r])
            for r, a in enumerate(attempts)
        ]
