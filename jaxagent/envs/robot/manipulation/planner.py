"""The scripted planner: the task's plan as tool calls, optionally with mistakes.

It follows ``task.data["plan"]`` and ends with ``Final : done``. With ``error_rate`` p, each
step independently (per-step probability q = 1 - (1 - p) ** (1 / steps), so a p fraction of
episodes has a mistake) does one of: skip the step, name another object, name another
location or direction. Most mistakes fail the task (a skipped ``move_to`` makes the grasp
refuse, another object leaves the sub-goal unmet), which is what SFT on its imperfect
demonstrations inherits and RL can then correct.
"""

from __future__ import annotations

import numpy as np

from jaxagent.envs.base import Task
from jaxagent.envs.robot.manipulation.env import TOOLS
from jaxagent.envs.robot.manipulation.skills import DIRECTIONS


def format_call(tool: str, args) -> str:
    names = TOOLS[tool].param_order
    inner = " , ".join(f'{k} = " {v} "' for k, v in zip(names, args))
    return f"Action : {tool} ( {inner} )" if inner else f"Action : {tool} ( )"


def _other(value: str, objects, rng: np.random.Generator) -> str:
    """Another direction, location or object of the same kind among the scene's ``objects``."""
    if value in DIRECTIONS:
        pool = list(DIRECTIONS)
    elif value == "tray" or value.endswith("cup"):
        pool = ["tray", *(o for o in objects if o.endswith(" cup"))]
    else:
        pool = [o for o in objects if o.endswith(" block")]
    return str(rng.choice([v for v in pool if v != value]))


class ScriptedPlanner:
    """``act(observation) -> action``: the plan one call per step, then ``Final : done``."""

    def __init__(self, task: Task, error_rate: float = 0.0, rng: np.random.Generator | None = None):
        if not 0.0 <= error_rate <= 1.0:
            raise ValueError(f"error_rate must be in [0, 1], got {error_rate}")
        self.rng = rng if rng is not None else np.random.default_rng(0)
        self.plan = [tuple(s) for s in task.data["plan"]]
        self.objects = list(task.data["layout"])
        self.step_error = 1.0 - (1.0 - error_rate) ** (1.0 / (len(self.plan) + 1))
        self.errors: list[tuple[int, str]] = []
        self._i = 0

    def act(self, observation: str) -> str:
        del observation  # open loop: the plan does not depend on what the skills report
        while self._i < len(self.plan):
            i, (tool, *args) = self._i, self.plan[self._i]
            self._i += 1
            if self.rng.random() >= self.step_error:
                return format_call(tool, args)
            kind = str(self.rng.choice(["skip", "argument"]))
            self.errors.append((i, kind))
            if kind == "skip":
                continue
            k = int(self.rng.integers(len(args)))
            args = [_other(a, self.objects, self.rng) if j == k else a for j, a in enumerate(args)]
            return format_call(tool, args)
        return "Final : done"
