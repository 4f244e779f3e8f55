"""Pack token-in/token-out episodes into a fixed-shape ``TokenBatch`` for the learner.

The sequence length is bucketed (multiples of ``length_multiple``, at most ``max_len``) and
the row count is padded to a multiple of ``rows_multiple`` with empty rows (segment 0, loss 0),
so the jitted update sees few distinct shapes. Episodes whose environment failed keep their
row but carry no loss (``loss_mask`` 0) and are marked invalid in ``row_valid``, so group
baselines ignore them: a failed environment is never the policy's fault. Episodes cut by a
step or token budget (``Termination.TRUNCATED``) are flagged in ``TokenBatch.truncated``, so
the learner can bootstrap (GAE) or drop them instead of reading the cut as a real end.

With ``max_turns`` the batch also carries per-turn data for step-level credit (GiGPO):
``turn_rewards`` and ``anchor_ids`` ``[B, max_turns]`` (``turn_steps``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from jaxagent.agents.episode import Episode
from jaxagent.buckets import bucket
from jaxagent.envs.base import Termination
from jaxagent.types import TokenBatch


def pack_episodes(
    episodes: Sequence[Episode],
    *,
    pad_id: int,
    max_len: int,
    length_multiple: int = 64,
    rows_multiple: int = 1,
    rows: int | None = None,
    max_turns: int = 0,
) -> tuple[TokenBatch, np.ndarray]:
    """Right-pad episodes into a ``TokenBatch`` of numpy arrays.

    Args:
      episodes: the episodes (rows in this order).
      pad_id: token id for padding.
      max_len: longest allowed row; longer episodes raise (the rollout budget prevents them).
      length_multiple: the sequence length is rounded up to a multiple of this.
      rows_multiple: the row count is rounded up to a multiple of this.
      rows: a fixed row count instead (must be >= len(episodes)).
      max_turns: > 0 fills ``turn_rewards`` and ``anchor_ids`` [B, max_turns] (``turn_steps``);
        0 leaves them None.

    Returns:
      (batch with tokens/positions/segment_ids/loss_mask/old_logprobs/turn_ids [B, T],
      rewards/group_ids/truncated [B] and zero advantages; row_valid [B] float32: 1 for episodes whose
      environment did not fail, 0 for failed episodes and padding rows).
    """

    # An episode cut before its first turn (prompt over budget) carries no loss: it keeps its
    # row, truncated. Any other episode must fit.
    def length(ep):
        return len(ep.tokens) if ep.num_policy_tokens else min(len(ep.tokens), max_len)

    longest = max((length(ep) for ep in episodes), default=1)
    if longest > max_len:
        raise ValueError(
            f"an episode has {longest} tokens > max_len={max_len}; lower "
            "rollout.max_total_tokens or raise model.max_seq_len"
        )
    t = bucket(longest, multiple=length_multiple, minimum=length_multiple, cap=max_len)
    b = len(episodes) if rows is None else rows
    if b < len(episodes):
        raise ValueError(f"rows={rows} < {len(episodes)} episodes")
    b = -(-b // rows_multiple) * rows_multiple
    tokens = np.full((b, t), pad_id, np.int32)
    segment = np.zeros((b, t), np.int32)
    loss = np.zeros((b, t), np.float32)
    old_lp = np.zeros((b, t), np.float32)
    turn_ids = np.full((b, t), -1, np.int32)
    rewards = np.zeros((b,), np.float32)
    # Padding rows get unique group ids so they never join a real group.
    group_ids = np.arange(b, dtype=np.int32) + 1 + max((ep.group for ep in episodes), default=0)
    valid = np.zeros((b,), np.float32)
    truncated = np.zeros((b,), np.float32)
    for i, ep in enumerate(episodes):
        n = length(ep)
        tokens[i, :n] = ep.tokens[:n]
        segment[i, :n] = 1
        ok = not ep.env_failed
        loss[i, :n] = np.asarray(ep.loss_mask[:n], np.float32) * ok
        old_lp[i, :n] = ep.logprobs[:n]
        turn_ids[i, :n] = ep.turn_ids[:n]
        rewards[i] = ep.reward
        group_ids[i] = ep.group
        valid[i] = float(ok)
        truncated[i] = float(ep.termination == Termination.TRUNCATED)
    positions = np.broadcast_to(np.arange(t, dtype=np.int32), (b, t)).copy()
    batch = TokenBatch(
        tokens=tokens,
        positions=positions,
        segment_ids=segment,
        loss_mask=loss,
        old_logprobs=old_lp,
        advantages=np.zeros((b, t), np.float32),
        rewards=rewards,
        group_ids=group_ids,
        turn_ids=turn_ids,
        truncated=truncated,
    )
    if max_turns:
        turn_rewards, anchor_ids = turn_steps(episodes, rows=b, max_turns=max_turns)
        batch = batch.replace(turn_rewards=turn_rewards, anchor_ids=anchor_ids)
    return batch, valid


def turn_steps(
    episodes: Sequence[Episode], *, rows: int, max_turns: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per-turn rewards and anchor states of episodes, for step-level credit (GiGPO).

    The state a turn acts from is the observation the policy read just before it: the reset
    observation for turn 0, else the previous turn's observation. Within each group (the K
    samples of one task), identical observation texts share an anchor id, numbered in order of
    first appearance; ids of different groups are unrelated (the learner pairs them with the
    group id), so hosts number their own groups without coordinating. Following GiGPO, the key
    is the current observation alone, not the history: two turns that read the same tool
    result are the same state.

    Args:
      episodes: the batch's episodes (rows in this order).
      rows: the batch's row count (>= len(episodes); extra rows are padding).
      max_turns: M, the rollout's turn budget; turns past it are left out.

    Returns:
      (turn_rewards [rows, M] float32, anchor_ids [rows, M] int32, -1 where no turn).

    References:
      Feng et al. 2025, GiGPO (2505.10978), Sec. 4.2 (anchor states); verl-agent
      ``gigpo/core_gigpo.py::build_step_group``.
    """
    turn_rewards = np.zeros((rows, max_turns), np.float32)
    anchor_ids = np.full((rows, max_turns), -1, np.int32)
    anchors: dict[tuple[int, str], int] = {}
    per_group: dict[int, int] = {}
    for i, ep in enumerate(episodes):
        state = ep.first_observation
        for k, turn in enumerate(ep.turns[:max_turns]):
            key = (ep.group, state)
            if key not in anchors:
                anchors[key] = per_group.get(ep.group, 0)
                per_group[ep.group] = anchors[key] + 1
            anchor_ids[i, k] = anchors[key]
            turn_rewards[i, k] = turn.reward
            state = turn.observation
    return turn_rewards, anchor_ids
