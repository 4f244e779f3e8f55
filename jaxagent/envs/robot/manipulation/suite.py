"""The manipulation suite in the registry (``env.name: manipulation``)."""

from __future__ import annotations

import dataclasses
import functools

from jaxagent.envs.registry import FLATTEN, EnvSpec, register_env
from jaxagent.envs.robot.manipulation.env import ManipulationEnv, ManipulationEnvConfig
from jaxagent.envs.robot.manipulation.planner import ScriptedPlanner
from jaxagent.envs.robot.manipulation.tasks import ManipulationConfig, ManipulationWorld
from jaxagent.envs.robot.manipulation.vocab import vocabulary


@dataclasses.dataclass(frozen=True, kw_only=True)
class ManipulationOptions:
    """``env.options``: the task source's and the episode's settings (flat keys)."""

    world: ManipulationConfig = dataclasses.field(
        default_factory=ManipulationConfig, metadata=FLATTEN
    )
    env: ManipulationEnvConfig = dataclasses.field(
        default_factory=ManipulationEnvConfig, metadata=FLATTEN
    )


def build(options: ManipulationOptions) -> EnvSpec:
    world = ManipulationWorld(options.world)
    return EnvSpec(
        name="manipulation",
        make_source=lambda: world,
        make_env=functools.partial(ManipulationEnv, options.env),
        system_prompt="",
        vocabulary=vocabulary,
        make_expert=ScriptedPlanner,
    )


register_env("manipulation", build, options=ManipulationOptions)
