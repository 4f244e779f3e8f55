"""The web suites in the registry: ``env.name: shop``, ``booking`` (embedded) and ``miniwob``."""

from __future__ import annotations

import dataclasses
import functools

from jaxagent.envs.registry import FLATTEN, EnvSpec, register_env
from jaxagent.envs.web.actions import USAGE
from jaxagent.envs.web.env import WebEnv, WebEnvConfig
from jaxagent.envs.web.check import embedded_extras, miniwob_extras
from jaxagent.envs.web.expert import ExpertPolicy, random_action
from jaxagent.envs.web.miniwob import MiniWoBEnvConfig, MiniWoBTasksConfig
from jaxagent.envs.web.tasks import WebTasksConfig, WebWorld
from jaxagent.envs.web.vocab import vocabulary


def system_prompt() -> str:
    usage = " ; ".join(USAGE.values())
    return (
        "you browse a website that you see through a small view of its elements . "
        f"act with one action a turn : {usage}"
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class WebOptions:
    """``env.options`` of the embedded sites: task source and episode settings (flat keys:
    ``num_train``, ``train_layouts``, ``viewport``, ``max_steps``, ``reward`` ...)."""

    world: WebTasksConfig = dataclasses.field(default_factory=WebTasksConfig, metadata=FLATTEN)
    env: WebEnvConfig = dataclasses.field(default_factory=WebEnvConfig, metadata=FLATTEN)
    # Off by default: the tiny from-scratch model learns the action syntax from demonstrations
    # and a long prompt only lengthens every sequence.
    system_prompt: bool = False


def _build(site: str, options: WebOptions) -> EnvSpec:
    world = WebWorld(site, options.world)
    return EnvSpec(
        name=site,
        make_source=lambda: world,
        make_env=functools.partial(WebEnv, options.env),
        system_prompt=system_prompt() if options.system_prompt else "",
        vocabulary=vocabulary,
        make_expert=ExpertPolicy,
        make_random=RandomPolicy,
        check_extras=functools.partial(embedded_extras, options.env),
        task_group=lambda task: str(task.data["layout_id"]),
    )


class RandomPolicy:
    """A uniformly random action over the visible elements (and scroll, back, finish)."""

    def __init__(self, task, rng):
        del task
        self.rng = rng

    def act(self, observation: str) -> str:
        return random_action(observation, self.rng)


build_shop = functools.partial(_build, "shop")
build_booking = functools.partial(_build, "booking")

register_env("shop", build_shop, options=WebOptions)
register_env("booking", build_booking, options=WebOptions)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MiniWoBOptions:
    """``env.options`` of MiniWoB++ (flat keys: ``tasks``, ``num_train``, ``max_ms`` ...)."""

    world: MiniWoBTasksConfig = dataclasses.field(
        default_factory=MiniWoBTasksConfig, metadata=FLATTEN
    )
    env: MiniWoBEnvConfig = dataclasses.field(default_factory=MiniWoBEnvConfig, metadata=FLATTEN)
    system_prompt: bool = True  # open vocabulary (BPE): the action syntax helps a real LM


def build_miniwob(options: MiniWoBOptions) -> EnvSpec:
    from jaxagent.envs.web.miniwob import MiniWoBEnv, MiniWoBTasks
    from jaxagent.envs.web.miniwob_solvers import MiniWoBSolver

    source = MiniWoBTasks(options.world)
    return EnvSpec(
        name="miniwob",
        make_source=lambda: source,
        make_env=functools.partial(MiniWoBEnv, options.env),
        system_prompt=system_prompt() if options.system_prompt else "",
        make_expert=MiniWoBSolver,
        check_extras=functools.partial(miniwob_extras, options.env),
        task_group=lambda task: task.data["task"],
    )


register_env("miniwob", build_miniwob, options=MiniWoBOptions)
