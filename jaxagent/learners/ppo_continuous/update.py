"""Continuous-control PPO: the config, the train state, the acting function and ONE jitted
update (GAE, then epochs x minibatches of the clipped loss under ``lax.scan``).

The pieces are apart, brax-style: networks in ``ppo_networks.py``, observation / reward
normalisers in ``ppo_normalize.py``, GAE and the loss in ``ppo_losses.py``; this module only
assembles them. The host loop that steps the pool's MuJoCo engine and writes outputs is
``jaxagent.learners.ppo_continuous.train``.

Defaults are Schulman et al. 2017's MuJoCo setting (horizon 2048, Adam 3e-4 annealed linearly
to 0, 10 epochs, minibatch 64, gamma 0.99, lambda 0.95, epsilon 0.2) with the CleanRL /
baselines details (value clipping, advantage whitening per minibatch, grad-norm clip 0.5,
Adam eps 1e-5). ``PPOConfig.vectorised()`` is the many-envs, short-horizon variant.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import optax
from flax import struct

from jaxagent.learners.ppo_continuous.losses import Minibatch, ppo_loss, rollout_gae
from jaxagent.learners.ppo_continuous.networks import init_networks


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class PPOConfig:
    """PPO hyperparameters. All static: each is a compile-time constant of the update."""

    num_envs: int = 1  # parallel envs N
    horizon: int = 2048  # steps per env per iteration T (batch = N * T)
    epochs: int = 10  # passes over each batch
    minibatch_size: int = 64  # transitions per gradient step; must divide N * T
    learning_rate: float = 3e-4  # Adam step size at the start
    anneal_lr: bool = True  # linear decay to 0 over the run
    gamma: float = 0.99  # discount
    gae_lambda: float = 0.95  # GAE lambda
    clip_eps: float = 0.2  # ratio clip (and value clip) range
    vf_coef: float = 0.5  # value loss weight
    ent_coef: float = 0.0  # entropy bonus weight
    max_grad_norm: float = 0.5  # global gradient-norm clip
    clip_value: bool = True  # clip the value change around the rollout's values
    normalize_obs: bool = True  # running observation normalisation
    obs_clip: float = 10.0  # normalised observations are clipped to +-obs_clip
    scale_rewards: bool = True  # divide rewards by the running std of the discounted return
    hidden: tuple[int, ...] = (64, 64)  # MLP widths of actor and critic

    def __post_init__(self):
        for name in ("num_envs", "horizon", "epochs", "minibatch_size", "learning_rate"):
            if getattr(self, name) <= 0:
                raise ValueError(f"ppo.{name}={getattr(self, name)!r} must be > 0")
        if (self.num_envs * self.horizon) % self.minibatch_size:
            raise ValueError(
                f"ppo.minibatch_size={self.minibatch_size} must divide ppo.num_envs * "
                f"ppo.horizon = {self.num_envs * self.horizon}; pick a divisor"
            )
        for name in ("gamma", "gae_lambda"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"ppo.{name}={getattr(self, name)!r} must lie in [0, 1]")
        if not self.hidden or min(self.hidden) <= 0:
            raise ValueError(f"ppo.hidden={list(self.hidden)} must be non-empty positive widths")

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.horizon

    @property
    def num_minibatches(self) -> int:
        return self.batch_size // self.minibatch_size

    @classmethod
    def vectorised(cls, **overrides) -> PPOConfig:
        """Many envs, short horizon: 16 x 128 = 2048 per iteration, 32 minibatches."""
        return cls(**{"num_envs": 16, "horizon": 128, **overrides})


@struct.dataclass
class PPOState:
    """What crosses the jitted update: params, optimiser state, and the PRNG key."""

    params: dict
    opt_state: optax.OptState
    key: jax.Array


@struct.dataclass
class Rollout:
    """One iteration's experience, time first. ``obs`` are already normalised."""

    obs: jax.Array  # [T, N, D]
    actions: jax.Array  # [T, N, A] sampled (unclipped)
    logprobs: jax.Array  # [T, N]
    values: jax.Array  # [T + 1, N] (values[t + 1]: V of what step t returned)
    rewards: jax.Array  # [T, N] (scaled if scale_rewards)
    terminated: jax.Array  # [T, N]
    truncated: jax.Array  # [T, N]
    valid: jax.Array  # [T, N] 0 on next-step autoreset rows


class PPOLearner:
    """Networks + optimiser + jitted ``act`` / ``value`` / ``update`` for one config."""

    def __init__(self, config: PPOConfig, obs_dim: int, act_dim: int, total_iterations: int):
        self.config, self.obs_dim, self.act_dim = config, obs_dim, act_dim
        c = config
        self.actor_net, self.critic_net, _ = init_networks(
            jax.random.key(0), obs_dim, act_dim, c.hidden
        )
        steps = max(1, total_iterations * c.epochs * c.num_minibatches)
        lr: float | Callable = (
            optax.linear_schedule(c.learning_rate, 0.0, steps) if c.anneal_lr else c.learning_rate
        )
        self.optimizer = optax.chain(
            optax.clip_by_global_norm(c.max_grad_norm), optax.adam(lr, eps=1e-5)
        )
        self.update = jax.jit(self._update, donate_argnums=(0,))

    def init(self, key: jax.Array) -> PPOState:
        k_net, k_state = jax.random.split(key)
        _, _, params = init_networks(k_net, self.obs_dim, self.act_dim, self.config.hidden)
        return PPOState(params=params, opt_state=self.optimizer.init(params), key=k_state)

    # The rollout acts on the host (``ppo_networks.NumpyPolicy``); the device only updates.

    def _apply_actor(self, actor_params, obs):
        return self.actor_net.apply({"params": actor_params}, obs)

    def _apply_critic(self, critic_params, obs):
        return self.critic_net.apply({"params": critic_params}, obs)

    # ---------------------------------------------------------------- the update

    def _update(self, state: PPOState, rollout: Rollout):
        """GAE, then ``epochs`` shuffled passes of ``num_minibatches`` gradient steps."""
        c = self.config
        adv, ret = rollout_gae(
            rollout.rewards,
            rollout.values,
            rollout.terminated,
            rollout.truncated,
            rollout.valid,
            c.gamma,
            c.gae_lambda,
        )
        flat = Minibatch(
            obs=rollout.obs.reshape(c.batch_size, -1),
            actions=rollout.actions.reshape(c.batch_size, -1),
            old_logprobs=rollout.logprobs.reshape(-1),
            old_values=rollout.values[:-1].reshape(-1),
            advantages=adv.reshape(-1),
            returns=ret.reshape(-1),
            valid=rollout.valid.reshape(-1),
        )
        loss_fn = jax.value_and_grad(
            lambda p, mb: ppo_loss(
                p,
                self._apply_actor,
                self._apply_critic,
                mb,
                clip_eps=c.clip_eps,
                vf_coef=c.vf_coef,
                ent_coef=c.ent_coef,
                clip_value=c.clip_value,
            ),
            has_aux=True,
        )

        def sgd_step(carry, mb):
            params, opt_state = carry
            (_, metrics), grads = loss_fn(params, mb)
            updates, opt_state = self.optimizer.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), metrics

        def epoch(carry, key):
            perm = jax.random.permutation(key, c.batch_size)
            shuffled = jax.tree.map(
                lambda x: x[perm].reshape(c.num_minibatches, c.minibatch_size, *x.shape[1:]),
                flat,
            )
            return jax.lax.scan(sgd_step, carry, shuffled)

        key, k_epochs = jax.random.split(state.key)
        (params, opt_state), metrics = jax.lax.scan(
            epoch, (state.params, state.opt_state), jax.random.split(k_epochs, c.epochs)
        )
        metrics = {k: v[-1].mean() for k, v in metrics.items()}  # the last epoch's means
        metrics["value/explained_variance"] = _explained_variance(
            rollout.values[:-1], ret, rollout.valid
        )
        return PPOState(params=params, opt_state=opt_state, key=key), metrics


def _explained_variance(values, returns, valid):
    m = valid.astype(jnp.float32)
    n = jnp.maximum(m.sum(), 1.0)
    var_r = jnp.sum(m * (returns - jnp.sum(m * returns) / n) ** 2) / n
    resid = returns - values
    var_e = jnp.sum(m * (resid - jnp.sum(m * resid) / n) ** 2) / n
    return 1.0 - var_e / jnp.maximum(var_r, 1e-8)
