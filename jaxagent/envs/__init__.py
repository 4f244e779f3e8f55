"""Environment protocol and suites. Host-side only: nothing here imports JAX.

``jaxagent.envs.registry`` maps ``env.name`` to a suite; each suite registers itself (with
its typed options) in its own package, and the registry imports it on first lookup. A world of
one's own needs only this package's names::

    from jaxagent.envs import EnvSpec, StepResult, Task, register_env

    register_env("echo", lambda options: EnvSpec(name="echo", make_source=..., make_env=...,
                                                 system_prompt="..."))
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
from jaxagent.envs.registry import EnvSpec, NoOptions, env_names, get_env_spec, register_env

__all__ = [
    "ArrayEnv",
    "EnvSpec",
    "FailureMode",
    "NoOptions",
    "StepResult",
    "Task",
    "TaskSource",
    "Termination",
    "TextEnv",
    "env_names",
    "get_env_spec",
    "register_env",
]
