"""Environment protocol and suites. Host-side only: nothing here imports JAX."""

from jaxagent.envs.base import (
    ArrayEnv,
    FailureMode,
    StepResult,
    Task,
    TaskSource,
    Termination,
    TextEnv,
)

__all__ = [
    "ArrayEnv",
    "FailureMode",
    "StepResult",
    "Task",
    "TaskSource",
    "Termination",
    "TextEnv",
]
