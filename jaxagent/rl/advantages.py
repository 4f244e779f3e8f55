"""Pure advantage estimators: GAE, group-normalised (GRPO / Dr.GRPO), leave-one-out (LOOP / RLOO),
batch-mean (REINFORCE), and GiGPO's group-in-group (episode- plus step-level) advantages.

All functions are jittable, take float32 arrays and never branch on data. Group membership is
given by integer ``group_ids`` (samples of the same task share an id); grouping uses a [B, B]
equality matrix, which is exact, static-shaped and cheap for the batch sizes of LLM RL.
"""

from __future__ import annotations

from typing import Literal, Optional

import jax
import jax.numpy as jnp

StdMode = Literal["population", "sample", "none"]
_STD_MODES = ("population", "sample", "none")


def compute_gae(
    rewards: jax.Array,
    values: jax.Array,
    termination: jax.Array,
    truncation: jax.Array,
    bootstrap_value: jax.Array,
    discount: float = 1.0,
    gae_lambda: float = 0.95,
    mask: Optional[jax.Array] = None,
) -> tuple[jax.Array, jax.Array]:
    """Generalised advantage estimation with separate termination and truncation.

    Time runs along axis 1. Steps with ``mask == 0`` (prompt, observation and tool-output
    tokens, padding) are skipped: the "next step" of a step is the next step with mask 1, so
    GAE runs over policy tokens only, across turns.

    A step with ``termination == 1`` is a real end: the next-state value is 0 and nothing
    propagates back across it. A step with ``truncation == 1`` (step budget, tool timeout)
    is a cut: its next-state value is ``bootstrap_value`` (the critic's estimate of the state
    after the cut) and nothing propagates back across it. The last valid step of a row that
    is neither terminated nor truncated also bootstraps with ``bootstrap_value`` (the row is
    a fragment of a longer trajectory). Termination wins when both flags are set.

    Args:
      rewards: [B, T] float32 per-step rewards.
      values: [B, T] float32 critic values V(s_t) of the state before each step.
      termination: [B, T] {0,1} real end after step t.
      truncation: [B, T] {0,1} cut after step t (bootstraps).
      bootstrap_value: [B] or [B, T] value of the state after a cut / after the row's last
        step. [B] when each row holds one episode.
      discount: gamma.
      gae_lambda: lambda.
      mask: optional [B, T] {0,1} valid steps (defaults to all ones).

    Returns:
      (returns [B, T], advantages [B, T]) float32, zero where ``mask == 0``. The returns are
      the value targets ``advantages + values`` and carry no gradient.

    References:
      Schulman et al. 2015, "High-Dimensional Continuous Control Using GAE" (1506.02438).
    """
    rewards = jnp.asarray(rewards, jnp.float32)
    values = jnp.asarray(values, jnp.float32)
    mask = jnp.ones_like(rewards) if mask is None else jnp.asarray(mask, jnp.float32)
    boot = jnp.asarray(bootstrap_value, jnp.float32)
    if boot.ndim == 1:
        boot = jnp.broadcast_to(boot[:, None], rewards.shape)
    term = jnp.asarray(termination, jnp.float32)
    trunc = jnp.asarray(truncation, jnp.float32)

    def step(carry, xs):
        next_value, next_adv, seen = carry  # [B], [B], [B]: carried from the next valid step
        r, v, te, tr, b, m = xs
        # Is there a valid future step of the same episode to chain to?
        chain = seen * (1.0 - te) * (1.0 - tr)
        nv = jnp.where(chain > 0, next_value, (1.0 - te) * b)
        delta = r + discount * nv - v
        adv = delta + discount * gae_lambda * chain * next_adv
        valid = m > 0
        new_carry = (
            jnp.where(valid, v, next_value),
            jnp.where(valid, adv, next_adv),
            jnp.where(valid, 1.0, seen),
        )
        return new_carry, adv * m

    xs = tuple(jnp.swapaxes(x, 0, 1) for x in (rewards, values, term, trunc, boot, mask))
    zeros = jnp.zeros(rewards.shape[0], jnp.float32)
    _, adv_tb = jax.lax.scan(step, (zeros, zeros, zeros), xs, reverse=True)
    advantages = jnp.swapaxes(adv_tb, 0, 1)  # [B, T]
    returns = jax.lax.stop_gradient((advantages + values) * mask)
    return returns, jax.lax.stop_gradient(advantages)


def _group_matrix(group_ids: jax.Array, mask: Optional[jax.Array]) -> tuple[jax.Array, jax.Array]:
    """[B, B] float32 same-group matrix restricted to valid rows, and valid [B] float32."""
    valid = (
        jnp.ones(group_ids.shape, jnp.float32) if mask is None else jnp.asarray(mask, jnp.float32)
    )
    same = (group_ids[:, None] == group_ids[None, :]).astype(jnp.float32)
    return same * valid[None, :] * valid[:, None], valid


def _check_std_mode(std_mode: str) -> None:
    if std_mode not in _STD_MODES:
        raise ValueError(f"std_mode={std_mode!r} is not one of {_STD_MODES}; pick one of them")


def group_normalized_advantages(
    rewards: jax.Array,
    group_ids: jax.Array,
    std_mode: StdMode = "population",
    eps: float = 1e-6,
    mask: Optional[jax.Array] = None,
) -> jax.Array:
    """GRPO advantages ``(R - mean_group) / (std_group + eps)``; Dr.GRPO with ``std_mode='none'``.

    Args:
      rewards: [B] float32 sequence rewards.
      group_ids: [B] int32; samples of the same task share an id.
      std_mode: "population" (divide by n; DeepSeekMath's description), "sample" (divide by
        n - 1; torch.std's default, used by TRL), or "none" (Dr.GRPO: no std division).
      eps: added to the std.
      mask: optional [B] {0,1}; rows with 0 (padding rows) are ignored and get advantage 0.

    Returns:
      [B] float32 advantages.

    References:
      Shao et al. 2024, DeepSeekMath (2402.03300), Sec. 4.1.2; Liu et al. 2025,
      "Understanding R1-Zero-Like Training" (Dr.GRPO, 2503.20783).
    """
    _check_std_mode(std_mode)
    same, valid = _group_matrix(jnp.asarray(group_ids), mask)
    return _normalize_in_groups(rewards, same, valid, std_mode, eps)


def _normalize_in_groups(
    values: jax.Array, same: jax.Array, valid: jax.Array, std_mode: StdMode, eps: float
) -> jax.Array:
    """``(x - mean_group) / (std_group + eps)`` (no division with ``std_mode='none'``).

    Args:
      values: [N] float32.
      same: [N, N] float32 {0,1}: 1 where two valid entries share a group.
      valid: [N] float32 {0,1}; invalid entries come back as 0.
    """
    x = jnp.asarray(values, jnp.float32)
    n = jnp.maximum(same.sum(axis=1), 1.0)  # [N] group sizes
    mean = same @ x / n
    centred = x - mean
    if std_mode == "none":
        return centred * valid
    # Sum of squared deviations from each entry's own group mean (no E[x^2] - mean^2 cancellation).
    var = (same * (x[None, :] - mean[:, None]) ** 2).sum(axis=1)
    denom = n if std_mode == "population" else jnp.maximum(n - 1.0, 1.0)
    std = jnp.sqrt(var / denom)
    return centred / (std + eps) * valid


def leave_one_out_advantages(
    rewards: jax.Array,
    group_ids: jax.Array,
    mask: Optional[jax.Array] = None,
) -> jax.Array:
    """Leave-one-out advantages ``A_k = R_k - mean of the other K-1 rewards of the group``.

    Equal to ``K / (K - 1) * (R_k - mean_group)``. No std division. A group of one sample
    gets advantage 0.

    Args:
      rewards: [B] float32 sequence rewards.
      group_ids: [B] int32 task ids.
      mask: optional [B] {0,1}; padding rows are ignored and get 0.

    Returns:
      [B] float32 advantages.

    References:
      Chen et al. 2025, LOOP (2502.01600), Eq. 3; Ahmadian et al. 2024, RLOO (2402.14740);
      Kool et al. 2019, "Buy 4 REINFORCE samples, get a baseline for free".
    """
    r = jnp.asarray(rewards, jnp.float32)
    same, valid = _group_matrix(jnp.asarray(group_ids), mask)
    n = same.sum(axis=1)
    others_sum = same @ r - r * valid
    others_mean = others_sum / jnp.maximum(n - 1.0, 1.0)
    return jnp.where(n > 1.0, r - others_mean, 0.0) * valid


def batch_mean_advantages(rewards: jax.Array, mask: Optional[jax.Array] = None) -> jax.Array:
    """REINFORCE with a batch-mean baseline: ``A_b = R_b - mean of the batch's rewards``.

    The baseline needs no groups, so it works with one sample per task (where a group
    baseline would make every advantage ``R - R = 0``). Rows with ``mask == 0`` (padding,
    failed environments, dropped truncations) are left out of the mean and get 0.

    Args:
      rewards: [B] float32 sequence rewards.
      mask: optional [B] {0,1} valid rows.

    Returns:
      [B] float32 advantages.

    References:
      Williams 1992 (REINFORCE with a baseline); Sutton & Barto, 2nd ed., Sec. 13.4.
    """
    r = jnp.asarray(rewards, jnp.float32)
    valid = jnp.ones_like(r) if mask is None else jnp.asarray(mask, jnp.float32)
    mean = jnp.sum(r * valid) / jnp.maximum(valid.sum(), 1.0)
    return (r - mean) * valid


def discounted_turn_returns(
    turn_rewards: jax.Array, turn_valid: jax.Array, discount: float
) -> jax.Array:
    """Per-turn discounted returns ``R_t = r_t + gamma R_{t+1}`` within each row.

    Args:
      turn_rewards: [B, M] float32 reward of each turn (the environment's step reward).
      turn_valid: [B, M] {0,1}: the turn exists (a row's turns are its first columns).
      discount: gamma.

    Returns:
      [B, M] float32 returns, 0 on invalid turns.
    """
    r = jnp.asarray(turn_rewards, jnp.float32)
    v = jnp.asarray(turn_valid, jnp.float32)

    def step(next_return, xs):  # [B]: the return of the turn after this one
        r_t, v_t = xs
        ret = (r_t + discount * next_return) * v_t
        return ret, ret

    _, ret_mb = jax.lax.scan(step, jnp.zeros(r.shape[0], jnp.float32), (r.T, v.T), reverse=True)
    return ret_mb.T


def step_group_advantages(
    step_returns: jax.Array,
    group_ids: jax.Array,
    anchor_ids: jax.Array,
    turn_valid: jax.Array,
    std_mode: StdMode = "population",
    eps: float = 1e-6,
) -> jax.Array:
    """GiGPO's step-level advantages: each turn's return normalised within its anchor-state group.

    An anchor-state group is every turn, across the K trajectories of one task (one
    ``group_ids`` value), taken from the same state (equal ``anchor_ids``); a turn is compared
    only with the other actions taken from that state. A group of one turn gets 0.

    Args:
      step_returns: [B, M] float32 discounted return of each turn (``discounted_turn_returns``).
      group_ids: [B] int32 task groups.
      anchor_ids: [B, M] int32 state ids, comparable within a task group only; -1: no turn.
      turn_valid: [B, M] {0,1} turns that take part (rows with an env error, dropped rows: 0).
      std_mode, eps: as in ``group_normalized_advantages`` ("none": mean subtraction only).

    Returns:
      [B, M] float32 step advantages, 0 on invalid turns.

    References:
      Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training" (GiGPO,
      2505.10978), Sec. 4.2, Eq. 7-8; verl-agent ``gigpo/core_gigpo.py`` (``build_step_group``,
      ``step_norm_reward``).
    """
    _check_std_mode(std_mode)
    b, m = anchor_ids.shape
    g = jnp.repeat(jnp.asarray(group_ids), m)  # [B*M]
    a = jnp.asarray(anchor_ids).reshape(-1)  # [B*M]
    valid = jnp.asarray(turn_valid, jnp.float32).reshape(-1) * (a >= 0)
    same = ((g[:, None] == g[None, :]) & (a[:, None] == a[None, :])).astype(jnp.float32)
    same = same * valid[:, None] * valid[None, :]
    out = _normalize_in_groups(jnp.asarray(step_returns).reshape(-1), same, valid, std_mode, eps)
    return out.reshape(b, m)


def gigpo_advantages(
    rewards: jax.Array,
    group_ids: jax.Array,
    turn_rewards: jax.Array,
    anchor_ids: jax.Array,
    turn_ids: jax.Array,
    mask: jax.Array,
    *,
    std_mode: StdMode = "population",
    eps: float = 1e-6,
    discount: float = 0.95,
    step_weight: float = 1.0,
) -> jax.Array:
    """GiGPO: per-token ``A = A_episode + step_weight * A_step(turn of the token)``.

    The episode-level term is GRPO's group-normalised episode reward over the task's K
    trajectories; the step-level term normalises each turn's discounted return among the
    turns of the same task taken from the same anchor state (``step_group_advantages``), so an
    action is credited against the alternatives tried from that state rather than against
    whole trajectories only. Tokens of turns at or past ``M`` (or with ``turn_ids == -1``)
    get the episode term alone.

    Args:
      rewards: [B] float32 episode rewards (the episode term's).
      group_ids: [B] int32 task groups.
      turn_rewards: [B, M] float32 per-turn rewards (the step term's returns).
      anchor_ids: [B, M] int32 state of each turn (-1: no turn); equal ids within a task group
        are identical states.
      turn_ids: [B, T] int32 turn of each token (-1 off policy tokens).
      mask: [B, T] policy-token mask; rows without a masked token take no part.
      std_mode: the normaliser F_norm of both levels ("none": mean subtraction only).
      eps: added to the std.
      discount: gamma of the step returns (the paper's 0.95).
      step_weight: omega, the weight of the step term (the paper's 1).

    Returns:
      [B, T] float32 advantages, 0 off the mask.

    References:
      Feng et al. 2025, GiGPO (2505.10978), Eq. 5 (episode), Eq. 7-9 (step, combination).
    """
    m = jnp.asarray(mask, jnp.float32)
    row_valid = (m.sum(axis=1) > 0).astype(jnp.float32)  # [B]
    episode = group_normalized_advantages(rewards, group_ids, std_mode, eps, row_valid)  # [B]
    anchors = jnp.asarray(anchor_ids, jnp.int32)
    turn_valid = (anchors >= 0).astype(jnp.float32) * row_valid[:, None]  # [B, M]
    returns = discounted_turn_returns(turn_rewards, turn_valid, discount)
    step = step_group_advantages(returns, group_ids, anchors, turn_valid, std_mode, eps)
    tid = jnp.asarray(turn_ids, jnp.int32)
    n_turns = anchors.shape[1]
    step_tok = jnp.take_along_axis(step, jnp.clip(tid, 0, n_turns - 1), axis=1)  # [B, T]
    step_tok = jnp.where((tid >= 0) & (tid < n_turns), step_tok, 0.0)
    return (episode[:, None] + step_weight * step_tok) * m


def drop_small_advantages(advantages: jax.Array, threshold: float) -> jax.Array:
    """Keep mask [B] float32: 1 where ``|A| >= threshold`` (LOOP drops |A| < 0.01).

    Samples whose advantage is (near) zero carry no learning signal; dropping them from the
    loss (rather than the batch) keeps shapes static. ``threshold <= 0`` keeps everything.
    """
    a = jnp.asarray(advantages, jnp.float32)
    if threshold <= 0:
        return jnp.ones_like(a)
    return (jnp.abs(a) >= threshold).astype(jnp.float32)


def whiten(
    values: jax.Array, mask: Optional[jax.Array] = None, shift_mean: bool = True, eps: float = 1e-8
) -> jax.Array:
    """Batch whitening ``(x - mean) / std`` over the masked entries (any shape).

    Args:
      values: array of any shape.
      mask: optional array of the same shape; statistics use entries with mask 1 only, and
        masked-out entries come back as 0.
      shift_mean: if False, only scale (keeps the sign of the mean, as in some PPO codes).
      eps: added to the variance.

    Returns:
      float32 array of the same shape.
    """
    x = jnp.asarray(values, jnp.float32)
    m = jnp.ones_like(x) if mask is None else jnp.asarray(mask, jnp.float32)
    n = jnp.maximum(m.sum(), 1.0)
    mean = (x * m).sum() / n
    var = (((x - mean) * m) ** 2).sum() / n
    out = (x - mean) if shift_mean else x
    return out * jax.lax.rsqrt(var + eps) * m


def broadcast_sequence_advantages(advantages: jax.Array, loss_mask: jax.Array) -> jax.Array:
    """[B] sequence advantages -> [B, T] per-token advantages on policy tokens (0 elsewhere)."""
    return jnp.asarray(advantages, jnp.float32)[:, None] * jnp.asarray(loss_mask, jnp.float32)


def sequence_rewards_to_tokens(rewards: jax.Array, loss_mask: jax.Array) -> jax.Array:
    """Place each [B] sequence reward on the row's last policy token -> [B, T] (for GAE)."""
    m = jnp.asarray(loss_mask, jnp.float32)
    t = jnp.arange(m.shape[1])
    last = jnp.max(jnp.where(m > 0, t[None, :], -1), axis=1)  # [B], -1 if no policy token
    onehot = (t[None, :] == last[:, None]).astype(jnp.float32)
    return onehot * jnp.asarray(rewards, jnp.float32)[:, None]
