"""The code suite in the registry (``env.name: code``): options -> task source, env, expert."""

from __future__ import annotations

import dataclasses
import functools
import random
from typing import Any, Mapping

from jaxagent.envs.base import Task
from jaxagent.envs.code.env import CodeEnv, CodeEnvConfig
from jaxagent.envs.code.tasks import CodeTaskSource
from jaxagent.envs.registry import FLATTEN, EnvSpec, parse_options, register_env

SYSTEM_PROMPT = (
    "You write Python functions. Answer with the complete function definition in one "
    "```python code block; it is run against hidden unit tests in a sandbox."
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CodeOptions:
    """``env.options`` of the code suite, flat: the source's keys (``num_train``,
    ``num_validation``, ``seed``), the episode's (``reward``, ``max_turns``,
    ``feedback_chars``) and the sandbox's (``timeout_s``, ``memory_mb``, ...)."""

    source: CodeTaskSource = dataclasses.field(default_factory=CodeTaskSource, metadata=FLATTEN)
    env: CodeEnvConfig = dataclasses.field(default_factory=CodeEnvConfig, metadata=FLATTEN)


@dataclasses.dataclass(frozen=True)
class CodeSuite:
    source: CodeTaskSource
    env_config: CodeEnvConfig
    system_prompt: str = SYSTEM_PROMPT

    def make_env(self) -> CodeEnv:
        return CodeEnv(self.env_config)

    def make_expert(self, task: Task, error_rate: float, rng: Any) -> "CanonicalExpert":
        return CanonicalExpert(task, error_rate, rng)


def build(options: CodeOptions | Mapping[str, Any] | None = None) -> CodeSuite:
    """The suite from typed options or a raw ``env.options`` mapping (validated)."""
    opts = parse_options("code", options)
    return CodeSuite(opts.source, opts.env)


def spec(options: CodeOptions) -> EnvSpec:
    s = build(options)
    return EnvSpec(
        name="code",
        make_source=lambda: s.source,
        make_env=functools.partial(CodeEnv, s.env_config),
        system_prompt=s.system_prompt,
        make_expert=CanonicalExpert,
    )


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


register_env("code", spec, options=CodeOptions)
