"""The code suite as the trainer's registry wants it: options -> task source, env, expert.

``jaxagent.train.envs`` (the trainer's registry) can register the suite as::

    def _code(options):
        from jaxagent.envs.code import suite
        s = suite.build(options)
        return EnvSpec(name="code", make_source=lambda: s.source, make_env=s.make_env,
                       system_prompt=s.system_prompt, make_expert=s.make_expert)

Nothing here imports the trainer (``envs`` knows nothing of ``train``).
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any, Mapping

from jaxagent.envs.base import Task
from jaxagent.envs.code.env import CodeEnv, CodeEnvConfig
from jaxagent.envs.code.sandbox import SandboxConfig
from jaxagent.envs.code.tasks import CodeTaskSource

SYSTEM_PROMPT = (
    "You write Python functions. Answer with the complete function definition in one "
    "```python code block; it is run against hidden unit tests in a sandbox."
)
_SOURCE_FIELDS = ("num_train", "num_validation", "seed")
_ENV_FIELDS = ("reward", "max_turns", "feedback_chars")
_SANDBOX_FIELDS = (
    "timeout_s",
    "call_timeout_s",
    "memory_mb",
    "max_processes",
    "max_output_bytes",
)


@dataclasses.dataclass(frozen=True)
class CodeSuite:
    source: CodeTaskSource
    env_config: CodeEnvConfig
    system_prompt: str = SYSTEM_PROMPT

    def make_env(self) -> CodeEnv:
        return CodeEnv(self.env_config)

    def make_expert(self, task: Task, error_rate: float, rng: Any) -> "CanonicalExpert":
        return CanonicalExpert(task, error_rate, rng)


def build(options: Mapping[str, Any] | None = None) -> CodeSuite:
    """Builds the suite from ``env.options``; unknown keys raise naming the allowed ones."""
    groups: list[dict] = [{}, {}, {}]
    fields = (_SOURCE_FIELDS, _ENV_FIELDS, _SANDBOX_FIELDS)
    for key, value in (options or {}).items():
        for group, names in zip(groups, fields):
            if key in names:
                group[key] = value
                break
        else:
            allowed = sorted(n for names in fields for n in names)
            raise ValueError(
                f"unknown option env.options.{key}={value!r} for env 'code'; allowed: {allowed}"
            )
    source = CodeTaskSource(**groups[0])
    env_config = CodeEnvConfig(**groups[1], sandbox=SandboxConfig(**groups[2]))
    return CodeSuite(source, env_config)


class CanonicalExpert:
    """Scripted expert for SFT warm-starts: answers with the task's reference solution, or,
    with probability ``error_rate`` per turn, a wrong one (so the multi-turn variant also
    shows recoveries from feedback)."""

    def __init__(self, task: Task, error_rate: float, rng: Any = None):
        if not 0.0 <= error_rate <= 1.0:
            raise ValueError(f"error_rate={error_rate} is invalid: use a value in [0, 1]")
        self.task, self.error_rate = task, error_rate
        self.rng = rng if rng is not None else random.Random(0)

    def act(self, observation: str) -> str:
        del observation
        draw = self.rng.random() if hasattr(self.rng, "random") else float(self.rng.uniform())
        body = self.task.data["canonical_solution"]
        if draw < self.error_rate:
            body = "    return None\n"
        return f"```python\n{self.task.prompt}{body}```"
