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

Every policy declares three more members (``HostPolicy`` holds the defaults of a policy with
no device state): ``release()``, called by ``collect_episodes`` once its episodes have all
ended, frees the device state it keeps across turns (the cached sampler's KV cache) before
the caller moves on (the learner's update); ``rebase()``, called between turns when the
weights change (partial rollouts), drops what the old weights computed, the next ``resume``
then getting every running row's whole context; ``driver``, the episode loop the policy
brings (``Driver``: the slot engine's continuous batching), or None for
``collect_episodes``' lock-step rounds. Wrappers forward ``release`` and ``rebase`` to the
policy they wrap.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Optional, Protocol, Sequence, runtime_checkable

import jax

from jaxagent.envs.base import Task

if TYPE_CHECKING:
    from jaxagent.agents.rollout import Driver


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

    def release(self) -> None:
        """Free the device state kept across turns (its episodes have all ended)."""

    def rebase(self) -> None:
        """New weights between turns: drop what the old ones computed; the next ``resume``
        gets every running row's whole context."""

    @property
    def driver(self) -> Optional[Driver]:
        """The policy's own episode loop, or None: ``collect_episodes``' lock-step rounds."""


class HostPolicy:
    """The ``TurnPolicy`` members of a policy that keeps no device state between turns and
    runs in the lock-step rounds (scripted experts, test policies)."""

    driver: Optional[Driver] = None

    def release(self) -> None:
        pass

    def rebase(self) -> None:
        pass
