"""Turn a sampled TokenBatch into a learner batch: advantages, returns and kept samples.

``compute_advantages(config, batch)`` is jittable and runs inside ``update_step`` by default
(``make_update_step(..., compute_advantages=True)``); call it yourself and pass
``compute_advantages=False`` when you need truncation flags or your own estimator.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from jaxagent.rl import advantages as adv_lib
from jaxagent.rl.kl import kl_estimate
from jaxagent.rl.losses import rft_keep_mask
from jaxagent.rl.recipes import RLConfig
from jaxagent.types import TokenBatch


def _need(batch: TokenBatch, field: str, why: str) -> jax.Array:
    value = getattr(batch, field)
    if value is None:
        raise ValueError(f"TokenBatch.{field} is None but {why}; fill it before the update")
    return value


def compute_advantages(
    config: RLConfig,
    batch: TokenBatch,
    *,
    truncated: Optional[jax.Array] = None,
    bootstrap_value: Optional[jax.Array] = None,
) -> TokenBatch:
    """Fill ``advantages`` (and ``returns`` for GAE) and fold sample filters into ``loss_mask``.

    Sequence estimators (group-normalised, leave-one-out) use ``batch.rewards`` [B] and
    ``batch.group_ids`` [B] and broadcast the sequence advantage to the row's policy tokens.
    GAE puts the reward on each row's last policy token and uses ``batch.values``: the row ends
    in a termination unless ``truncated[b]`` (then it bootstraps on ``bootstrap_value[b]``).
    ``kl_mode == "reward"`` subtracts ``kl_beta * KL`` (from ``old_logprobs`` and
    ``ref_logprobs``) from the rewards first. Rows without policy tokens are ignored.

    Args:
      config: the recipe.
      batch: TokenBatch [B, T].
      truncated: optional [B] {0,1} rows cut by a step budget or timeout (GAE only).
      bootstrap_value: optional [B] critic value after the cut (GAE only; default 0).

    Returns:
      The batch with ``advantages`` [B, T] set (0 off policy tokens), ``returns`` for GAE, and
      ``loss_mask`` multiplied by the kept-sample mask (LOOP's |A| threshold, RFT's filter).
    """
    mask = jnp.asarray(batch.loss_mask, jnp.float32)
    row_valid = (mask.sum(axis=1) > 0).astype(jnp.float32)  # [B]
    rewards = jnp.asarray(batch.rewards, jnp.float32)
    token_kl = None
    if config.kl_mode == "reward":
        ref = _need(batch, "ref_logprobs", "kl_mode='reward' needs reference log-probs")
        token_kl = kl_estimate(batch.old_logprobs, ref, config.kl_estimator) * mask
    keep = row_valid
    returns = batch.returns
    if config.advantage == "gae":
        values = _need(batch, "values", "advantage='gae' needs critic values at sampling time")
        token_rewards = adv_lib.sequence_rewards_to_tokens(rewards, mask)
        if token_kl is not None:
            token_rewards = token_rewards - config.kl_beta * token_kl
        last = adv_lib.sequence_rewards_to_tokens(jnp.ones_like(rewards), mask)  # [B, T] one-hot
        trunc_rows = jnp.zeros_like(rewards) if truncated is None else jnp.asarray(truncated, jnp.float32)
        boot = jnp.zeros_like(rewards) if bootstrap_value is None else bootstrap_value
        returns, token_adv = adv_lib.compute_gae(
            token_rewards, values, last * (1.0 - trunc_rows[:, None]), last * trunc_rows[:, None],
            boot, config.discount, config.gae_lambda, mask,
        )
    elif config.advantage == "given":
        token_adv = jnp.asarray(batch.advantages, jnp.float32) * mask
    else:
        if token_kl is not None:
            rewards = rewards - config.kl_beta * token_kl.sum(axis=1)
        if config.advantage == "group_normalized":
            seq_adv = adv_lib.group_normalized_advantages(
                rewards, batch.group_ids, config.std_mode, config.adv_eps, row_valid)
        else:
            seq_adv = adv_lib.leave_one_out_advantages(rewards, batch.group_ids, row_valid)
        if config.drop_advantage_below > 0:
            keep = keep * adv_lib.drop_small_advantages(seq_adv, config.drop_advantage_below)
        token_adv = adv_lib.broadcast_sequence_advantages(seq_adv, mask)
    if config.whiten_advantages:
        token_adv = adv_lib.whiten(token_adv, mask * keep[:, None])
    if config.rft_filter:
        keep = keep * rft_keep_mask(rewards, config.rft_reward_threshold)
    return batch.replace(
        advantages=jax.lax.stop_gradient(token_adv),
        returns=returns,
        loss_mask=mask * keep[:, None],
    )
