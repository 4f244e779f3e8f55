"""The quickstart tool world: a tiny, closed, stateful API world for CPU-scale RL.

See ``world`` (tools and state), ``tasks`` (levels, splits), ``vocab`` (the closed
vocabulary), ``env`` (the TextEnv), ``expert`` (scripted demonstrations with a controllable
error rate) and ``suite`` (its registry entry, imported by the registry on first use).
"""

from jaxagent.envs.tools.quickstart.env import QuickstartEnv, QuickstartEnvConfig
from jaxagent.envs.tools.quickstart.expert import (
    ExpertPolicy,
    expert_episode,
    format_call,
    format_final,
    random_action,
    success_rate,
)
from jaxagent.envs.tools.quickstart.world import system_prompt
from jaxagent.envs.tools.quickstart.tasks import (
    LEVELS,
    QuickstartConfig,
    QuickstartWorld,
    task_key,
)
from jaxagent.envs.tools.quickstart.vocab import vocabulary
from jaxagent.envs.tools.quickstart.world import TOOL_NAMES, TOOL_SPECS

__all__ = [
    "LEVELS",
    "TOOL_NAMES",
    "TOOL_SPECS",
    "ExpertPolicy",
    "QuickstartConfig",
    "QuickstartEnv",
    "QuickstartEnvConfig",
    "QuickstartWorld",
    "expert_episode",
    "format_call",
    "format_final",
    "random_action",
    "success_rate",
    "system_prompt",
    "task_key",
    "vocabulary",
]
