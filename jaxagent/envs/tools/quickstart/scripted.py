"""Scripted-but-imperfect quickstart policies with a systematic, stateable mistake.

They are what the methods' tests (and ``jaxagent eval --policy lookalike|argname``) wrap, so
that a method's gain can be checked against a known cause:

- ``LookalikeExpert`` confuses look-alike tools: whenever both ``price`` and ``quote`` are
  listed (the distractor level) it calls the other one of the pair than the plan's. It reads
  its first observation and, when a memory lesson names a failed call of the tool it was about
  to use, it takes the other one: the lesson Reflexion writes from the failed transcript
  ("... failed ( wrong_answer ) after quote ( item = ... )") is enough to fix it.
- ``ArgNameExpert`` takes the format example ``tool ( arg = value )`` literally and names
  every string argument ``arg`` (``price ( arg = " acme " )``). The world answers
  ``error : bad argument arg for price`` and it repeats the call until the step budget: a
  critique of the draft against the listed signature (Self-Refine's) fixes it.

Both follow the expert's plan otherwise (error rate 0), closed-loop on observations.
``lookalike_candidates`` offers a tree search the policy's pick first and the look-alike
second (DFSDT's children).
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import numpy as np

from jaxagent.envs.base import Task
from jaxagent.envs.tools.quickstart import world as W
from jaxagent.envs.tools.quickstart.expert import ExpertPolicy

LOOKALIKE = {"price": "quote", "quote": "price"}
_CALLED = re.compile(r"\b(\w+) \(")


def _swap_tool(action: str, tool: str) -> str:
    head, rest = action.split("(", 1)
    return f"{head.rsplit(' ', 2)[0]} {tool} ({rest}"


def _tool_of(action: str) -> str | None:
    m = re.match(r"\s*Action\s*:\s*(\w+)", action)
    return m.group(1) if m else None


def failed_tools(observation: str) -> set[str]:
    """Tools named in the ``lesson :`` parts of a memory prefix, as failed calls."""
    head = observation.split("task :", 1)[0]
    out: set[str] = set()
    for lesson in head.split("lesson :")[1:]:
        after = lesson.split(" after ", 1)[-1].split(" ; ", 1)[0]
        out.update(_CALLED.findall(after))
    return out


class LookalikeExpert:
    """The error-free expert that swaps ``price``/``quote`` when both are listed, unless a
    memory lesson says the swapped call failed (``make_expert`` signature)."""

    def __init__(self, task: Task, error_rate: float = 0.0, rng: Any = None):
        del error_rate  # the mistake is systematic, not drawn
        self.task = task
        self.inner = ExpertPolicy(task, 0.0, rng if rng is not None else np.random.default_rng(0))
        self.listed = set(task.data["tools"])
        self.avoid: set[str] | None = None

    def act(self, observation: str) -> str:
        if self.avoid is None:
            self.avoid = failed_tools(observation)
        action = self.inner.act(observation)
        tool = _tool_of(action)
        if tool in LOOKALIKE and LOOKALIKE[tool] in self.listed:
            pick = LOOKALIKE[tool]  # the confusion
            if pick in self.avoid and tool not in self.avoid:
                pick = tool  # the lesson: that call failed, take the other
            action = _swap_tool(action, pick)
        return action


class ArgNameExpert:
    """The error-free expert that calls every string argument ``arg`` (``make_expert``
    signature). It never reads error observations, so it repeats the mistake."""

    def __init__(self, task: Task, error_rate: float = 0.0, rng: Any = None):
        del error_rate
        self.inner = ExpertPolicy(task, 0.0, rng if rng is not None else np.random.default_rng(0))
        self._last: str | None = None

    def act(self, observation: str) -> str:
        if self._last is not None and "error :" in observation:
            return self._last  # the same call again: it does not read the error
        action = re.sub(r'\b(\w+) = "', 'arg = "', self.inner.act(observation))
        self._last = action if action.startswith("Action") else None
        return action


def lookalike_candidates(
    task: Task, history: Sequence[tuple[str, str]], first_obs: str
) -> list[str]:
    """Children for tree search: ``LookalikeExpert``'s next action replayed along ``history``
    (the plan position and bindings come from the observations), then its look-alike twin."""
    expert = LookalikeExpert(task)
    action = expert.act(first_obs)
    for _, obs in history:
        action = expert.act(obs)
    tool = _tool_of(action)
    out = [action]
    if tool in LOOKALIKE and LOOKALIKE[tool] in set(task.data["tools"]):
        out.append(_swap_tool(action, LOOKALIKE[tool]))
    return out


def signatures(observation: str) -> dict[str, list[str]]:
    """``name ( a , b )`` signatures listed after ``tools :`` in a quickstart-style
    observation -> {name: [a, b]} (the format of ``world.compact_signature``)."""
    tail = observation.split("tools :", 1)[-1]
    return {
        name: [a.strip() for a in args.split(",") if a.strip()]
        for name, args in re.findall(r"(\w+) \(([^()]*)\)", tail)
    }


SCRIPTED = {"lookalike": LookalikeExpert, "argname": ArgNameExpert}
assert set(LOOKALIKE) <= set(W.TOOL_NAMES)
