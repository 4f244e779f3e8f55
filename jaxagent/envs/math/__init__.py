"""Verifiable math (RLVR): generated problems by level and difficulty, an exact answer checker
(normalisation, ``fractions`` and sympy equivalence), answer-only and calculator-tool
variants, template / difficulty splits with a leakage check, a scripted expert.

See ``problems`` (generators, splits), ``calc`` (the calculator), ``checker`` (answer
checking), ``env`` (the TextEnv), ``expert`` and ``suite`` (the registry entry). Never imports
JAX.
"""

from jaxagent.envs.math.checker import extract_answer, is_equivalent, normalize, parse_value
from jaxagent.envs.math.env import MathEnv, MathEnvConfig
from jaxagent.envs.math.expert import MathExpert, random_action
from jaxagent.envs.math.problems import LEVELS, MathConfig, MathSource

__all__ = [
    "LEVELS",
    "MathConfig",
    "MathEnv",
    "MathEnvConfig",
    "MathExpert",
    "MathSource",
    "extract_answer",
    "is_equivalent",
    "normalize",
    "parse_value",
    "random_action",
]
