"""Scripted policies for the quickstart world: the expert (with errors), random and empty.

The expert follows the task's plan closed-loop: it reads each observation to learn the value a
call returned and uses what it *observed* in later calls, so its demonstrations are consistent
with the transcript. With ``error_rate`` p it makes, independently at each step, one of the
mistakes RL can fix (wrong tool, wrong argument, skipped step, wrong final answer) with the
per-step probability q = 1 - (1 - p) ** (1 / steps), so that a p fraction of its episodes
contain an error. Every such error makes the episode fail (the world guarantees distinct
prices, quotes, temperatures and events), so its success rate is about 1 - p.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from jaxagent.envs.base import Task, run_episode
from jaxagent.envs.tools.quickstart import tasks as T
from jaxagent.envs.tools.quickstart import world as W
from jaxagent.envs.tools.quickstart.env import QuickstartEnv

_WRONG_TOOL = {"price": "quote", "quote": "price", "add": "mul", "mul": "add"}


def format_call(tool: str, kwargs: dict[str, Any]) -> str:
    """``Action : mul ( a = 12 , b = 3 )``; strings are quoted as separate words."""
    parts = [f'{k} = " {v} "' if isinstance(v, str) else f"{k} = {v}" for k, v in kwargs.items()]
    return f"Action : {tool} ( {' , '.join(parts)} )"


def format_final(answer: Any) -> str:
    return f"Final : {answer}"


def _true_bindings(task: Task) -> dict[str, Any]:
    env: dict[str, Any] = {}
    state = task.data["state"]
    for step in task.data["plan"]:
        kwargs = {k: T.resolve(v, env) for k, v in step["args"].items()}
        result, state, _ = W.execute(state, step["tool"], kwargs)
        if step["bind"]:
            env[step["bind"]] = T.parse_value(result)
    return env


def _other(value: Any, rng: np.random.Generator, choices=None, avoid: Any = None) -> Any:
    """A plausible value of the same kind, different from ``value`` and from ``avoid`` (the
    true value, so that a mistake never cancels an earlier one)."""
    if isinstance(value, int):
        lo, hi = max(0, value - 5), min(W.MAX_INT, value + 5)
        pool = [v for v in range(lo, hi + 1) if v not in (value, avoid)]
        return int(rng.choice(pool))
    pool = [c for c in (choices or W.EVENTS) if c not in (value, avoid)]
    return str(rng.choice(pool))


class ExpertPolicy:
    """Closed-loop scripted expert for one task. ``act(observation) -> action text``."""

    def __init__(self, task: Task, error_rate: float = 0.0, rng: np.random.Generator | None = None):
        if not 0.0 <= error_rate <= 1.0:
            raise ValueError(f"error_rate must be in [0, 1], got {error_rate}")
        self.task, self.rng = task, rng if rng is not None else np.random.default_rng(0)
        self.plan, self.final = task.data["plan"], task.data["final"]
        steps = len(self.plan) + 1
        self.step_error = 1.0 - (1.0 - error_rate) ** (1.0 / steps)
        self.truth = _true_bindings(task)
        self.values: dict[str, Any] = {}
        self.errors: list[tuple[int, str]] = []  # (plan step, kind) of each error made
        self._i, self._pending = 0, None

    def _value(self, ref: Any) -> Any:
        """The believed value of an argument; made up when unbound or of the wrong kind."""
        if not (isinstance(ref, dict) and "ref" in ref):
            return ref
        var = ref["ref"]
        true, seen = self.truth[var], self.values.get(var)
        if seen is None or type(seen) is not type(true):
            seen = _other(true, self.rng)
            self.values[var] = seen
        return seen

    def act(self, observation: str) -> str:
        if self._pending is not None:
            text = observation.split(":", 1)[1] if ":" in observation else observation
            self.values[self._pending] = T.parse_value(text)
            self._pending = None
        err = self.rng.random() < self.step_error
        while self._i < len(self.plan):
            step, index = self.plan[self._i], self._i
            self._i += 1
            tool = step["tool"]
            kwargs = {k: self._value(v) for k, v in step["args"].items()}
            if err:
                kinds = ["wrong_arg", "skip"] + (["wrong_tool"] if tool in _WRONG_TOOL else [])
                kind = str(self.rng.choice(kinds))
                self.errors.append((index, kind))
                if kind == "skip":
                    err = self.rng.random() < self.step_error  # the next step draws afresh
                    continue
                if kind == "wrong_tool":
                    tool = _WRONG_TOOL[tool]
                else:
                    arg = str(self.rng.choice(list(kwargs)))
                    enum = W.TOOL_SPECS[tool].parameters["properties"][arg].get("enum")
                    true = T.resolve(step["args"][arg], self.truth)
                    kwargs[arg] = _other(kwargs[arg], self.rng, enum, avoid=true)
            self._pending = step["bind"]
            return format_call(tool, kwargs)
        answer = self._value(self.final)
        if err:
            self.errors.append((len(self.plan), "wrong_final"))
            true = T.resolve(self.final, self.truth)
            answer = _other(answer if answer != "done" else 0, self.rng, avoid=true)
        return format_final(answer)


def random_action(task: Task, rng: np.random.Generator) -> str:
    """A uniformly random call to a listed tool (valid argument kinds), or a random final."""
    if rng.random() < 0.25:
        return format_final(str(rng.choice(["done", *W.EVENTS, *map(str, range(40))])))
    tool = str(rng.choice(task.data["tools"]))
    kwargs = {}
    for arg, schema in W.TOOL_SPECS[tool].parameters["properties"].items():
        kwargs[arg] = (
            str(rng.choice(schema["enum"])) if "enum" in schema else int(rng.integers(0, 100))
        )
    return format_call(tool, kwargs)


def expert_episode(
    task: Task, error_rate: float, rng: np.random.Generator, env: QuickstartEnv | None = None
):
    """One expert demonstration: (observations, actions, last StepResult)."""
    expert = ExpertPolicy(task, error_rate, rng)
    return run_episode(env or QuickstartEnv(), task, expert.act)


def success_rate(
    tasks, make_policy: Callable[[Task], Callable[[str], str]], env: QuickstartEnv | None = None
) -> float:
    """Fraction of ``tasks`` solved by ``make_policy(task)``."""
    env = env or QuickstartEnv()
    wins = sum(bool(run_episode(env, t, make_policy(t))[2].info["success"]) for t in tasks)
    return wins / max(1, len(tasks))
