"""Scripted policies for the math suite: the expert (with errors) and a random guesser.

The expert knows each problem's plan (one calculator expression). In the answer variant it
states the answer; in the tool variant it calls ``calc`` with the expression, reads the value
the calculator returned and states that (closed loop, so its demonstrations are consistent
with the transcript). With ``error_rate`` p a p fraction of its episodes contain one mistake
RL can fix: an operand changed in the expression, or a wrong final value.
"""

from __future__ import annotations

import re
from fractions import Fraction

import numpy as np

from jaxagent.envs.base import Task
from jaxagent.envs.math.calc import format_value


def format_call(expr: str) -> str:
    return f'Action : calc ( expr = " {expr} " )'


def format_final(answer: str) -> str:
    return f"Final : {answer}"


def _wrong_value(answer: str, rng: np.random.Generator) -> str:
    value = Fraction(answer.replace(" ", ""))
    return format_value(value + int(rng.choice([-2, -1, 1, 2])))


def _perturb(expr: str, rng: np.random.Generator) -> str:
    numbers = [m for m in re.finditer(r"\d+", expr)]
    m = numbers[int(rng.integers(len(numbers)))]
    new = int(m.group()) + int(rng.choice([-1, 1]))
    new = new + 2 if new <= 0 else new  # stays a positive number (no division by zero)
    return expr[: m.start()] + str(new) + expr[m.end() :]


class MathExpert:
    """``act(observation) -> action text`` for one task. ``variant``: "answer" or "tool"."""

    def __init__(
        self,
        task: Task,
        error_rate: float = 0.0,
        rng: np.random.Generator | None = None,
        variant: str = "answer",
    ):
        if not 0.0 <= error_rate <= 1.0:
            raise ValueError(f"error_rate must be in [0, 1], got {error_rate}")
        self.task, self.variant = task, variant
        self.rng = rng if rng is not None else np.random.default_rng(0)
        self.mistake = None
        if self.rng.random() < error_rate:
            kinds = ["final"] + (["operand"] if variant == "tool" else [])
            self.mistake = str(self.rng.choice(kinds))
        self._called = False

    def act(self, observation: str) -> str:
        answer = self.task.data["answer"]
        if self.variant == "tool" and not self._called:
            self._called = True
            expr = self.task.data["expr"]
            return format_call(_perturb(expr, self.rng) if self.mistake == "operand" else expr)
        if self.variant == "tool":
            seen = observation.split(":", 1)[-1].strip()
            answer = seen if re.fullmatch(r"-?\d+( / \d+)?", seen) else answer
        if self.mistake == "final":
            answer = _wrong_value(answer, self.rng)
        return format_final(answer)


def random_action(task: Task, rng: np.random.Generator) -> str:
    """A random final answer: an integer in [-20, 100] or a small fraction."""
    if rng.random() < 0.2:
        return format_final(f"{int(rng.integers(1, 10))} / {int(rng.integers(2, 10))}")
    return format_final(str(int(rng.integers(-20, 101))))
