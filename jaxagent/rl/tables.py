"""The name -> function tables an ``RLConfig`` selects from (``rl/config.py`` validates
names against them; ``rl/prepare.py`` and ``rl/update.py`` call the entries).

``ADVANTAGE_ESTIMATORS``: ``advantage.estimator`` -> an ``Estimator``; ``POLICY_LOSSES``:
``loss.policy`` -> a ``PolicyLoss``; ``OFF_POLICY_CORRECTIONS``: ``loss.off_policy`` -> an
``OffPolicyCorrection``. Each entry wraps a pure function of ``rl/advantages.py``
or ``rl/losses.py`` with the section config it reads (``rl.config.AdvantageConfig`` /
``LossConfig``; this module does not import them: ``rl.config`` validates names against
these tables).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax.numpy as jnp

from jaxagent.rl import advantages as adv_lib
from jaxagent.rl import losses as loss_lib
from jaxagent.types import TokenBatch

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "OFF_POLICY_CORRECTIONS",
    "POLICY_LOSSES",
    "Estimator",
    "OffPolicyCorrection",
    "PolicyLoss",
]


class Estimator(NamedTuple):
    """An advantage estimator.

    ``per_token=False``: ``fn(cfg: AdvantageConfig, rewards [B], group_ids [B], valid [B]) ->
    [B]`` sequence advantages (broadcast to the row's policy tokens afterwards).
    ``per_token=True``: ``fn(cfg, batch, token_rewards [B, T], mask [B, T]) -> (advantages
    [B, T], returns [B, T] or None)``.
    """

    fn: Callable
    per_token: bool
    needs_critic: bool = False
    needs_turns: bool = False  # reads TokenBatch.turn_rewards / anchor_ids (step-level credit)


def _gae(cfg, batch: TokenBatch, token_rewards, mask):
    if batch.values is None:
        raise ValueError(
            "TokenBatch.values is None but advantage.estimator='gae' needs critic "
            "values at sampling time; fill it before the update"
        )
    b = mask.shape[0]
    trunc = (
        jnp.zeros((b,), jnp.float32)
        if batch.truncated is None
        else jnp.asarray(batch.truncated, jnp.float32)
    )
    boot = (
        jnp.zeros((b,), jnp.float32)
        if batch.bootstrap_value is None
        else jnp.asarray(batch.bootstrap_value, jnp.float32)
    )
    t = jnp.arange(mask.shape[1])
    last_t = jnp.max(jnp.where(mask > 0, t[None, :], -1), axis=1)
    last = (t[None, :] == last_t[:, None]).astype(jnp.float32)
    # A terminated row ends at its last policy token (next value 0); a truncated row is cut
    # there and bootstraps on the critic's value of the state after the cut.
    returns, adv = adv_lib.compute_gae(
        token_rewards,
        batch.values,
        last * (1.0 - trunc[:, None]),
        last * trunc[:, None],
        boot,
        cfg.discount,
        cfg.gae_lambda,
        mask,
    )
    return adv, returns


def _gigpo(cfg, batch: TokenBatch, token_rewards, mask):
    if batch.turn_rewards is None or batch.anchor_ids is None:
        raise ValueError(
            "TokenBatch.turn_rewards / anchor_ids are None but advantage.estimator='gigpo' "
            "needs per-turn data; pack the batch with pack_episodes(..., max_turns=M)"
        )
    # The episode term reads the row's reward as the update sees it (with a KL-in-reward
    # penalty when kl.mode='reward'); the step term reads the environment's per-turn rewards.
    adv = adv_lib.gigpo_advantages(
        token_rewards.sum(axis=1),
        batch.group_ids,
        batch.turn_rewards,
        batch.anchor_ids,
        batch.turn_ids,
        mask,
        std_mode=cfg.std_mode,
        eps=cfg.eps,
        discount=cfg.discount,
        step_weight=cfg.step_weight,
    )
    return adv, batch.returns


def _given(cfg, batch: TokenBatch, token_rewards, mask):
    del cfg, token_rewards
    return jnp.asarray(batch.advantages, jnp.float32) * mask, batch.returns


ADVANTAGE_ESTIMATORS: dict[str, Estimator] = {
    "gae": Estimator(_gae, per_token=True, needs_critic=True),
    "given": Estimator(_given, per_token=True),
    "gigpo": Estimator(_gigpo, per_token=True, needs_turns=True),
    "group_normalized": Estimator(
        lambda c, r, g, v: adv_lib.group_normalized_advantages(r, g, c.std_mode, c.eps, v),
        per_token=False,
    ),
    "leave_one_out": Estimator(
        lambda c, r, g, v: adv_lib.leave_one_out_advantages(r, g, v), per_token=False
    ),
    "batch_mean": Estimator(
        lambda c, r, g, v: adv_lib.batch_mean_advantages(r, v), per_token=False
    ),
}


class PolicyLoss(NamedTuple):
    """``fn(cfg: LossConfig, logp [B, T], log_ratio [B, T], advantages [B, T]) -> (loss [B, T],
    clipped_low [B, T], clipped_high [B, T])``. ``on_policy``: the gradient is unbiased only
    when the tokens were sampled from the policy's own distribution (temperature 1, no
    top-k / top-p), because it uses the behaviour log-probs or the samples' frequencies."""

    fn: Callable
    on_policy: bool


def _ppo(cfg, logp, log_ratio, adv):
    del logp
    return loss_lib.ppo_clip_loss(
        log_ratio, adv, cfg.clip_eps_low, cfg.clip_eps_high, cfg.clip_lower
    )


def _no_clip(per_tok):
    zeros = jnp.zeros_like(per_tok)
    return per_tok, zeros, zeros


POLICY_LOSSES: dict[str, PolicyLoss] = {
    "ppo": PolicyLoss(_ppo, on_policy=True),
    "reinforce": PolicyLoss(
        lambda c, lp, lr, a: _no_clip(loss_lib.reinforce_loss(lp, a)), on_policy=True
    ),
    "sft": PolicyLoss(lambda c, lp, lr, a: _no_clip(loss_lib.sft_loss(lp)), on_policy=False),
}


class OffPolicyCorrection(NamedTuple):
    """``fn(cfg: LossConfig, prox_logprobs [B, T], behav_logprobs [B, T], mask [B, T]) ->
    (weight [B, T], dropped [B, T])``: the stop-gradient per-token weight of the policy loss
    and the indicator of policy tokens it drops (``rl/losses.py``). ``uses_prox``: the policy
    ratio is taken against pi_prox (the learner's log-probs before the update) instead of the
    behaviour log-probs, and the weight applies; False is the on-policy path (LOOP's per-token
    clip on the behaviour log-probs, no weight)."""

    fn: Callable
    uses_prox: bool


def _no_correction(cfg, prox, behav, mask):
    del cfg, prox, behav
    m = jnp.asarray(mask, jnp.float32)
    return m, jnp.zeros_like(m)


OFF_POLICY_CORRECTIONS: dict[str, OffPolicyCorrection] = {
    "none": OffPolicyCorrection(_no_correction, uses_prox=False),
    "decoupled": OffPolicyCorrection(
        lambda c, p, b, m: loss_lib.decoupled_weights(p, b, m, c.decoupled_cap), uses_prox=True
    ),
    "tis": OffPolicyCorrection(
        lambda c, p, b, m: loss_lib.tis_weights(p, b, m, c.tis_cap), uses_prox=True
    ),
    "icepop": OffPolicyCorrection(
        lambda c, p, b, m: loss_lib.icepop_weights(p, b, m, c.icepop_low, c.icepop_high),
        uses_prox=True,
    ),
}
