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

import re
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
    steps: list[list[list[str]]],
    answers: list[list[str]],
    drop: tuple[int, int] | None = None,
    keys: list[list[str]] | None = None,
) -> list[str]:
    """The action texts of a generated entry: each step's calls as one action (a step's
    calls need results of the step before), then ``Final:`` with the turn's answers, each
    as ``key=value`` when ``keys`` names the result key it was read under (``id=801``
    after ``create_ticket(...) -> id=801, ...``: written after the tokens it was read
    after, data.keyword_text)."""
    out = []
    for turn, turn_steps in enumerate(steps):
        index = 0
        for step in turn_steps:
            kept = [c for i, c in enumerate(step, index) if (turn, i) != drop]
            index += len(step)
            if kept:
                out.append("[" + ", ".join(kept) + "]")
        given = answers[turn] if turn < len(answers) else []
        if keys is not None:
            given = [f"{k}={a}" for k, a in zip(keys[turn], given)]
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
            self._actions = step_actions(
                task.data["steps"], task.data.get("answers", []), drop, task.data.get("answer_keys")
            )
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


class RandomCaller:
    """The baseline of ``jaxagent check bfcl_gen``: each user turn, 1-3 actions of 1-2 calls
    to tools the prompt lists, every argument a word or number seen so far (the request, the
    results) drawn at random, then ``Final:`` with a seen word. It reads nothing else: the
    floor an agent that calls the right kinds of tools without reading results would reach."""

    def __init__(self, task: Task, rng: Any):
        self._rng = rng
        self._tools: dict[str, list[str]] = {}
        self._seen: list[str] = ["1"]
        self._left = 0

    def act(self, observation: str) -> str:
        for line in observation.splitlines():  # "name(a: string, b?: integer)" lines
            m = re.fullmatch(r"([A-Za-z_]\w*)\((.*)\)", line.strip())
            if m and ":" in m.group(2) or (m and m.group(2) == ""):
                args = [a.split(":")[0].strip().rstrip("?") for a in m.group(2).split(",") if a]
                self._tools[m.group(1)] = args
        self._seen += re.findall(r"[A-Za-z0-9_.]+", observation)[-200:]
        if observation.startswith(("Available tools", "User:")) or "\nUser:" in observation:
            self._left = int(self._rng.integers(1, 4))  # a new request: 1-3 actions
        if self._left <= 0 or not self._tools:
            return "Final: " + self._pick(self._seen)
        self._left -= 1
        names = sorted(self._tools)
        calls = []
        for _ in range(int(self._rng.integers(1, 3))):
            name = self._pick(names)
            args = ", ".join(f"{a}={self._value()}" for a in self._tools[name])
            calls.append(f"{name}({args})")
        return "[" + ", ".join(calls) + "]"

    def _pick(self, items):
        return items[int(self._rng.integers(len(items)))]

    def _value(self) -> str:
        word = self._pick(self._seen)
        return word if re.fullmatch(r"\d+(\.\d+)?", word) else repr(word)


def make_random(task: Task, rng: Any) -> RandomCaller:
    return RandomCaller(task, rng)
