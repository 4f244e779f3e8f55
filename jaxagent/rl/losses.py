"""Pure per-token losses and their aggregation, in float32.

Every loss here returns a per-token array ``[B, T]``; ``aggregate`` turns it into a scalar
with one of the three aggregation modes. Only tokens with ``loss_mask == 1`` (tokens the
policy generated) carry loss. Arrays follow the alignment of ``jaxagent/types.py``: entry
``t`` concerns ``tokens[:, t]`` predicted from ``tokens[:, :t]``.

Aggregation denominators can be passed in explicitly (``num_tokens``, ``num_seqs``) so that
a minibatch split into microbatches gives exactly the loss of the whole minibatch: the
update step computes them once per minibatch and the microbatch losses then simply add up.
"""

from __future__ import annotations

from typing import Literal, Optional

import jax
import jax.numpy as jnp

from jaxagent.rl.kl import LOG_RATIO_CLIP

Aggregation = Literal["token_mean", "seq_mean_token_mean", "seq_sum_norm"]
AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_sum_norm")
RatioLevel = Literal["token", "turn", "trajectory"]
RATIO_LEVELS = ("token", "turn", "trajectory")
ClipLower = Literal["subtract", "reciprocal"]
CLIP_LOWERS = ("subtract", "reciprocal")


# ----------------------------------------------------------------------------- aggregation


def aggregation_denominators(mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(num_tokens, num_seqs) of a [B, T] mask: masked tokens, rows with >= 1 masked token."""
    m = jnp.asarray(mask, jnp.float32)
    return m.sum(), (m.sum(axis=1) > 0).astype(jnp.float32).sum()


def aggregate(
    loss: jax.Array,
    mask: jax.Array,
    mode: Aggregation,
    *,
    num_tokens: Optional[jax.Array] = None,
    num_seqs: Optional[jax.Array] = None,
    norm_constant: float = 1.0,
) -> jax.Array:
    """Reduce a per-token loss [B, T] to a scalar.

    Modes:
      "token_mean": sum of masked token losses / number of masked tokens in the batch
        (DAPO, 2503.14476: long sequences weigh more).
      "seq_mean_token_mean": mean over sequences of each sequence's masked token mean
        (GRPO 2402.03300, LOOP 2502.01600).
      "seq_sum_norm": sum of masked token losses / (number of sequences * norm_constant),
        with a constant such as the generation budget (Dr.GRPO 2503.20783: no length bias).

    Args:
      loss: [B, T] per-token loss.
      mask: [B, T] loss mask (policy tokens, times any per-sample keep weight).
      mode: one of the modes above.
      num_tokens, num_seqs: optional denominators for the whole (mini)batch this slice belongs
        to (defaults: those of ``mask``); clamped to >= 1.
      norm_constant: the constant of "seq_sum_norm".

    Returns:
      float32 scalar.
    """
    m = jnp.asarray(mask, jnp.float32)
    lm = jnp.asarray(loss, jnp.float32) * m
    own_tokens, own_seqs = aggregation_denominators(m)
    n_tok = jnp.maximum(own_tokens if num_tokens is None else num_tokens, 1.0)
    n_seq = jnp.maximum(own_seqs if num_seqs is None else num_seqs, 1.0)
    if mode == "token_mean":
        return lm.sum() / n_tok
    if mode == "seq_mean_token_mean":
        per_seq = lm.sum(axis=1) / jnp.maximum(m.sum(axis=1), 1.0)
        return per_seq.sum() / n_seq
    if mode == "seq_sum_norm":
        return lm.sum() / (n_seq * norm_constant)
    raise ValueError(f"aggregation={mode!r} is not one of {AGGREGATIONS}")


# ----------------------------------------------------------------------------- policy losses


def importance_log_ratio(
    logprobs: jax.Array,
    old_logprobs: jax.Array,
    mask: jax.Array,
    level: RatioLevel = "token",
    turn_ids: Optional[jax.Array] = None,
) -> jax.Array:
    """Log importance ratio log(pi / pi_old) broadcast to tokens at the chosen level.

    "token": per-token ratio (PPO, LOOP's default). "turn": the sum of token log-ratios over
    the policy tokens of each turn (same ``turn_ids`` value in a row), i.e. the product of the
    token ratios of the turn, given to every token of the turn. "trajectory": the sum over all
    policy tokens of the row (product of all token ratios). LOOP 2502.01600 Sec. 3 discusses
    the three. Tokens with ``turn_ids == -1`` fall back to their own token ratio.

    Args:
      logprobs: [B, T] current log-probs (with gradient).
      old_logprobs: [B, T] sampling log-probs.
      mask: [B, T] policy-token mask.
      level: "token", "turn" or "trajectory".
      turn_ids: [B, T] int turn index, needed for "turn".

    Returns:
      [B, T] float32 log-ratios (0 where mask is 0).
    """
    m = jnp.asarray(mask, jnp.float32)
    lr = (jnp.asarray(logprobs, jnp.float32) - jax.lax.stop_gradient(old_logprobs)) * m
    if level == "token":
        return lr
    if level == "trajectory":
        return lr.sum(axis=1, keepdims=True) * m
    if level == "turn":
        if turn_ids is None:
            raise ValueError("ratio level 'turn' needs turn_ids [B, T]; pass TokenBatch.turn_ids")
        b, t = lr.shape
        tid = jnp.asarray(turn_ids, jnp.int32)
        seg = jnp.arange(b)[:, None] * t + jnp.clip(tid, 0, t - 1)  # [B, T] unique per (row, turn)
        sums = jax.ops.segment_sum(lr.reshape(-1), seg.reshape(-1), num_segments=b * t)
        per_turn = sums[seg]
        return jnp.where(tid >= 0, per_turn, lr) * m
    raise ValueError(f"ratio level={level!r} is not one of {RATIO_LEVELS}")


def clip_bounds(
    eps_low: float, eps_high: float, lower: ClipLower = "subtract"
) -> tuple[float, float]:
    """(low, high) ratio bounds: (1 - eps_low, 1 + eps_high), or (1 / (1 + eps_low), 1 + eps_high)
    with ``lower="reciprocal"`` (the bound used by LOOP's public code)."""
    if lower == "subtract":
        return 1.0 - eps_low, 1.0 + eps_high
    if lower == "reciprocal":
        return 1.0 / (1.0 + eps_low), 1.0 + eps_high
    raise ValueError(f"clip lower={lower!r} is not one of {CLIP_LOWERS}")


def ppo_clip_loss(
    log_ratio: jax.Array,
    advantages: jax.Array,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    lower: ClipLower = "subtract",
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """PPO clipped surrogate per token: ``-min(rho A, clip(rho, low, high) A)``.

    Asymmetric ``eps_high > eps_low`` is DAPO's clip-higher (0.2 / 0.28).

    Args:
      log_ratio: [B, T] log(pi / pi_old) (from ``importance_log_ratio``).
      advantages: [B, T] per-token advantages.

    Returns:
      (loss [B, T], clipped_low [B, T], clipped_high [B, T]); the two indicator arrays are 1
      where the clip is active (the gradient is zero) at the low / high bound.

    References:
      Schulman et al. 2017, PPO (1707.06347), Eq. 7; Yu et al. 2025, DAPO (2503.14476).
    """
    low, high = clip_bounds(eps_low, eps_high, lower)
    adv = jax.lax.stop_gradient(jnp.asarray(advantages, jnp.float32))
    ratio = jnp.exp(jnp.clip(log_ratio, -LOG_RATIO_CLIP, LOG_RATIO_CLIP))
    unclipped = ratio * adv
    clipped = jnp.clip(ratio, low, high) * adv
    loss = -jnp.minimum(unclipped, clipped)
    clipped_low = ((ratio < low) & (adv < 0)).astype(jnp.float32)
    clipped_high = ((ratio > high) & (adv > 0)).astype(jnp.float32)
    return loss, clipped_low, clipped_high


def reinforce_loss(logprobs: jax.Array, advantages: jax.Array) -> jax.Array:
    """REINFORCE per token: ``-A * log pi`` (use any baseline above for A).

    References: Williams 1992; with leave-one-out baseline, RLOO (2402.14740).
    """
    return -jax.lax.stop_gradient(jnp.asarray(advantages, jnp.float32)) * logprobs


def sft_loss(logprobs: jax.Array) -> jax.Array:
    """Supervised cross-entropy per token: ``-log pi(token)`` (mask chooses the targets)."""
    return -jnp.asarray(logprobs, jnp.float32)


def rft_keep_mask(rewards: jax.Array, threshold: float) -> jax.Array:
    """Rejection-sampling fine-tuning: [B] float32, 1 for samples with ``reward >= threshold``.

    Multiply it into the loss mask and train with ``sft_loss``.

    References: Yuan et al. 2023, "Scaling Relationship on Learning Mathematical Reasoning
    with LLMs" (RFT, 2308.01825); Zelikman et al. 2022, STaR.
    """
    return (jnp.asarray(rewards, jnp.float32) >= threshold).astype(jnp.float32)


# ----------------------------------------------------------------------------- critic, entropy


def value_loss(
    values: jax.Array,
    old_values: jax.Array,
    returns: jax.Array,
    clip_eps: Optional[float] = None,
) -> jax.Array:
    """Per-token value loss ``0.5 (V - R)^2``; with ``clip_eps``, PPO's pessimistic clipped form
    ``0.5 max((V - R)^2, (V_old + clip(V - V_old, -eps, eps) - R)^2)``.

    Args:
      values: [B, T] current critic values (with gradient).
      old_values: [B, T] values at sampling time.
      returns: [B, T] targets.
    """
    v = jnp.asarray(values, jnp.float32)
    ret = jax.lax.stop_gradient(jnp.asarray(returns, jnp.float32))
    err = (v - ret) ** 2
    if clip_eps is None:
        return 0.5 * err
    old = jax.lax.stop_gradient(jnp.asarray(old_values, jnp.float32))
    v_clip = old + jnp.clip(v - old, -clip_eps, clip_eps)
    return 0.5 * jnp.maximum(err, (v_clip - ret) ** 2)


def approx_kl_old_new(logprobs: jax.Array, old_logprobs: jax.Array) -> jax.Array:
    """Per-token k3 estimate of KL(pi_old || pi) for monitoring (samples come from pi_old)."""
    log_r = jnp.clip(
        jnp.asarray(logprobs, jnp.float32) - old_logprobs, -LOG_RATIO_CLIP, LOG_RATIO_CLIP
    )
    return jnp.exp(log_r) - 1.0 - log_r
