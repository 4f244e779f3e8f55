"""Episodes -> a fixed-shape ``TokenBatch`` for the learner: the one packer, and the one place
that decides which rows train.

``pack_episodes`` lays episodes out in one of two ways:

- one episode a row (RL): the sequence length is bucketed (multiples of ``length_multiple``,
  at most ``max_len``) and the row count padded to a multiple of ``rows_multiple`` with empty
  rows (segment 0, weight 0), so the jitted update sees few distinct shapes;
- dense (SFT, ``dense=True``): several episodes a row of exactly ``max_len`` tokens, first-fit
  by decreasing length, each with its own segment id and positions restarting at 0, so
  attention never crosses episodes (``jaxagent.models.apply_model`` masks by segment). Fewer
  padding tokens: the quickstart's episodes are ~75 tokens in rows of 192.

Which rows carry loss is decided here, on the host, once: ``row_weights`` writes
``TokenBatch.row_weight`` and the learner only multiplies it into the loss mask
(``jaxagent.rl.prepare``). A row trains unless its environment failed (never the policy's
fault) or its prompt overflowed the token budget (no turn was sampled), or a ``RowDrops``
rule drops it: DAPO's over-long filter and dynamic sampling
(Yu et al. 2025, arXiv 2503.14476, Sec. 3.2 / 3.4) and ``advantage.truncated: drop``. A row
with weight 0 is also left out of group baselines. Episodes cut by a step or token budget
(``Termination.TRUNCATED``) are flagged in ``TokenBatch.truncated`` as well, so GAE can
bootstrap at the cut instead of reading it as a real end.

With ``max_turns`` the batch also carries per-turn data for step-level credit (GiGPO):
``turn_rewards`` and ``anchor_ids`` ``[B, max_turns]`` (``turn_steps``).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from jaxagent.agents.episode import Episode
from jaxagent.buckets import bucket
from jaxagent.envs.base import Termination
from jaxagent.types import TokenBatch


@dataclasses.dataclass(frozen=True)
class RowDrops:
    """Row-drop rules beyond failed environments (which always drop).

    Attributes:
      overlong: DAPO's over-long filter: an episode cut at a length limit carries no loss (its
        reward says nothing about the answer it was not allowed to finish).
      truncated: ``advantage.truncated: drop``: an episode cut by a step or token budget
        carries no loss and is in no baseline.
      uninformative_groups: DAPO's dynamic sampling: a group whose rewards are all equal has
        zero group-normalised advantage and teaches nothing.
    """

    overlong: bool = False
    truncated: bool = False
    uninformative_groups: bool = False


def is_overlong(ep: Episode) -> bool:
    """The episode hit a length limit: cut by a step or token budget, or its last turn ended
    at ``max_new_tokens`` without a stop token."""
    if ep.env_failed:
        return False
    return ep.termination == Termination.TRUNCATED or bool(
        ep.turns and ep.turns[-1].hit_token_limit
    )


def informative_group_ids(episodes: Sequence[Episode]) -> set[int]:
    """The groups whose rewards are not all equal. Episodes whose environment failed do not
    count; a group with fewer than two other episodes has no spread."""
    rewards: dict[int, set] = {}
    for ep in episodes:
        seen = rewards.setdefault(ep.group, set())
        if not ep.env_failed:
            seen.add(ep.reward)
    return {g for g, r in rewards.items() if len(r) > 1}


def row_weights(episodes: Sequence[Episode], drops: RowDrops = RowDrops()) -> np.ndarray:
    """[N] float32 weight of each episode's row: 1 trains, 0 carries no loss and joins no
    baseline."""
    informative = informative_group_ids(episodes) if drops.uninformative_groups else None

    def weight(ep: Episode) -> float:
        if ep.env_failed or ep.termination == Termination.PROMPT_OVERFLOW:
            return 0.0
        if drops.overlong and is_overlong(ep):
            return 0.0
        if drops.truncated and ep.termination == Termination.TRUNCATED:
            return 0.0
        if informative is not None and ep.group not in informative:
            return 0.0
        return 1.0

    return np.asarray([weight(ep) for ep in episodes], np.float32).reshape(len(episodes))


def pack_episodes(
    episodes: Sequence[Episode],
    *,
    pad_id: int,
    max_len: int,
    length_multiple: int = 64,
    length_pow2: bool = False,
    rows_multiple: int = 1,
    rows: int | None = None,
    drops: RowDrops = RowDrops(),
    dense: bool = False,
    observation_weight: float = 0.0,
    max_turns: int = 0,
) -> TokenBatch:
    """Pack episodes into a ``TokenBatch`` of numpy arrays.

    Args:
      episodes: the episodes (one a row in this order, unless ``dense``).
      pad_id: token id for padding.
      max_len: longest allowed row (``dense``: the row length); longer episodes raise (the
        rollout budget prevents them).
      length_multiple: the sequence length is rounded up to a multiple of this.
      length_pow2: round it up to a power of two instead (at least ``length_multiple``):
        log2 as many distinct lengths, so as many compiled update steps, for <= 2x padding.
      rows_multiple: the row count is rounded up to a multiple of this.
      rows: a fixed row count instead (must be >= the rows needed).
      drops: which rows carry no loss besides failed environments (``row_weights``).
      dense: several episodes a row (SFT; see the module docstring); rows that would have
        weight 0 are left out.
      observation_weight: w: the loss mask is 1 on action tokens and w on every other token
        of an episode but its first (nothing in the episode predicts it). SFT on observations
        is practice in copying what the pages repeat.
      max_turns: > 0 fills ``turn_rewards`` and ``anchor_ids`` [B, max_turns] (``turn_steps``,
        one episode a row); 0 leaves them None.

    Returns:
      The batch: tokens/positions/segment_ids/loss_mask/old_logprobs/turn_ids [B, T],
      rewards/group_ids/truncated/row_weight [B], zero advantages. ``loss_mask`` says which
      tokens are the policy's, ``row_weight`` which rows train (0 on padding rows).
    """
    weights = row_weights(episodes, drops)
    if dense:
        kept = [ep for ep, w in zip(episodes, weights) if w > 0]
        members = _first_fit(kept, max_len)
        t, b = max_len, len(members)
    else:
        members = [[ep] for ep in episodes]

        # An episode cut before its first turn (prompt over budget) carries no loss: it keeps
        # its row, truncated. Any other episode must fit.
        longest = max((_length(ep, max_len) for ep in episodes), default=1)
        if longest > max_len:
            raise ValueError(
                f"an episode has {longest} tokens > max_len={max_len}; lower "
                "rollout.max_total_tokens or raise model.max_seq_len"
            )
        t = bucket(
            longest,
            multiple=length_multiple,
            pow2=length_pow2,
            minimum=length_multiple,
            cap=max_len,
        )
        b = len(episodes)
    if rows is not None:
        if rows < b:
            raise ValueError(f"rows={rows} < {b} rows needed")
        b = rows
    b = -(-b // rows_multiple) * rows_multiple
    tokens = np.full((b, t), pad_id, np.int32)
    positions = np.zeros((b, t), np.int32)
    segment = np.zeros((b, t), np.int32)
    loss = np.zeros((b, t), np.float32)
    old_lp = np.zeros((b, t), np.float32)
    turn_ids = np.full((b, t), -1, np.int32)
    rewards = np.zeros((b,), np.float32)
    # Padding rows get unique group ids so they never join a real group.
    group_ids = np.arange(b, dtype=np.int32) + 1 + max((ep.group for ep in episodes), default=0)
    truncated = np.zeros((b,), np.float32)
    row_weight = np.zeros((b,), np.float32)
    for r, row in enumerate(members):
        at = 0
        for seg, ep in enumerate(row, start=1):
            n = _length(ep, max_len)
            cols = slice(at, at + n)
            tokens[r, cols] = ep.tokens[:n]
            positions[r, cols] = np.arange(n)
            segment[r, cols] = seg
            mask = np.asarray(ep.loss_mask[:n], np.float32)
            if observation_weight:
                mask = mask + observation_weight * (1.0 - mask)
                mask[0] = 0.0
            loss[r, cols] = mask
            if not dense:  # demonstrations have no sampler log-probs (SFT reads none)
                old_lp[r, cols] = ep.logprobs[:n]
                turn_ids[r, cols] = ep.turn_ids[:n]
            at += n
        if not dense:
            (ep,) = row
            rewards[r] = ep.reward
            group_ids[r] = ep.group
            truncated[r] = float(ep.termination == Termination.TRUNCATED)
            row_weight[r] = weights[r]
        else:
            row_weight[r] = 1.0
    if not dense:
        # One episode a row: positions run over the whole row, padding included (the
        # sampler's layout; padding is masked by segment 0).
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
        row_weight=row_weight,
    )
    if not dense and any(ep.constraint_masks for ep in episodes):
        batch = batch.replace(**constraint_arrays(episodes, b, t))
    if max_turns:
        if dense:
            raise ValueError("pack_episodes: max_turns needs one episode a row (dense=False)")
        turn_rewards, anchor_ids = turn_steps(episodes, rows=b, max_turns=max_turns)
        batch = batch.replace(turn_rewards=turn_rewards, anchor_ids=anchor_ids)
    return batch


def constraint_arrays(episodes: Sequence[Episode], rows: int, length: int) -> dict:
    """``constraint_ids`` [B, T] and ``constraint_masks`` [B, K, ceil(V / 8)] of episodes
    sampled under constrained decoding (``Episode.constraint_ids`` / ``constraint_masks``, one
    episode a row; K: the most masks of a row, bucketed to a power of two)."""
    width = next(len(m) for ep in episodes for m in ep.constraint_masks)
    k = bucket(max(len(ep.constraint_masks) for ep in episodes), pow2=True, minimum=8)
    ids = np.full((rows, length), -1, np.int32)
    masks = np.zeros((rows, k, width), np.uint8)
    for r, ep in enumerate(episodes):
        if ep.constraint_masks:
            n = min(len(ep.constraint_ids), length)
            ids[r, :n] = ep.constraint_ids[:n]
            masks[r, : len(ep.constraint_masks)] = np.frombuffer(
                b"".join(ep.constraint_masks), np.uint8
            ).reshape(-1, width)
    return dict(constraint_ids=ids, constraint_masks=masks)


def _length(ep: Episode, max_len: int) -> int:
    return len(ep.tokens) if ep.num_policy_tokens else min(len(ep.tokens), max_len)


def _first_fit(episodes: Sequence[Episode], row_len: int) -> list[list[Episode]]:
    """Episodes grouped into rows of ``row_len`` tokens, first-fit by decreasing length."""
    order = sorted(range(len(episodes)), key=lambda i: -len(episodes[i].tokens))
    rows: list[list[Episode]] = []
    room: list[int] = []
    for i in order:
        n = len(episodes[i].tokens)
        if n > row_len:
            raise ValueError(f"an episode of {n} tokens does not fit rows of {row_len}")
        for r, free in enumerate(room):
            if free >= n:
                rows[r].append(episodes[i])
                room[r] -= n
                break
        else:
            rows.append([episodes[i]])
            room.append(row_len - n)
    return rows


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
