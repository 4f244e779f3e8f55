"""The quickstart suite in the registry (``env.name: quickstart``)."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from jaxagent.envs.registry import FLATTEN, EnvSpec, register_env
from jaxagent.envs.tools.quickstart.env import QuickstartEnv, QuickstartEnvConfig
from jaxagent.envs.base import run_episode
from jaxagent.envs.tools.quickstart.expert import ExpertPolicy, random_action
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
        make_random=RandomPolicy,
        task_group=level_of,
        check_extras=functools.partial(check_extras, options.env),
    )


def level_of(task) -> str:
    return task.data["level"]


class RandomPolicy:
    """A uniformly random call to a listed tool or a random final answer, each turn."""

    def __init__(self, task, rng):
        self.task, self.rng = task, rng

    def act(self, observation: str) -> str:
        del observation
        return random_action(self.task, self.rng)


def check_extras(env_config, tasks, runs) -> dict:
    """The expert at a 30% error rate (about 0.7: it recovers from some of its errors, so
    the tasks reward recovery, not only a perfect script)."""
    del runs
    rng = np.random.default_rng(0)
    env = QuickstartEnv(env_config)
    noisy = [run_episode(env, t, ExpertPolicy(t, 0.3, rng).act)[2].info["success"] for t in tasks]
    return {
        "expert_30pct_success": float(np.mean(noisy)),
    }


register_env("quickstart", build, options=QuickstartOptions)
