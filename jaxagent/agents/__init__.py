"""The multi-turn rollout driver: the bridge from host environments to the jitted policy.

``collect_episodes`` (``rollout``) runs K samples per task, batching every episode that waits
for the policy into one sampler call (``cached.CachedTurnSampler``: per-row KV cache, ragged
continuation), and records token-in/token-out ``Episode``s (``episode``) that
``pack_episodes`` (``batch``) turns into a ``TokenBatch``. Runners reach the environments
inline (``runner``) or through the ``EnvPool`` (``pool_runner``).
"""

from jaxagent.agents.batch import pack_episodes
from jaxagent.agents.episode import Episode, Turn
from jaxagent.agents.rollout import Budget, RolloutStats, collect_episodes
from jaxagent.agents.runner import EnvReply, InlineRunner
from jaxagent.agents.sampling import ReferenceSampler, SamplingParams, TurnOutput

__all__ = ["Budget", "EnvReply", "Episode", "InlineRunner", "ReferenceSampler", "RolloutStats",
           "SamplingParams", "Turn", "TurnOutput", "collect_episodes", "pack_episodes"]
