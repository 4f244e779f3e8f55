"""The registry of environment suites the trainer can run (``env.name`` in a config).

An ``EnvSpec`` says how to build a suite's task source and environments from the config's
``env.options``, its system prompt, its closed vocabulary (for word-level tokenizers, when it
has one) and its scripted expert (for SFT warm-starts, when it has one). Suites are imported
lazily, so a missing optional package (``bfcl-eval``) only matters when that suite is used.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional

from jaxagent.envs.base import Task, TaskSource, TextEnv



@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """How the trainer builds one suite (all callables take the validated options)."""

    name: str
    make_source: Callable[[], TaskSource]
    make_env: Callable[[], TextEnv]
    system_prompt: str
    vocabulary: Optional[Callable[[], list[str]]] = None  # closed vocabulary, if any
    # make_expert(task, error_rate, rng) -> an object with act(observation) -> action text
    make_expert: Optional[Callable[[Task, float, Any], Any]] = None


def _split_options(name: str, options: Mapping[str, Any], groups: dict[str, tuple]) -> list[dict]:
    allowed = [k for fields in groups.values() for k in fields]
    out = [dict() for _ in groups]
    for key, value in options.items():
        for i, fields in enumerate(groups.values()):
            if key in fields:
                out[i][key] = tuple(value) if isinstance(value, list) else value
                break
        else:
            raise ValueError(f"unknown option env.options.{key} for env {name!r}; allowed: "
                             f"{sorted(allowed)}")
    return out


def _quickstart(options: Mapping[str, Any]) -> EnvSpec:
    from jaxagent.envs.tools import quickstart as Q

    world_fields = tuple(f.name for f in dataclasses.fields(Q.QuickstartConfig))
    env_fields = tuple(f.name for f in dataclasses.fields(Q.QuickstartEnvConfig))
    world_opts, env_opts, own = _split_options(
        "quickstart", options,
        {"world": world_fields, "env": env_fields, "own": ("system_prompt",)})
    world = Q.QuickstartWorld(**world_opts)
    env_config = Q.QuickstartEnvConfig(**env_opts)
    # The reset observation already lists the task's tools with their signatures; the long
    # system prompt (format + docs of all tools) is optional and off by default to keep
    # sequences short for the tiny from-scratch model.
    system = Q.system_prompt() if own.get("system_prompt", False) else ""
    return EnvSpec(
        name="quickstart", make_source=lambda: world,
        make_env=lambda: Q.QuickstartEnv(env_config), system_prompt=system,
        vocabulary=Q.vocabulary,
        make_expert=lambda task, error_rate, rng: Q.ExpertPolicy(task, error_rate, rng))


def _bfcl(options: Mapping[str, Any]) -> EnvSpec:
    from jaxagent.envs.tools import bfcl as B

    B.require_bfcl()  # raises with the install command when bfcl-eval is missing
    src_fields = tuple(f.name for f in dataclasses.fields(B.BFCLSourceConfig))
    env_fields = tuple(f.name for f in dataclasses.fields(B.BFCLEnvConfig))
    src_opts, env_opts = _split_options("bfcl", options,
                                        {"source": src_fields, "env": env_fields})
    source = B.BFCLSource(**src_opts)
    env_config = B.BFCLEnvConfig(**env_opts)
    return EnvSpec(name="bfcl", make_source=lambda: source,
                   make_env=lambda: B.BFCLEnv(env_config), system_prompt=B.system_prompt())


def _code(options: Mapping[str, Any]) -> EnvSpec:
    from jaxagent.envs.code import suite

    s = suite.build(options)
    return EnvSpec(name="code", make_source=lambda: s.source, make_env=s.make_env,
                   system_prompt=s.system_prompt, make_expert=s.make_expert)


_BUILDERS: dict[str, Callable[[Mapping[str, Any]], EnvSpec]] = {
    "quickstart": _quickstart,
    "bfcl": _bfcl,
    "code": _code,
}


def env_names() -> tuple[str, ...]:
    """Names accepted by ``env.name``."""
    return tuple(_BUILDERS)


def register_env(name: str, builder: Callable[[Mapping[str, Any]], EnvSpec]) -> None:
    """Add a suite: ``builder(options) -> EnvSpec``. Raises on a duplicate name."""
    if name in _BUILDERS:
        raise ValueError(f"env {name!r} is already registered")
    _BUILDERS[name] = builder


def get_env_spec(name: str, options: Optional[Mapping[str, Any]] = None) -> EnvSpec:
    """The ``EnvSpec`` of a registered suite; raises naming the known suites."""
    if name not in _BUILDERS:
        raise KeyError(f"unknown env {name!r}; known envs: {list(env_names())}")
    return _BUILDERS[name](options or {})
