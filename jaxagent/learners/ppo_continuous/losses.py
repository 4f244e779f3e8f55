"""Advantages and the clipped PPO loss for continuous control (pure functions).

Rollout layout (time first, as the host collects it): ``[T, N]`` for T steps of N envs, with
``values [T + 1, N]`` where ``values[t + 1]`` is V of the observation that step t returned.
Under Gymnasium's next-step autoreset that observation is the next row's input, including at
an episode's end (the final observation; the next row is the placeholder reset step, marked
``valid == 0``), so one value per row plus one after the last row is all GAE needs:

- ``terminated[t]``: a real end, the next-state value is 0;
- ``truncated[t]`` (a ``TimeLimit`` cut): bootstraps with ``values[t + 1]``, V(final obs);
- neither: chains to step t + 1 of the same episode.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxagent.rl.advantages import compute_gae
from jaxagent.learners.ppo_continuous.networks import gaussian_entropy, gaussian_logprob


def rollout_gae(
    rewards: jax.Array,
    values: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    valid: jax.Array,
    gamma: float,
    gae_lambda: float,
) -> tuple[jax.Array, jax.Array]:
    """GAE over a rollout with terminations and truncations kept apart.

    Args:
      rewards, terminated, truncated, valid: ``[T, N]`` (flags and mask in {0, 1}); rows with
        ``valid == 0`` (autoreset placeholders) are skipped and get 0.
      values: ``[T + 1, N]`` critic values (see the module docstring).
      gamma, gae_lambda: discount and GAE lambda.

    Returns:
      ``(advantages [T, N], returns [T, N])`` float32, no gradient.
    """
    # jaxagent.rl.advantages.compute_gae runs along axis 1 and bootstraps a truncated (or the
    # row's last) step on bootstrap_value: V of the observation each step returned.
    returns, advantages = compute_gae(
        rewards.T,
        values[:-1].T,
        terminated.T,
        truncated.T,
        bootstrap_value=values[1:].T,
        discount=gamma,
        gae_lambda=gae_lambda,
        mask=valid.T,
    )
    return jax.lax.stop_gradient(advantages.T), jax.lax.stop_gradient(returns.T)


class Minibatch(NamedTuple):
    """One minibatch of transitions, flattened to ``[M, ...]``."""

    obs: jax.Array  # [M, D] normalised observations
    actions: jax.Array  # [M, A] sampled (unclipped) actions
    old_logprobs: jax.Array  # [M]
    old_values: jax.Array  # [M]
    advantages: jax.Array  # [M]
    returns: jax.Array  # [M]
    valid: jax.Array  # [M] 1 for real transitions


def _masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def ppo_loss(
    params,
    apply_actor,
    apply_critic,
    mb: Minibatch,
    *,
    clip_eps: float,
    vf_coef: float,
    ent_coef: float,
    clip_value: bool,
    normalize_advantages: bool = True,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Clipped surrogate + value loss - entropy bonus (Schulman et al. 2017, eq. 9), masked.

    Args:
      params: ``{"actor": ..., "critic": ...}``.
      apply_actor: ``(actor_params, obs [M, D]) -> (mean [M, A], log_std [A])``.
      apply_critic: ``(critic_params, obs [M, D]) -> value [M]``.
      mb: the minibatch; ``valid == 0`` rows contribute nothing (masked means).
      clip_eps: ratio clip epsilon; also the value clip range when ``clip_value``.
      vf_coef, ent_coef: loss weights.
      clip_value: clip the value change around ``old_values`` (baselines / CleanRL).
      normalize_advantages: whiten advantages within the minibatch (over valid rows).

    Returns:
      ``(loss, metrics)``; metrics are scalars.
    """
    mask = mb.valid.astype(jnp.float32)
    mean, log_std = apply_actor(params["actor"], mb.obs)
    logp = gaussian_logprob(mean, log_std, mb.actions)
    log_ratio = jnp.clip(logp - mb.old_logprobs, -20.0, 20.0)  # exp stays finite
    ratio = jnp.exp(log_ratio)
    adv = mb.advantages
    if normalize_advantages:
        mu = _masked_mean(adv, mask)
        std = jnp.sqrt(_masked_mean((adv - mu) ** 2, mask))
        adv = (adv - mu) / (std + 1e-8)
    surrogate = jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - clip_eps, 1 + clip_eps) * adv)
    policy_loss = -_masked_mean(surrogate, mask)
    value = apply_critic(params["critic"], mb.obs)
    v_err = (value - mb.returns) ** 2
    if clip_value:
        v_clipped = mb.old_values + jnp.clip(value - mb.old_values, -clip_eps, clip_eps)
        v_err = jnp.maximum(v_err, (v_clipped - mb.returns) ** 2)
    value_loss = 0.5 * _masked_mean(v_err, mask)
    entropy = gaussian_entropy(log_std)
    loss = policy_loss + vf_coef * value_loss - ent_coef * entropy
    metrics = {
        "loss/policy": policy_loss,
        "loss/value": value_loss,
        "policy/entropy": entropy,
        "policy/approx_kl": _masked_mean((ratio - 1.0) - log_ratio, mask),
        "policy/clip_frac": _masked_mean((jnp.abs(ratio - 1.0) > clip_eps) * 1.0, mask),
    }
    return loss, metrics
