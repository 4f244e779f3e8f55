"""The turn-policy protocol: what the rollout driver calls to let a policy speak.

A ``TurnPolicy`` holds one row per episode of a ``collect_episodes`` call.
``start(params, prompts, key, tasks=..., observations=...)`` begins a batch of episodes and
produces every row's first turn; ``resume(params, chunks, key, observations=...)`` appends one
chunk of observation tokens per row (ragged lengths; ``None`` for rows that are finished) and
produces the next turn of every active row. Both return the turn's tokens per row (ending
with a stop id when one was produced) and their log-probs as the policy defines them (the LM
samplers: under ``softmax(logits / temperature)``, see ``jaxagent.generate.sample_tokens``;
0 for tokens a demonstrator wrote).

Token ids are what the policy consumes and produces, so episodes are token-in/token-out
whoever speaks. The texts (``tasks`` and the raw ``observations``, ``None`` for finished
rows) come along for policies that act on text: scripted experts
(``jaxagent.agents.expert.ExpertTurnPolicy``) and the training-free methods that wrap an LM
(Reflexion, Self-Refine, best-of-N). The LM samplers (``jaxagent.agents.cached``,
``jaxagent.agents.sampling``) ignore them.

``recompiles`` counts the compilations the policy caused (0 for host-only policies), for the
trainer's ``sampler/recompiles`` metric.

A policy that keeps device state across turns (the cached sampler's KV cache) may define
``release()``: ``collect_episodes`` calls it (``release``) once its episodes have all ended,
so that state is freed before the caller moves on (the learner's update); wrappers forward
it to the policy they wrap.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Protocol, Sequence, runtime_checkable

import jax

from jaxagent.envs.base import Task


@dataclasses.dataclass
class TurnOutput:
    """Per-row results of one policy turn (rows in the order of the call's input)."""

    tokens: list[list[int]]
    logprobs: list[list[float]]
    stopped: list[bool]  # True when the turn ended with a stop id
    # Constrained decoding (``jaxagent.agents.constrained``): per row, per token, the packed
    # mask of the vocabulary the token was drawn from (None: unconstrained); None: no row is.
    masks: Optional[list[list[Optional[bytes]]]] = None


@runtime_checkable
class TurnPolicy(Protocol):
    """A policy the rollout driver can run (see the module docstring)."""

    @property
    def recompiles(self) -> int: ...

    def start(
        self,
        params: Any,
        prompts: Sequence[Sequence[int]],
        key: jax.Array,
        *,
        tasks: Sequence[Task],
        observations: Sequence[str],
    ) -> TurnOutput: ...

    def resume(
        self,
        params: Any,
        chunks: Sequence[Optional[Sequence[int]]],
        key: jax.Array,
        *,
        observations: Sequence[Optional[str]],
    ) -> TurnOutput: ...


def release(policy: Any) -> None:
    """Free the per-episode device state ``policy`` keeps (``policy.release()``), if any."""
    fn = getattr(policy, "release", None)
    if callable(fn):
        fn()
