"""Scripted experts as turn policies, so demonstrations come from the one episode loop.

A suite's ``make_expert(task, error_rate, rng)`` builds a per-episode expert with
``act(observation) -> action text``. ``ExpertTurnPolicy`` wraps it into the
``jaxagent.agents.turn_policy.TurnPolicy`` protocol: it builds one expert per row at
``start`` and tokenises each action with the chat format (``Chat.action``: the text and its
stop token), so ``collect_episodes`` records a demonstration exactly as it records the LM's
episodes (same chat chunks, same budgets, loss mask on the expert's tokens, log-probs 0).
The environment then sees the decoded tokens, as it would the LM's.
"""

from __future__ import annotations

import zlib
from typing import Any, Callable, Optional, Sequence

import numpy as np

from jaxagent.agents.chat import Chat
from jaxagent.agents.turn_policy import HostPolicy, TurnOutput
from jaxagent.envs.base import Task

MakeExpert = Callable[[Task, float, Any], Any]


class ExpertTurnPolicy(HostPolicy):
    """A ``TurnPolicy`` that lets per-episode scripted experts speak.

    Args:
      make_expert: ``make_expert(task, error_rate, rng)`` -> an object with
        ``act(observation) -> str``.
      chat: tokenises the experts' actions.
      error_rate: the experts' error rate.
      seed: sample ``k`` of a task draws its mistakes from
        ``np.random.default_rng([seed, 7, crc32(task.id), k])``, so a demonstration depends on
        the seed and the task alone, not on which other episodes share the call.
    """

    def __init__(self, make_expert: MakeExpert, chat: Chat, *, error_rate: float, seed: int):
        self._make, self.chat = make_expert, chat
        self.error_rate, self.seed = error_rate, seed
        self._experts: list[Any] = []

    @property
    def recompiles(self) -> int:
        return 0  # host-only

    def start(
        self, params, prompts, key, *, tasks: Sequence[Task], observations: Sequence[Optional[str]]
    ) -> TurnOutput:
        del params, prompts, key  # the expert reads text and draws from its own generator
        seen: dict[str, int] = {}
        self._experts = []
        for task in tasks:
            k = seen[task.id] = seen.get(task.id, -1) + 1
            rng = np.random.default_rng([self.seed, 7, zlib.crc32(task.id.encode()), k])
            self._experts.append(self._make(task, self.error_rate, rng))
        return self._act(observations)

    def resume(self, params, chunks, key, *, observations: Sequence[Optional[str]]) -> TurnOutput:
        del params, chunks, key
        if len(observations) != len(self._experts):
            raise ValueError(
                f"resume got {len(observations)} rows for {len(self._experts)} "
                "experts; call start() first, one row per episode"
            )
        return self._act(observations)

    def _act(self, observations: Sequence[Optional[str]]) -> TurnOutput:
        out = TurnOutput([], [], [])
        for expert, obs in zip(self._experts, observations):
            ids = [] if obs is None else self.chat.action(expert.act(obs))
            out.tokens.append(ids)
            out.logprobs.append([0.0] * len(ids))
            out.stopped.append(bool(ids))
        return out
