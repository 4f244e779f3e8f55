"""Task-oriented dialogue: flight booking against an agenda-based user simulator.

See ``domain`` (slots, database, goals, held-out routes and simulator setting), ``simulator``
(the user), ``env`` (the TextEnv and its reward), ``tracker`` (belief state, DQN features,
act ids), ``policies`` (rule policy, scripted expert, random) and ``suite`` (the registry
entry). Never imports JAX; the DQN lives in ``jaxagent.learners.dqn_dialogue.dqn``.
"""

from jaxagent.envs.dialogue.domain import DialogueConfig, DialogueSource, SimulatorConfig
from jaxagent.envs.dialogue.env import DialogueEnv, DialogueEnvConfig
from jaxagent.envs.dialogue.policies import TextPolicy, expert_policy, rule_policy
from jaxagent.envs.dialogue.tracker import NUM_ACTS, NUM_FEATURES, Tracker

__all__ = [
    "NUM_ACTS",
    "NUM_FEATURES",
    "DialogueConfig",
    "DialogueEnv",
    "DialogueEnvConfig",
    "DialogueSource",
    "SimulatorConfig",
    "TextPolicy",
    "Tracker",
    "expert_policy",
    "rule_policy",
]
