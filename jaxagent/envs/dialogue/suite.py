"""The dialogue suite in the registry (``env.name: dialogue``)."""

from __future__ import annotations

import dataclasses
import functools

from jaxagent.envs.dialogue.domain import DialogueConfig, DialogueSource, SimulatorConfig
from jaxagent.envs.dialogue.env import DialogueEnv, DialogueEnvConfig
from jaxagent.envs.dialogue.policies import TextPolicy, make_expert, random_policy
from jaxagent.envs.dialogue.vocab import vocabulary
from jaxagent.envs.registry import FLATTEN, EnvSpec, register_env

SYSTEM_PROMPT = (
    "You are a flight-booking agent. Acts: request <slot> | confirm <slot> <value> | "
    "query <phrases> | offer <flight> | book <flight> | end. Slots: origin destination day "
    "time class."
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DialogueOptions:
    """``env.options`` of the dialogue suite (flat keys: goals and splits, the simulator, the
    episode and reward) and whether to send the system prompt."""

    goals: DialogueConfig = dataclasses.field(default_factory=DialogueConfig, metadata=FLATTEN)
    sim: SimulatorConfig = dataclasses.field(default_factory=SimulatorConfig, metadata=FLATTEN)
    env: DialogueEnvConfig = dataclasses.field(default_factory=DialogueEnvConfig, metadata=FLATTEN)
    system_prompt: bool = False  # off by default: the tiny from-scratch model needs short rows


def build(options: DialogueOptions) -> EnvSpec:
    source = DialogueSource(options.goals, options.sim)
    return EnvSpec(
        name="dialogue",
        make_source=lambda: source,
        make_env=functools.partial(DialogueEnv, options.env),
        system_prompt=SYSTEM_PROMPT if options.system_prompt else "",
        vocabulary=vocabulary,
        make_expert=make_expert,
        make_random=make_random,
    )


def make_random(task, rng) -> TextPolicy:
    """A uniformly random dialogue act each turn, over the same tracker as the expert."""
    del task
    return TextPolicy(random_policy(rng))


register_env("dialogue", build, options=DialogueOptions)
