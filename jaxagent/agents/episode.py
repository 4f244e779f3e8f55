"""Host records of episodes: token-in/token-out, loss mask, sampler log-probs, turns.

An ``Episode`` keeps the exact token ids the policy saw and produced, in order. Its
``loss_mask`` is 1 exactly on tokens the policy sampled; its ``logprobs`` are the sampler's
log-probs of those tokens (0 elsewhere), aligned per ``jaxagent/types.py``. Text exists only for
the environment and for people reading episodes; training never re-tokenises it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from jaxagent.envs.base import FailureMode, Task, Termination


@dataclasses.dataclass
class Turn:
    """One policy turn and the environment's answer to it."""

    action: str  # decoded policy text sent to the environment
    observation: str  # the environment's reply ("" when the episode ended on this turn)
    reward: float  # the step reward
    reward_terms: dict[str, float] = dataclasses.field(default_factory=dict)
    failure_mode: Optional[str] = None  # the step's failure label, if any
    num_action_tokens: int = 0  # policy tokens of this turn (incl. the stop token)
    num_observation_tokens: int = 0  # tokens appended after it (user turn + header)
    hit_token_limit: bool = False  # the turn ended at max_new_tokens without a stop token
    dangerous: list[str] = dataclasses.field(default_factory=list)  # step info["dangerous"]


@dataclasses.dataclass
class Episode:
    """One attempt at a task (token-in/token-out).

    Attributes:
      task: the task.
      group: the group id shared by the K samples of the same task.
      tokens: every token id of the episode in order (prompt, actions, observations).
      loss_mask: 1 where the policy sampled the token, else 0 (same length as ``tokens``).
      logprobs: sampler log-prob of each sampled token, 0 elsewhere.
      turn_ids: turn index of each policy token, -1 on prompt/observation tokens.
      versions: the policy version (the number of updates the sampling weights had seen)
        that sampled each policy token, -1 on prompt/observation tokens.
      constraint_ids: for each token drawn under constrained decoding, the index in
        ``constraint_masks`` of the vocabulary mask it was drawn from; -1 elsewhere (empty
        when no token was constrained).
      constraint_masks: the distinct masks (``np.packbits`` of the allowed vocabulary).
      turns: per-turn records.
      termination: how the episode ended.
      failure_mode: why it failed (None on success).
      success: the task's verifiable success.
      error: a message when the environment failed.
      info: the last step's info (reward terms, dangerous actions, ...).
    """

    task: Task
    group: int
    tokens: list[int] = dataclasses.field(default_factory=list)
    loss_mask: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    turn_ids: list[int] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)
    constraint_ids: list[int] = dataclasses.field(default_factory=list)
    constraint_masks: list[bytes] = dataclasses.field(default_factory=list)
    turns: list[Turn] = dataclasses.field(default_factory=list)
    first_observation: str = ""
    termination: Termination = Termination.TRUNCATED
    failure_mode: Optional[str] = None
    success: bool = False
    error: Optional[str] = None
    done: bool = False
    info: dict[str, Any] = dataclasses.field(default_factory=dict)

    def append(
        self, ids, *, sampled: bool, logprobs=None, turn: int = -1, version: int = 0, masks=None
    ) -> None:
        """Append token ids; ``sampled`` ones carry loss, their sampler log-probs, the
        policy ``version`` that sampled them and, under constrained decoding, ``masks`` (per
        token the packed vocabulary mask it was drawn from, None where unconstrained)."""
        ids = [int(t) for t in ids]
        if masks is not None and any(m is not None for m in masks):
            assert sampled and len(masks) == len(ids)
            self.constraint_ids.extend([-1] * (len(self.tokens) - len(self.constraint_ids)))
            index = {m: i for i, m in enumerate(self.constraint_masks)}
            for m in masks:
                if m is not None and m not in index:
                    index[m] = len(self.constraint_masks)
                    self.constraint_masks.append(m)
            self.constraint_ids.extend(-1 if m is None else index[m] for m in masks)
        elif self.constraint_ids:
            self.constraint_ids.extend([-1] * len(ids))
        self.tokens.extend(ids)
        self.loss_mask.extend([1 if sampled else 0] * len(ids))
        if sampled:
            assert logprobs is not None and len(logprobs) == len(ids)
            self.logprobs.extend(float(x) for x in logprobs)
            self.turn_ids.extend([turn] * len(ids))
            self.versions.extend([version] * len(ids))
        else:
            self.logprobs.extend([0.0] * len(ids))
            self.turn_ids.extend([-1] * len(ids))
            self.versions.extend([-1] * len(ids))

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` tokens (with their masks, log-probs, turns and versions); the
        turn records are the caller's to cut."""
        for seq in (self.tokens, self.loss_mask, self.logprobs, self.turn_ids, self.versions):
            del seq[n:]
        del self.constraint_ids[n:]
        # masks are indexed in order of first use, so a prefix's masks are a prefix of the list
        del self.constraint_masks[max(self.constraint_ids, default=-1) + 1 :]
        if not self.constraint_masks:
            self.constraint_ids.clear()

    def finish(
        self,
        termination: Termination,
        failure_mode=None,
        *,
        success=False,
        error: Optional[str] = None,
    ) -> None:
        self.done = True
        self.termination = Termination(termination)
        fm = failure_mode.value if isinstance(failure_mode, FailureMode) else failure_mode
        self.failure_mode = None if success else fm
        self.success = bool(success)
        self.error = error

    @property
    def reward(self) -> float:
        return float(sum(t.reward for t in self.turns))

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def num_policy_tokens(self) -> int:
        return int(sum(self.loss_mask))

    @property
    def env_failed(self) -> bool:
        return self.termination == Termination.ENV_ERROR

    @property
    def failure_detail(self) -> Optional[str]:
        """The environment's own label for a failed episode (``info["failure_detail"]``, e.g.
        the web sites' ``wrong_item`` / ``dangerous_action`` under ``wrong_state``), or None."""
        if self.success or self.env_failed:
            return None
        return self.info.get("failure_detail") or None

    def render(self, decode=None) -> str:
        """A readable transcript: task, turns with actions, observations and rewards."""
        lines = [f"task {self.task.id} (group {self.group})", f"  obs: {self.first_observation}"]
        for i, t in enumerate(self.turns):
            lines.append(f"  [turn {i}] action: {t.action!r}")
            terms = ", ".join(f"{k}={v:g}" for k, v in t.reward_terms.items())
            label = f" failure={t.failure_mode}" if t.failure_mode else ""
            lines.append(f"           reward {t.reward:g} ({terms}){label}")
            if t.observation:
                lines.append(f"           obs: {t.observation}")
        end = f"  -> {self.termination.value}, success={self.success}"
        if self.failure_mode:
            end += f", failure_mode={self.failure_mode}"
            if self.failure_detail and self.failure_detail != self.failure_mode:
                end += f" ({self.failure_detail})"
        if self.error:
            end += f", error={self.error}"
        lines.append(end + f", reward={self.reward:g}, tokens={len(self.tokens)}")
        return "\n".join(lines)
