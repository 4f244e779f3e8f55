"""The math suite in the registry (``env.name: math``)."""

from __future__ import annotations

import dataclasses
import functools

from jaxagent.envs.math.env import MathEnv, MathEnvConfig
from jaxagent.envs.math.expert import MathExpert, random_action
from jaxagent.envs.math.problems import MathConfig, MathSource
from jaxagent.envs.math.vocab import vocabulary
from jaxagent.envs.registry import FLATTEN, EnvSpec, register_env

SYSTEM_PROMPT = (
    "Solve the math problem. Answer with Final : <answer> (a whole number or a fraction "
    'a / b). With the calculator, call Action : calc ( expr = " <expression> " ) first.'
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MathOptions:
    """``env.options`` of the math suite (flat keys: ``num_train``, ``levels``, ``holdout``,
    ``variant``, ``max_steps``, ...) and whether to send the system prompt."""

    problems: MathConfig = dataclasses.field(default_factory=MathConfig, metadata=FLATTEN)
    env: MathEnvConfig = dataclasses.field(default_factory=MathEnvConfig, metadata=FLATTEN)
    system_prompt: bool = False  # off by default: the tiny from-scratch model needs short rows


def build(options: MathOptions) -> EnvSpec:
    source = MathSource(options.problems)
    return EnvSpec(
        name="math",
        make_source=lambda: source,
        make_env=functools.partial(MathEnv, options.env),
        system_prompt=SYSTEM_PROMPT if options.system_prompt else "",
        vocabulary=vocabulary,
        make_expert=functools.partial(_expert, variant=options.env.variant),
        make_random=RandomAnswer,
    )


class RandomAnswer:
    """A random final answer each turn (an integer in [-20, 100] or a small fraction)."""

    def __init__(self, task, rng):
        self.task, self.rng = task, rng

    def act(self, observation: str) -> str:
        del observation
        return random_action(self.task, self.rng)


def _expert(task, error_rate, rng, *, variant):
    return MathExpert(task, error_rate, rng, variant=variant)


register_env("math", build, options=MathOptions)
