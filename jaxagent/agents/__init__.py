"""The multi-turn rollout driver: the bridge from host environments to the jitted policy.

``collect_episodes`` (``rollout``) runs K samples per task of a turn policy
(``turn_policy.TurnPolicy``: the cached LM sampler ``cached.CachedTurnSampler`` with a per-row
KV cache and ragged continuation, the reference sampler, scripted experts
``expert.ExpertTurnPolicy``) under a ``RolloutSpec`` (chat format ``chat.Chat``, system
prompt, budgets, runner), and records token-in/token-out ``Episode``s (``episode``) that
``pack_episodes`` (``batch``) turns into a ``TokenBatch``. ``evaluate`` reports on a policy's
episodes. Runners reach the environments inline (``runner``) or through the ``EnvPool``
(``pool_runner``).
"""

from jaxagent.agents.batch import pack_episodes
from jaxagent.agents.chat import Chat, ChatFormat
from jaxagent.agents.episode import Episode, Turn
from jaxagent.agents.evaluate import Evaluation, evaluate
from jaxagent.agents.expert import ExpertTurnPolicy
from jaxagent.agents.rollout import Budget, RolloutSpec, RolloutStats, collect_episodes
from jaxagent.agents.runner import InlineRunner
from jaxagent.agents.sampling import ReferenceSampler
from jaxagent.agents.turn_policy import TurnOutput, TurnPolicy

__all__ = [
    "Budget",
    "Chat",
    "ChatFormat",
    "Episode",
    "Evaluation",
    "ExpertTurnPolicy",
    "InlineRunner",
    "ReferenceSampler",
    "RolloutSpec",
    "RolloutStats",
    "Turn",
    "TurnOutput",
    "TurnPolicy",
    "collect_episodes",
    "evaluate",
    "pack_episodes",
]
