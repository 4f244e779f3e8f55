"""Networks for continuous-control PPO: a Gaussian MLP actor with a state-independent log-std
and an MLP critic (Flax linen modules, applied as pure functions of their params).

Initialisation follows the "implementation matters" PPO recipe (Engstrom et al. 2020; the
CleanRL / baselines MuJoCo defaults): orthogonal weights with gain sqrt(2) in hidden layers,
0.01 on the policy mean (the first actions stay near zero, so early exploration comes from the
log-std alone) and 1.0 on the value head; zero biases; log-std starts at 0 (std 1).
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

_LOG_2PI = float(np.log(2.0 * np.pi))


def _dense(features: int, gain: float) -> nn.Dense:
    return nn.Dense(
        features,
        kernel_init=nn.initializers.orthogonal(gain),
        bias_init=nn.initializers.zeros,
    )


class MLP(nn.Module):
    """tanh MLP: ``x [..., D] -> [..., out]``."""

    hidden: Sequence[int]
    out: int
    out_gain: float

    @nn.compact
    def __call__(self, x):
        for width in self.hidden:
            x = jnp.tanh(_dense(width, float(np.sqrt(2.0)))(x))
        return _dense(self.out, self.out_gain)(x)


class GaussianActor(nn.Module):
    """``obs [..., D] -> (mean [..., A], log_std [A])``; the log-std is one free parameter per
    action dimension, independent of the state (Schulman et al. 2017, MuJoCo setting)."""

    act_dim: int
    hidden: Sequence[int] = (64, 64)

    @nn.compact
    def __call__(self, obs):
        mean = MLP(tuple(self.hidden), self.act_dim, 0.01)(obs)
        log_std = self.param("log_std", nn.initializers.zeros, (self.act_dim,))
        return mean, log_std


class Critic(nn.Module):
    """``obs [..., D] -> value [...]``."""

    hidden: Sequence[int] = (64, 64)

    @nn.compact
    def __call__(self, obs):
        return MLP(tuple(self.hidden), 1, 1.0)(obs)[..., 0]


def gaussian_logprob(mean: jax.Array, log_std: jax.Array, action: jax.Array) -> jax.Array:
    """Log-density of a diagonal Gaussian: ``mean, action [..., A]``, ``log_std [A]`` -> [...]."""
    z = (action - mean) * jnp.exp(-log_std)
    return jnp.sum(-0.5 * z * z - log_std - 0.5 * _LOG_2PI, axis=-1)


def gaussian_entropy(log_std: jax.Array) -> jax.Array:
    """Entropy of a diagonal Gaussian with ``log_std [A]`` (a scalar)."""
    return jnp.sum(log_std + 0.5 * (1.0 + _LOG_2PI))


def init_networks(key: jax.Array, obs_dim: int, act_dim: int, hidden: Sequence[int]):
    """Fresh ``(actor, critic, params)``; ``params = {"actor": ..., "critic": ...}``."""
    actor, critic = GaussianActor(act_dim, tuple(hidden)), Critic(tuple(hidden))
    k_actor, k_critic = jax.random.split(key)
    dummy = jnp.zeros((1, obs_dim), jnp.float32)
    params = {
        "actor": actor.init(k_actor, dummy)["params"],
        "critic": critic.init(k_critic, dummy)["params"],
    }
    return actor, critic, params


def _numpy_mlp(mlp_params) -> list[tuple[np.ndarray, np.ndarray]]:
    layers = sorted(mlp_params, key=lambda name: int(name.split("_")[-1]))  # Dense_0, Dense_1..
    return [
        (np.asarray(mlp_params[n]["kernel"]), np.asarray(mlp_params[n]["bias"])) for n in layers
    ]


class NumpyPolicy:
    """The actor and critic of ``params`` as float32 numpy, for the host's per-step loop.

    Why: one step of the rollout is a 64-wide MLP on N rows, microseconds of arithmetic, while
    a jitted call costs a dispatch plus a device round trip per step (measured ~2.8 ms a step on
    this 2-core machine under load, 10x the physics). Built once per rollout from the current
    params; ``tests/test_ppo_continuous.py`` checks it against the Flax modules.
    """

    def __init__(self, params):
        self.actor = _numpy_mlp(params["actor"]["MLP_0"])
        self.critic = _numpy_mlp(params["critic"]["MLP_0"])
        self.log_std = np.asarray(params["actor"]["log_std"], np.float32)
        self.std = np.exp(self.log_std)

    @staticmethod
    def _forward(layers, x):
        for w, b in layers[:-1]:
            x = np.tanh(x @ w + b)
        w, b = layers[-1]
        return x @ w + b

    def mean(self, obs: np.ndarray) -> np.ndarray:
        """``obs [N, D]`` (normalised, float32) -> action mean ``[N, A]``."""
        return self._forward(self.actor, obs)

    def value(self, obs: np.ndarray) -> np.ndarray:
        return self._forward(self.critic, obs)[:, 0]

    def sample(self, obs: np.ndarray, rng: np.random.Generator):
        """``(action [N, A], logprob [N], value [N])`` with Gaussian noise from ``rng``."""
        mean = self.mean(obs)
        noise = rng.standard_normal(mean.shape, dtype=np.float32)
        action = mean + self.std * noise
        logp = np.sum(-0.5 * noise * noise - self.log_std - 0.5 * _LOG_2PI, axis=-1)
        return action, logp.astype(np.float32), self.value(obs)
