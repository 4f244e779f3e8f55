"""KL estimators between the policy and a reference policy, per token, in float32.

With tokens sampled from the policy pi and ``log_r = log pi_ref(x) - log pi(x)``:

- k1 = -log_r                      (unbiased, high variance, can be negative)
- k2 = log_r ** 2 / 2              (biased, low variance, >= 0)
- k3 = exp(log_r) - 1 - log_r      (unbiased, low variance, >= 0; GRPO's choice)

References:
  J. Schulman, "Approximating KL Divergence" (2020), http://joschu.net/blog/kl-approx.html;
  Shao et al. 2024, DeepSeekMath (2402.03300), Eq. 4 (k3 in the loss);
  Ouyang et al. 2022 / Ziegler et al. 2019 (k1 per-token penalty in the reward).
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp

KLEstimator = Literal["k1", "k2", "k3"]
KL_ESTIMATORS = ("k1", "k2", "k3")
# exp() of a log-ratio beyond this is an overflow hazard, not information.
LOG_RATIO_CLIP = 20.0


def kl_estimate(
    logprobs: jax.Array, ref_logprobs: jax.Array, estimator: KLEstimator = "k3"
) -> jax.Array:
    """Per-token estimate of KL(pi || pi_ref) from log-probs of the sampled tokens.

    Args:
      logprobs: [B, T] log pi(tokens) (gradient flows through it).
      ref_logprobs: [B, T] log pi_ref(tokens) (treated as constant).
      estimator: "k1", "k2" or "k3".

    Returns:
      [B, T] float32 per-token estimates (callers mask them).
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl estimator={estimator!r} is not one of {KL_ESTIMATORS}")
    lp = jnp.asarray(logprobs, jnp.float32)
    ref = jax.lax.stop_gradient(jnp.asarray(ref_logprobs, jnp.float32))
    log_r = jnp.clip(ref - lp, -LOG_RATIO_CLIP, LOG_RATIO_CLIP)
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return 0.5 * log_r * log_r
    return jnp.exp(log_r) - 1.0 - log_r


def kl_penalized_rewards(
    token_rewards: jax.Array,
    logprobs: jax.Array,
    ref_logprobs: jax.Array,
    loss_mask: jax.Array,
    beta: float,
    estimator: KLEstimator = "k1",
) -> jax.Array:
    """Classic RLHF-PPO reward shaping: ``r_t - beta * KL_t`` on policy tokens.

    Args:
      token_rewards: [B, T] rewards (e.g. from ``sequence_rewards_to_tokens``).
      logprobs: [B, T] sampling-policy log-probs (``TokenBatch.old_logprobs``).
      ref_logprobs: [B, T] reference log-probs.
      loss_mask: [B, T] policy tokens.
      beta: KL coefficient.

    Returns:
      [B, T] float32 shaped rewards, without gradient.
    """
    kl = kl_estimate(logprobs, ref_logprobs, estimator) * jnp.asarray(loss_mask, jnp.float32)
    return jax.lax.stop_gradient(jnp.asarray(token_rewards, jnp.float32) - beta * kl)
