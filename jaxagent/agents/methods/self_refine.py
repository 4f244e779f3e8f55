"""Self-Refine (Madaan et al., 2023): generate -> self-critique -> revise, before acting.

``SelfRefinePolicy`` wraps any turn policy. Every action the wrapped policy drafts is shown to
a critic (with the task's first observation: the task and its tools); while the critic has
something to say and fewer than ``max_rounds`` revisions were made, a reviser rewrites the
draft from the critique. Only the final text reaches the environment and the episode; no
environment feedback is used (that is Reflexion's), so a revision costs tokens, not steps.

The drafts, critiques and revisions are off the recorded trajectory: per revision round the
critique reads the draft and writes the critique, the revision reads the critique and writes
the new draft; ``SelfRefine.run`` puts these counts in ``info["method_tokens"]``.

With an LM as the wrapped policy its KV cache keeps its own draft (the episode records the
revision): the LM conditions on what it drafted, the environment on the revision.

Critics / revisers here are host-side and model-free, for tool-calling worlds that list their
tools as ``name ( a , b )``: ``SignatureCritic`` checks a call's tool and argument names
against the listing, ``SignatureReviser`` renames the unknown arguments to the missing ones
in order.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Optional, Protocol, Sequence

import jax

from jaxagent.agents.chat import Chat
from jaxagent.agents.episode import Episode
from jaxagent.agents.methods.base import add_method_tokens
from jaxagent.envs.tools.quickstart.scripted import signatures
from jaxagent.agents.rollout import RolloutSpec, collect_episodes
from jaxagent.agents.turn_policy import TurnOutput, TurnPolicy
from jaxagent.envs.base import Task

_ACTION = re.compile(r"Action\s*:\s*(\w+)\s*\((.*)\)\s*$", re.S)
_ARG = re.compile(r"(\w+)\s*=")


class Critic(Protocol):
    def critique(self, first_observation: str, draft: str) -> Optional[str]: ...


class Reviser(Protocol):
    def revise(self, first_observation: str, draft: str, critique: str) -> str: ...


class SignatureCritic:
    """``critique : <tool> takes ( a , b ) not x`` when the draft calls an unlisted tool or
    uses an argument name outside the listed signature; None when the call fits."""

    def critique(self, first_observation: str, draft: str) -> Optional[str]:
        m = _ACTION.search(draft)
        if m is None:
            return None  # a final answer (or no call): nothing to check against signatures
        sigs = signatures(first_observation)
        tool, args = m.group(1), _ARG.findall(m.group(2))
        if tool not in sigs:
            return f"critique : {tool} is not listed ; tools : {' '.join(sigs)}"
        bad = [a for a in args if a not in sigs[tool]]
        if bad:
            return f"critique : {tool} takes ( {' , '.join(sigs[tool])} ) not {' '.join(bad)}"
        return None


class SignatureReviser:
    """Renames the arguments a ``SignatureCritic`` critique names to the signature's unused
    ones, in order."""

    def revise(self, first_observation: str, draft: str, critique: str) -> str:
        m = _ACTION.search(draft)
        if m is None or " not " not in critique:
            return draft
        sig = signatures(first_observation).get(m.group(1), [])
        used = _ARG.findall(m.group(2))
        free = iter([a for a in sig if a not in used])
        bad = set(critique.rsplit(" not ", 1)[1].split())
        body = _ARG.sub(
            lambda a: f"{next(free, a.group(1)) if a.group(1) in bad else a.group(1)} =", m.group(2)
        )
        return draft[: m.start(2)] + body + draft[m.end(2) :]


class SelfRefinePolicy:
    """A ``TurnPolicy``: the wrapped policy's drafts, critiqued and revised (module doc)."""

    def __init__(
        self, inner: TurnPolicy, chat: Chat, critic: Critic, reviser: Reviser, max_rounds: int
    ):
        if max_rounds < 1:
            raise ValueError(f"self_refine max_rounds={max_rounds} must be >= 1")
        self.inner, self.chat, self.critic, self.reviser = inner, chat, critic, reviser
        self.max_rounds = max_rounds
        self._first: list[str] = []
        self.hidden: list[dict[str, int]] = []  # per row: input, generated, revisions

    @property
    def recompiles(self) -> int:
        return self.inner.recompiles

    driver = None  # a wrapper's turns run in the lock-step rounds

    def release(self) -> None:
        self.inner.release()

    def rebase(self) -> None:
        self.inner.rebase()

    def start(self, params, prompts, key, *, tasks: Sequence[Task], observations) -> TurnOutput:
        self._first = [o or "" for o in observations]
        self.hidden = [{"input": 0, "generated": 0, "revisions": 0} for _ in observations]
        out = self.inner.start(params, prompts, key, tasks=tasks, observations=observations)
        return self._refine(out)

    def resume(self, params, chunks, key, *, observations) -> TurnOutput:
        return self._refine(self.inner.resume(params, chunks, key, observations=observations))

    def _refine(self, out: TurnOutput) -> TurnOutput:
        for i, ids in enumerate(out.tokens):
            if not ids:
                continue
            draft, ids0, rounds = self.chat.decode(ids), ids, 0
            while rounds < self.max_rounds:
                fb = self.critic.critique(self._first[i], draft)
                if fb is None:
                    break
                fb_ids = self.chat.action(fb)
                draft = self.reviser.revise(self._first[i], draft, fb)
                new_ids = self.chat.action(draft)
                h = self.hidden[i]
                # critique reads the draft and writes fb; revision reads fb, writes new draft
                h["input"] += len(ids) + len(fb_ids)
                h["generated"] += len(fb_ids) + len(new_ids)
                h["revisions"] += 1
                ids, rounds = new_ids, rounds + 1
            if ids is not ids0:
                # The final revision replaces the draft; its tokens were written, not sampled
                # by the wrapped policy (log-prob 0, as a demonstrator's). The previous
                # draft's tokens are off-trajectory: counted above as the critique's input.
                self.hidden[i]["generated"] += len(ids0) - len(ids)
                out.tokens[i], out.logprobs[i], out.stopped[i] = ids, [0.0] * len(ids), True
        return out


@dataclasses.dataclass
class SelfRefine:
    """Self-Refine around any turn policy; ``max_rounds`` revisions per action at most."""

    chat: Chat
    critic: Critic
    reviser: Reviser
    max_rounds: int = 2
    name: str = "self_refine"

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
        wrapped = SelfRefinePolicy(policy, self.chat, self.critic, self.reviser, self.max_rounds)
        eps, _ = collect_episodes(
            wrapped, params, tasks, samples_per_task=samples_per_task, spec=spec, key=key
        )
        for ep, h in zip(eps, wrapped.hidden):
            add_method_tokens(ep, input=h["input"], generated=h["generated"])
            ep.info["method"] = {
                "name": self.name,
                "max_rounds": self.max_rounds,
                "revisions": h["revisions"],
            }
        return eps
