"""The ground-truth expert of a BFCL multi-turn entry, for SFT warm-starts.

BFCL ships, for every multi-turn entry, the calls that solve each user turn (``ground_truth``).
The expert replays them as the health check does (``replay.py``): one action with the turn's
calls as a Python list, then a message without calls that ends the turn, so demonstrations
have exactly the action syntax and turn structure the environment parses. It does not read
the observations: the ground truth solves the entry from its initial state. With
``error_rate`` p, a p fraction of its episodes leave out one call (drawn uniformly among the
entry's calls that occur once), which fails the entry: a mistake RL can remove. Generated
entries (``generated.py``) carry ``steps``: the expert sends each step as one action, so a
call that needs an earlier result comes after it, and ends a turn with ``Final:`` and the
turn's answers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxagent.envs.base import Task

END_TURN = "Final: done"


def turn_actions(ground_truth: list[list[str]], drop: tuple[int, int] | None = None) -> list[str]:
    """The action texts that replay ``ground_truth`` (minus the call at ``drop``)."""
    out = []
    for turn, calls in enumerate(ground_truth):
        kept = [c for i, c in enumerate(calls) if (turn, i) != drop]
        if kept:
            out.append("[" + ", ".join(kept) + "]")
        out.append(END_TURN)
    return out


def step_actions(
    steps: list[list[list[str]]], answers: list[list[str]], drop: tuple[int, int] | None = None
) -> list[str]:
    """The action texts of a generated entry: each step's calls as one action (a step's
    calls need results of the step before), then ``Final:`` with the turn's answers."""
    out = []
    for turn, turn_steps in enumerate(steps):
        index = 0
        for step in turn_steps:
            kept = [c for i, c in enumerate(step, index) if (turn, i) != drop]
            index += len(step)
            if kept:
                out.append("[" + ", ".join(kept) + "]")
        given = answers[turn] if turn < len(answers) else []
        out.append("Final: " + ", ".join(given) if given else END_TURN)
    return out


class GroundTruthExpert:
    """``act(observation) -> action``: the entry's ground-truth actions in order (by step,
    with the answers in the reply, when the entry has steps: generated tasks)."""

    def __init__(self, task: Task, error_rate: float = 0.0, rng: Any = None):
        truth = task.data["ground_truth"]
        rng = rng if rng is not None else np.random.default_rng(0)
        texts = [c for turn in truth for c in turn]
        # a call repeated elsewhere in the entry (the same lookup in two turns) is not left
        # out: the repeat's result would cover it, and the mistake would not be one
        calls = [
            (t, i)
            for t, turn in enumerate(truth)
            for i, c in enumerate(turn)
            if texts.count(c) == 1
        ]
        drop = None
        if calls and rng.random() < error_rate:
            drop = calls[int(rng.integers(len(calls)))]
        if "steps" in task.data:
            self._actions = step_actions(task.data["steps"], task.data.get("answers", []), drop)
        else:
            self._actions = turn_actions(truth, drop)
        self._next = 0

    def act(self, observation: str) -> str:
        del observation
        action = self._actions[min(self._next, len(self._actions) - 1)]
        self._next += 1
        return action


def make_expert(task: Task, error_rate: float, rng: Any) -> GroundTruthExpert:
    return GroundTruthExpert(task, error_rate, rng)
