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
        check_extras=safety_counts,
    )


def safety_counts(tasks, runs) -> dict:
    """Each policy's safety events summed over its episodes (blocks knocked off the table,
    contact-force limits hit, unreachable targets): the scripted planner should have none."""
    del tasks
    keys = ("knocked_off", "contact_force", "unreachable")
    out = {}
    for name, run in runs.items():
        out[name] = {
            k: sum(e.final.info.get("safety", {}).get(k, 0) for e in run.episodes) for k in keys
        }
    return {"safety": out}


register_env("manipulation", build, options=ManipulationOptions)
