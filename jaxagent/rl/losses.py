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


# ----------------------------------------------------------------------------- off-policy corrections
#
# Three policies meet in an asynchronous (or reduced-precision) update: pi_behav, which
# sampled the tokens (``TokenBatch.old_logprobs``, recorded by the sampler); pi_prox, the
# learner's policy at the start of the update (one no-grad forward, ``rl/update.py``); and
# pi, the policy being optimised. Each correction below maps (log pi_prox, log pi_behav) to a
# stop-gradient per-token weight that multiplies the policy loss, whose ratio is then taken
# against pi_prox instead of pi_behav. Tokens a correction drops get weight 0 and stay in the
# aggregation's denominators (the estimator's 1/|y| is unchanged).


def behaviour_log_ratio(
    prox_logprobs: jax.Array, behav_logprobs: jax.Array, mask: jax.Array
) -> jax.Array:
    """[B, T] float32 ``log(pi_prox / pi_behav)`` on policy tokens (0 elsewhere), clipped to
    +-``LOG_RATIO_CLIP`` so that exp() stays finite, without gradient."""
    m = jnp.asarray(mask, jnp.float32)
    lr = jnp.asarray(prox_logprobs, jnp.float32) - jnp.asarray(behav_logprobs, jnp.float32)
    return jax.lax.stop_gradient(jnp.clip(lr, -LOG_RATIO_CLIP, LOG_RATIO_CLIP) * m)


def decoupled_weights(
    prox_logprobs: jax.Array, behav_logprobs: jax.Array, mask: jax.Array, cap: float = 0.0
) -> tuple[jax.Array, jax.Array]:
    """Decoupled PPO's behaviour weight ``pi_prox / pi_behav`` per token.

    The clipped surrogate's ratio is pi / pi_prox (the trust region is around the learner's
    own recent policy) and each token's loss is weighted by pi_prox / pi_behav, which corrects
    for the tokens having been sampled by pi_behav. With ``cap > 0``, tokens whose weight
    exceeds ``cap`` are dropped (weight 0), as AReaL's ``behav_imp_weight_cap`` does.

    Returns:
      (weight [B, T], dropped [B, T]): float32, 0 off ``mask``; ``dropped`` is 1 on policy
      tokens the cap removed.

    References:
      Hilton, Cobbe, Schulman 2021, "Batch size-invariance for policy optimization"
      (2110.00641), the decoupled objective; Fu et al. 2025, AReaL (2505.24298).
    """
    m = jnp.asarray(mask, jnp.float32)
    w = jnp.exp(behaviour_log_ratio(prox_logprobs, behav_logprobs, mask)) * m
    if cap <= 0:
        return w, jnp.zeros_like(w)
    dropped = (w > cap).astype(jnp.float32) * m
    return w * (1.0 - dropped), dropped


def tis_weights(
    prox_logprobs: jax.Array, behav_logprobs: jax.Array, mask: jax.Array, cap: float = 2.0
) -> tuple[jax.Array, jax.Array]:
    """Truncated importance sampling: ``min(pi_prox / pi_behav, C)`` per token.

    Truncation bounds the variance that a rare token with a large ratio would add (at the
    price of a small bias); no token is dropped.

    Returns:
      (weight [B, T], dropped [B, T] = 0), float32, 0 off ``mask``.

    References:
      Yao, Liu, et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL
      Training" (fengyao.notion.site/off-policy-rl), the TIS-corrected PPO objective;
      Ionides 2008, "Truncated importance sampling".
    """
    m = jnp.asarray(mask, jnp.float32)
    w = jnp.exp(behaviour_log_ratio(prox_logprobs, behav_logprobs, mask))
    return jnp.minimum(w, cap) * m, jnp.zeros_like(m)


def icepop_weights(
    prox_logprobs: jax.Array,
    behav_logprobs: jax.Array,
    mask: jax.Array,
    low: float = 0.5,
    high: float = 2.0,
) -> tuple[jax.Array, jax.Array]:
    """IcePop's double-sided mask: weight ``k = pi_prox / pi_behav`` where ``low <= k <=
    high``, 0 outside (the token is dropped, not clipped: a token the two engines disagree on
    that much carries no gradient at all).

    Returns:
      (weight [B, T], dropped [B, T]): float32, 0 off ``mask``; ``dropped`` is 1 on policy
      tokens outside the band.

    References:
      Ling Team (inclusionAI) 2025, "Every Step Evolves: Scaling Reinforcement Learning for
      Trillion-Scale Thinking Model" (Ring-1T, 2510.18855), IcePop's M(k; alpha, beta);
      Prime Intellect 2025, INTELLECT-3 report (2512.16144), Eq. 1.
    """
    m = jnp.asarray(mask, jnp.float32)
    k = jnp.exp(behaviour_log_ratio(prox_logprobs, behav_logprobs, mask))
    keep = ((k >= low) & (k <= high)).astype(jnp.float32) * m
    return k * keep, m - keep


MISMATCH_THRESHOLDS = (("1e-3", 1e-3), ("1e-2", 1e-2), ("1e-1", 1e-1))


def mismatch_metrics(
    learner_logprobs: jax.Array,
    behav_logprobs: jax.Array,
    mask: jax.Array,
    num_tokens: jax.Array | None = None,
) -> dict:
    """The sampler-vs-learner mismatch over the policy tokens: the statistics of
    ``d = log pi_learner - log pi_behav`` before any optimiser step. ``mismatch/mean_abs``
    (mean |d|) and ``mismatch/max_abs`` (over ``mask > 0``), and ``mismatch/frac_gt_<x>``
    the fraction of tokens with |d| > x for each of ``MISMATCH_THRESHOLDS``; means weigh
    tokens by ``mask`` (0/1 for the sampler's tokens) and divide by ``num_tokens`` (default:
    ``mask``'s sum), so that the means of microbatches add up to the minibatch's. Nonzero d
    comes from reduced-precision sampling weights, other kernels or summation orders in the
    sampler, or stale sampling weights."""
    m = jnp.asarray(mask, jnp.float32)
    n = jnp.maximum(m.sum() if num_tokens is None else num_tokens, 1.0)
    d = jnp.abs(
        jnp.asarray(learner_logprobs, jnp.float32) - jnp.asarray(behav_logprobs, jnp.float32)
    )
    d = jax.lax.stop_gradient(jnp.where(m > 0, d, 0.0))
    out = {"mismatch/mean_abs": jnp.sum(d * m) / n, "mismatch/max_abs": jnp.max(d)}
    for name, x in MISMATCH_THRESHOLDS:
        out[f"mismatch/frac_gt_{name}"] = jnp.sum((d > x) * m) / n
    return out


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
