"""The quickstart suite in the registry (``env.name: quickstart``)."""

from __future__ import annotations

import dataclasses
import functools

from jaxagent.envs.registry import FLATTEN, EnvSpec, register_env
from jaxagent.envs.tools.quickstart.env import QuickstartEnv, QuickstartEnvConfig
from jaxagent.envs.tools.quickstart.expert import ExpertPolicy
from jaxagent.envs.tools.quickstart.tasks import QuickstartConfig, QuickstartWorld
from jaxagent.envs.tools.quickstart.vocab import vocabulary
from jaxagent.envs.tools.quickstart.world import system_prompt


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuickstartOptions:
    """``env.options`` of the quickstart suite: the task source's and the episode's settings
    (flat keys: ``num_train``, ``max_steps``, ...) and whether to send the system prompt."""

    world: QuickstartConfig = dataclasses.field(default_factory=QuickstartConfig, metadata=FLATTEN)
    env: QuickstartEnvConfig = dataclasses.field(
        default_factory=QuickstartEnvConfig, metadata=FLATTEN
    )
    # The reset observation already lists the task's tools with their signatures; the long
    # system prompt (format + docs of all tools) is off by default to keep sequences short
    # for the tiny from-scratch model.
    system_prompt: bool = False


def build(options: QuickstartOptions) -> EnvSpec:
    world = QuickstartWorld(options.world)
    return EnvSpec(
        name="quickstart",
        make_source=lambda: world,
        make_env=functools.partial(QuickstartEnv, options.env),
        system_prompt=system_prompt() if options.system_prompt else "",
        vocabulary=vocabulary,
        make_expert=ExpertPolicy,
    )


register_env("quickstart", build, options=QuickstartOptions)
