"""Environment protocol and suites. Host-side only: nothing here imports JAX.

``jaxagent.envs.registry`` maps ``env.name`` to a suite; each suite registers itself (with
its typed options) in its own package, and the registry imports it on first lookup.
"""

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
