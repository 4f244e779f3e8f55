"""MathEnv: verifiable-reward math as a ``TextEnv``, answer-only or with a calculator tool.

``variant="answer"`` (single turn): the first action is the answer, as ``Final : 5 / 6``,
``\\boxed{5/6}`` or bare text; reward 1 when ``checker.is_equivalent`` says it equals the
gold answer, else 0, and the episode ends. ``variant="tool"``: the agent may call
``calc ( expr = " ( 19 - 4 ) / 3 " )`` (exact rational arithmetic) any number of times within
``max_steps`` and ends with ``Final : <answer>``; a malformed call or a calculator error comes
back as an observation and costs a step.

Failure modes: ``wrong_answer`` (an answer that parses to another value), ``invalid_syntax``
(an answer no value can be read from, or a malformed call), ``gave_up`` (empty), ``tool_error``
(the calculator refused the expression; per step), ``step_budget`` (a truncation), and
``env_error`` when the checker itself raises (never blamed on the policy).
"""

from __future__ import annotations

import dataclasses

from jaxagent.envs import actions as A
from jaxagent.envs.tool_spec import ActionError, ErrorKind, ToolSpec
from jaxagent.envs.base import FailureMode, StepResult, Task, Termination, env_error_info
from jaxagent.envs.math import checker
from jaxagent.envs.math.calc import CalcError, evaluate, format_value
from jaxagent.envs.rewards import reward_terms

VARIANTS = ("answer", "tool")
CALC = ToolSpec(
    name="calc",
    description="exact arithmetic: + - * / and parentheses",
    parameters={
        "type": "object",
        "properties": {"expr": {"type": "string"}},
        "required": ["expr"],
    },
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MathEnvConfig:
    """Episode settings. Reward: 1 for a right final answer, 0 otherwise (RLVR)."""

    variant: str = "answer"  # "answer" (single turn) | "tool" (calculator calls, then Final)
    max_steps: int = 4  # actions per episode in the tool variant before truncation

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ValueError(f"MathEnvConfig.variant={self.variant!r}: choose one of {VARIANTS}")
        if self.max_steps < 1:
            raise ValueError(f"MathEnvConfig.max_steps must be >= 1, got {self.max_steps}")


def reset_observation(task: Task, variant: str) -> str:
    tools = " tools : calc ( expr )" if variant == "tool" else ""
    return f"problem : {task.prompt}{tools}"


class MathEnv:
    """One episode at a time over math tasks (``TextEnv`` protocol)."""

    def __init__(self, config: MathEnvConfig | None = None, **overrides):
        self.config = dataclasses.replace(config or MathEnvConfig(), **overrides)
        self._task: Task | None = None
        self._done = True

    def reset(self, task: Task) -> str:
        self._task, self._steps, self._done = task, 0, False
        return reset_observation(task, self.config.variant)

    def step(self, action: str) -> StepResult:
        if self._task is None or self._done:
            raise RuntimeError("MathEnv.step called before reset() or after the episode ended")
        self._steps += 1
        if self.config.variant == "answer":
            return self._finish(action)
        parsed = A.parse_action(action)
        if isinstance(parsed, ActionError):
            if parsed.kind == ErrorKind.EMPTY:
                return self._finish("")
            return self._continue("error : bad syntax", FailureMode.INVALID_SYNTAX)
        if parsed.is_final:
            return self._finish(parsed.final)
        if len(parsed.calls) != 1 or parsed.calls[0].name != "calc":
            return self._continue("error : unknown tool", FailureMode.UNKNOWN_TOOL)
        bound = A.bind_call(parsed.calls[0], CALC)
        if isinstance(bound, ActionError):
            return self._continue("error : bad argument expr", FailureMode.BAD_ARGUMENTS)
        try:
            value = format_value(evaluate(bound.kwargs["expr"]))
        except CalcError:
            return self._continue("error : calc failed", FailureMode.TOOL_ERROR)
        return self._continue(value, None)

    def _continue(self, text: str, mode) -> StepResult:
        if self._steps >= self.config.max_steps:
            return self._finish(None, truncated=True)
        info = {
            "reward_terms": reward_terms(process=float(mode is None)),
            "failure_mode": mode and mode.value,
            "truncated": False,
            "success": False,
        }
        return StepResult(f"Observation : {text}", 0.0, False, info)

    def _finish(self, answer: str | None, truncated: bool = False) -> StepResult:
        self._done = True
        data = self._task.data
        try:
            right = answer is not None and checker.is_equivalent(
                answer, data["answer"], percent=bool(data.get("percent"))
            )
            readable = right or (
                answer is not None
                and checker.parse_value(checker.extract_answer(answer)) is not None
            )
        except Exception as exc:  # the checker's bug, not the policy's failure
            info = env_error_info("exception", f"{type(exc).__name__}: {exc}")
            return StepResult("Observation : done", 0.0, True, info)
        if truncated:
            mode = FailureMode.STEP_BUDGET
        elif right:
            mode = None
        elif answer is None or not answer.strip():
            mode = FailureMode.GAVE_UP
        else:
            mode = FailureMode.WRONG_ANSWER if readable else FailureMode.INVALID_SYNTAX
        info = {
            "reward_terms": reward_terms(1.0, float(right), float(right)),
            "failure_mode": mode and mode.value,
            "truncated": truncated,
            "success": bool(right),
            "termination": (Termination.TRUNCATED if truncated else Termination.TERMINATED).value,
        }
        obs = "Observation : step budget over" if truncated else "Observation : done"
        return StepResult(obs, float(right), True, info)

    def close(self) -> None:
        self._task = None
