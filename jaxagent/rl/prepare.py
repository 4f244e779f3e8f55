"""Turn a sampled TokenBatch into a learner batch: advantages, returns and kept samples.

``compute_advantages(config, batch)`` is jittable and runs inside ``update_step`` by default
(``make_update_step(..., compute_advantages=True)``); call it yourself and pass
``compute_advantages=False`` to use your own estimator. The estimator is looked up by name in
``jaxagent.rl.tables.ADVANTAGE_ESTIMATORS``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.rl import advantages as adv_lib
from jaxagent.rl.config import ADVANTAGE_ESTIMATORS, RLConfig
from jaxagent.rl.kl import kl_estimate
from jaxagent.rl.losses import rft_keep_mask
from jaxagent.rl.model_fns import model_values
from jaxagent.types import TokenBatch


def _need(batch: TokenBatch, field: str, why: str) -> jax.Array:
    value = getattr(batch, field)
    if value is None:
        raise ValueError(f"TokenBatch.{field} is None but {why}; fill it before the update")
    return value


def apply_row_weight(batch: TokenBatch) -> TokenBatch:
    """``batch`` with ``row_weight`` folded into ``loss_mask`` (and cleared, so folding twice
    is a no-op). Which rows train is decided on the host (``jaxagent.agents.batch.row_weights``);
    the learner only reads the weight."""
    mask = jnp.asarray(batch.loss_mask, jnp.float32)
    if batch.row_weight is not None:
        mask = mask * jnp.asarray(batch.row_weight, jnp.float32)[:, None]
    return batch.replace(loss_mask=mask, row_weight=None)


def compute_advantages(config: RLConfig, batch: TokenBatch) -> TokenBatch:
    """Fill ``advantages`` (and ``returns`` for GAE) and fold sample filters into ``loss_mask``.

    Sequence estimators (group-normalised, leave-one-out, batch-mean) use ``batch.rewards`` [B]
    and ``batch.group_ids`` [B] and broadcast the sequence advantage to the row's policy
    tokens. GAE puts the reward on each row's last policy token and uses ``batch.values``: the
    row ends in a termination unless ``batch.truncated[b]``, and then it bootstraps on
    ``batch.bootstrap_value[b]`` (0 when absent). ``kl.mode == "reward"`` subtracts
    ``kl.beta * KL`` (from ``old_logprobs`` and ``ref_logprobs``) from the rewards first.
    Rows without weighted policy tokens (``row_weight`` 0: failed environments, DAPO's
    filters, ``advantage.truncated == "drop"``; see ``apply_row_weight``) are ignored: no
    loss, not in any baseline.

    Returns:
      The batch with ``advantages`` [B, T] set (0 off policy tokens), ``returns`` for GAE, and
      ``loss_mask`` multiplied by the row weight and by the filters that read the advantage or
      the reward on the device (LOOP's |A| threshold, RFT's filter).
    """
    a = config.advantage
    batch = apply_row_weight(batch)
    mask = batch.loss_mask
    row_valid = (mask.sum(axis=1) > 0).astype(jnp.float32)  # [B]
    rewards = jnp.asarray(batch.rewards, jnp.float32)
    token_kl = None
    if config.kl.mode == "reward":
        ref = _need(batch, "ref_logprobs", "kl.mode='reward' needs reference log-probs")
        token_kl = kl_estimate(batch.old_logprobs, ref, config.kl.estimator) * mask
    keep = row_valid
    returns = batch.returns
    estimator = ADVANTAGE_ESTIMATORS[a.estimator]
    if estimator.per_token:
        token_rewards = adv_lib.sequence_rewards_to_tokens(rewards, mask)
        if token_kl is not None:
            token_rewards = token_rewards - config.kl.beta * token_kl
        token_adv, returns = estimator.fn(a, batch, token_rewards, mask)
    else:
        if token_kl is not None:
            rewards = rewards - config.kl.beta * token_kl.sum(axis=1)
        seq_adv = estimator.fn(a, rewards, batch.group_ids, row_valid)
        if a.drop_below > 0:
            keep = keep * adv_lib.drop_small_advantages(seq_adv, a.drop_below)
        token_adv = adv_lib.broadcast_sequence_advantages(seq_adv, mask)
    if a.whiten:
        token_adv = adv_lib.whiten(token_adv, mask * keep[:, None])
    if a.filter_reward:
        keep = keep * rft_keep_mask(rewards, a.min_reward)
    return batch.replace(
        advantages=jax.lax.stop_gradient(token_adv),
        returns=returns,
        loss_mask=mask * keep[:, None],
    )


def split_bootstrap_values(
    values_ext: jax.Array, segment_ids: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Critic values of a batch run with one extra (padding) column -> (values [B, T],
    bootstrap [B]).

    ``values_ext`` [B, T + 1] is aligned as ``values[:, t] = V(tokens[:, :t])`` over the
    tokens padded by one column, so entry ``n_b`` (the row's length) is the value of the state
    after the row's last token: the bootstrap value of a truncated row.
    """
    lengths = jnp.sum(segment_ids > 0, axis=1)  # [B]
    boot = jnp.take_along_axis(values_ext, lengths[:, None], axis=1)[:, 0]
    return values_ext[:, :-1], jax.lax.stop_gradient(boot.astype(jnp.float32))


def with_critic_values(graphdef, params, batch: TokenBatch) -> TokenBatch:
    """``batch`` with the critic's ``values`` and ``bootstrap_value`` filled (host arrays).

    The model (``graphdef``, ``params``) runs its blocks and value head only
    (``jaxagent.rl.model_fns.model_values``: no vocabulary-sized logits) on the batch padded
    by one column: the value after each row's last token bootstraps a truncated row
    (``split_bootstrap_values``).
    """
    pad = lambda x: jnp.pad(x, ((0, 0), (0, 1)))  # noqa: E731
    values = model_values(
        graphdef, params, pad(batch.tokens), pad(batch.positions), pad(batch.segment_ids)
    )
    values, boot = split_bootstrap_values(values, batch.segment_ids)
    return batch.replace(values=np.asarray(values), bootstrap_value=np.asarray(boot))
