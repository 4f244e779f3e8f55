"""Code-generation environment: write a function, get unit-test rewards (single or multi-turn).

Each action is the model's answer (a fenced ```python block or bare code). The code runs in
the sandbox against the task's hidden tests; the harness (outside the candidate's reach)
records each test. Rewards: ``"shaped"`` = fraction of tests passed, ``"binary"`` = 1 only if
all pass. With ``max_turns > 1`` a failed attempt is not the end: the execution feedback (the
failing test, the error, the tail of stdout/stderr) is the next observation and the agent may
revise (the state is the code so far plus the test results). Only the last attempt is rewarded;
each attempt's test fraction is reported as the process reward term.

The feedback comes from the *public* tests (the examples in the problem's own prompt) run
separately, never from the hidden tests that set the reward: quoting a failing hidden test
with its expected value would let a probe-then-hardcode policy copy the answers. Where a
prompt has no examples the feedback is the program's own run (load errors, output) only.
"""

from __future__ import annotations

import dataclasses

from jaxagent.envs.base import FailureMode, StepResult, Task, env_error_info
from jaxagent.envs.code.sandbox import Sandbox, SandboxConfig, SandboxResult
from jaxagent.envs.code.tasks import assemble_program, extract_code, hidden_tests, public_tests
from jaxagent.envs.registry import FLATTEN

REWARDS = ("binary", "shaped")

INSTRUCTION = (
    "Complete the following Python function. Answer with the full function definition in a "
    "```python code block. Hidden unit tests will check it.\n\n"
)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CodeEnvConfig:
    reward: str = "binary"  # "binary" (all tests pass) or "shaped" (fraction of tests passed)
    max_turns: int = 1  # attempts per episode; > 1 feeds execution results back
    feedback_chars: int = 1500  # cap on the feedback observation
    # FLATTEN: the sandbox's fields are env.options keys of the code suite (timeout_s, ...)
    sandbox: SandboxConfig = dataclasses.field(default_factory=SandboxConfig, metadata=FLATTEN)

    def __post_init__(self):
        if self.reward not in REWARDS:
            raise ValueError(
                f"CodeEnvConfig.reward={self.reward!r} is invalid: choose one of {REWARDS}"
            )
        if self.max_turns < 1:
            raise ValueError(f"CodeEnvConfig.max_turns={self.max_turns} is invalid: use >= 1")
        if self.feedback_chars < 100:
            raise ValueError(
                f"CodeEnvConfig.feedback_chars={self.feedback_chars} is invalid: use >= 100"
            )


def _failure_mode(result: SandboxResult, code: str) -> FailureMode | None:
    if result.passed:
        return None
    if not code.strip():
        return FailureMode.GAVE_UP
    if result.status == "error":
        return FailureMode.ENV_ERROR
    if result.status == "timeout":
        return FailureMode.TIMEOUT
    if result.detail and "SyntaxError" in result.detail.split("\n", 2)[-1][:200]:
        return FailureMode.INVALID_SYNTAX
    return FailureMode.TESTS_FAILED


def feedback(result: SandboxResult | None, limit: int, public: bool = True) -> str:
    """The observation after a failed attempt: the hidden tests' verdict (no detail), then
    the public examples' status, first failing example and output tails."""
    parts = ["Hidden tests: not all passed."]
    if result is None:
        parts.append("Fix the function and answer with the full corrected definition.")
        return "\n".join(parts)
    if public:
        parts.append(
            f"Examples from the problem statement: {result.status} ({result.tests_passed}/"
            f"{result.tests_total} passed)."
        )
    else:
        parts.append(f"Running your program (no examples given): {result.status}.")
    if result.detail:
        parts.append(result.detail)
    for name, text in (("stdout", result.stdout), ("stderr", result.stderr)):
        if text.strip():
            parts.append(f"{name} (tail):\n{text[-400:]}")
    parts.append("Fix the function and answer with the full corrected definition.")
    text = "\n".join(parts)
    return text if len(text) <= limit else text[: limit - 16] + "\n...[truncated]"


class CodeEnv:
    """A ``TextEnv`` over code tasks. One episode at a time; the sandbox may be shared."""

    def __init__(self, config: CodeEnvConfig | None = None, sandbox: Sandbox | None = None):
        self.config = config or CodeEnvConfig()
        self._sandbox = sandbox
        self._owns_sandbox = sandbox is None
        self._task: Task | None = None
        self._turn = 0

    @property
    def sandbox(self) -> Sandbox:
        if self._sandbox is None:  # lazily, so pool workers build their own
            self._sandbox = Sandbox(self.config.sandbox)
        return self._sandbox

    def reset(self, task: Task) -> str:
        if "entry_point" not in task.data or "test" not in task.data:
            raise ValueError(
                f"task {task.id!r} lacks data['entry_point'] / data['test']; build "
                "code tasks with jaxagent.envs.code.tasks.CodeTaskSource"
            )
        self._task, self._turn = task, 0
        return INSTRUCTION + "```python\n" + task.prompt + "```"

    def step(self, action: str) -> StepResult:
        if self._task is None:
            raise RuntimeError("step() before reset(): call reset(task) first")
        self._turn += 1
        code = extract_code(action)
        result = self.sandbox.run(assemble_program(self._task, code), hidden_tests(self._task))
        fraction = result.fraction_passed if result.status != "error" else 0.0
        score = fraction if self.config.reward == "shaped" else float(result.passed)
        last = result.passed or self._turn >= self.config.max_turns or result.status == "error"
        mode = _failure_mode(result, code)
        info = {
            "reward_terms": {
                "process": fraction,
                "outcome": float(result.passed),
                "task": float(result.passed),
            },
            "failure_mode": mode.value if mode else None,
            "success": result.passed,
            "truncated": False,
            "sandbox_status": result.status,
            "tests_passed": result.tests_passed,
            "tests_total": result.tests_total,
            "turn": self._turn,
            "isolation": result.isolation,
        }
        if result.status == "error":  # the sandbox failed, not the candidate: ENV_ERROR
            info.update(env_error_info("sandbox", result.detail or ""))
        if last:
            self._task = None
            return StepResult(observation="", reward=score, done=True, info=info)
        return StepResult(observation=self._feedback(code), reward=0.0, done=False, info=info)

    def _feedback(self, code: str) -> str:
        program = assemble_program(self._task, code)
        spec = public_tests(self._task)
        result = self.sandbox.run(program, spec) if spec else self.sandbox.run(program)
        if result.status == "error":  # no feedback this turn; never an episode error
            result = None
        return feedback(result, self.config.feedback_chars, public=spec is not None)

    def close(self) -> None:
        if self._owns_sandbox and self._sandbox is not None:
            self._sandbox.close()
            self._sandbox = None


def make_code_env(env_id: int = 0, config: CodeEnvConfig | None = None) -> CodeEnv:
    """Factory for ``EnvPool(env_fn, ...)``: each pool worker gets its own env and sandbox."""
    del env_id
    return CodeEnv(config)
