"""DQN over feature vectors: Q-network, replay buffer, epsilon schedule, jitted (double) update.

Everything is a pure function of arrays and pytrees (Mnih et al. 2015; double DQN, van Hasselt
et al. 2016): ``init_dqn`` builds the ``DQNState`` (online and target parameters, optimiser
state, update count); ``make_update_fn(config)`` returns the jitted ``update(state, batch) ->
(state, metrics)`` (Huber TD loss, global-norm clipping, hard target copy every
``target_every`` updates inside the jit); the replay buffer is a fixed-size ring of arrays
(``buffer_init`` / ``buffer_add`` / ``buffer_sample``, jittable); ``epsilon(step, config)``
is the linear exploration schedule; ``select_actions`` is epsilon-greedy over a batch.

Shapes: observations ``[B, F]`` float32, actions ``[B]`` int32, rewards ``[B]``,
``terminated [B]`` (1 = a real end: no bootstrap; a budget cut is not terminated, so the
target still bootstraps from ``next_obs``).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class DQNConfig:
    """DQN hyper-parameters (all static: they set shapes or are compile-time constants)."""

    hidden: tuple[int, ...] = (128, 128)  # MLP widths
    learning_rate: float = 1e-3  # Adam
    gamma: float = 0.95  # discount (dialogues last about 5-15 turns)
    batch_size: int = 64  # transitions per update
    buffer_size: int = 50_000  # replay capacity (oldest overwritten)
    target_every: int = 200  # updates between hard copies of the online net to the target
    double: bool = True  # double DQN: the online net picks the next action, the target rates it
    huber_delta: float = 1.0  # Huber loss threshold on the TD error
    max_grad_norm: float = 10.0  # global-norm clipping
    eps_start: float = 1.0  # exploration at step 0
    eps_end: float = 0.05  # exploration after eps_decay_steps
    eps_decay_steps: int = 20_000  # environment steps of linear decay

    def __post_init__(self):
        if not self.hidden or any(h <= 0 for h in self.hidden):
            raise ValueError(f"DQNConfig.hidden={self.hidden!r} must be positive widths")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"DQNConfig.gamma={self.gamma!r} must lie in [0, 1]")
        for name in ("learning_rate", "batch_size", "buffer_size", "target_every"):
            if getattr(self, name) <= 0:
                raise ValueError(f"DQNConfig.{name}={getattr(self, name)!r} must be > 0")
        if not 0.0 <= self.eps_end <= self.eps_start <= 1.0:
            raise ValueError(
                f"DQNConfig.eps_end={self.eps_end!r} <= eps_start={self.eps_start!r} must "
                "both lie in [0, 1]"
            )


class QNetwork(nn.Module):
    """MLP ``[B, F] -> [B, A]`` Q-values."""

    hidden: tuple[int, ...]
    num_actions: int

    @nn.compact
    def __call__(self, obs_bf):
        x = obs_bf
        for width in self.hidden:
            x = nn.relu(nn.Dense(width)(x))
        return nn.Dense(self.num_actions)(x)


@struct.dataclass
class DQNState:
    params: Any
    target_params: Any
    opt_state: Any
    updates: jax.Array  # number of updates done (int32 scalar)


@struct.dataclass
class ReplayBuffer:
    obs: jax.Array  # [N, F]
    action: jax.Array  # [N]
    reward: jax.Array  # [N]
    next_obs: jax.Array  # [N, F]
    terminated: jax.Array  # [N]
    size: jax.Array  # filled entries (int32 scalar)
    pos: jax.Array  # next write index (int32 scalar)


def _network(config: DQNConfig, num_actions: int) -> QNetwork:
    return QNetwork(hidden=tuple(config.hidden), num_actions=num_actions)


def _optimizer(config: DQNConfig) -> optax.GradientTransformation:
    return optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm), optax.adam(config.learning_rate)
    )


@functools.lru_cache(maxsize=16)
def _init_fn(config: DQNConfig, num_actions: int, obs_dim: int):
    net = _network(config, num_actions)
    return jax.jit(lambda key: net.init(key, jnp.zeros((1, obs_dim), jnp.float32)))


def init_dqn(config: DQNConfig, obs_dim: int, num_actions: int, key: jax.Array) -> DQNState:
    params = _init_fn(config, num_actions, obs_dim)(key)  # one compile, not one per layer op
    return DQNState(
        params=params,
        target_params=jax.tree.map(jnp.copy, params),  # own buffers: the update donates state
        opt_state=_optimizer(config).init(params),
        updates=jnp.zeros((), jnp.int32),
    )


def q_values(config: DQNConfig, num_actions: int, params, obs_bf: jax.Array) -> jax.Array:
    """``[B, F] -> [B, A]``."""
    return _network(config, num_actions).apply(params, obs_bf)


def td_targets(config: DQNConfig, q_next_online, q_next_target, reward, terminated):
    """``r + gamma (1 - terminated) Q_target(s', a*)`` with ``a*`` from the online net (double)
    or the target net (vanilla). All ``[B]`` except the Q inputs ``[B, A]``."""
    chooser = q_next_online if config.double else q_next_target
    a_star = jnp.argmax(chooser, axis=-1)
    q_star = jnp.take_along_axis(q_next_target, a_star[:, None], axis=-1)[:, 0]
    return jax.lax.stop_gradient(reward + config.gamma * (1.0 - terminated) * q_star)


@functools.lru_cache(maxsize=16)  # seeds of one run share the compiled function
def make_update_fn(config: DQNConfig, num_actions: int):
    """The jitted ``update(state, batch) -> (state, metrics)`` (batch: dict of arrays)."""
    opt = _optimizer(config)

    def loss_fn(params, target_params, batch):
        q = q_values(config, num_actions, params, batch["obs"])
        q_taken = jnp.take_along_axis(q, batch["action"][:, None], axis=-1)[:, 0]
        q_next_online = q_values(config, num_actions, params, batch["next_obs"])
        q_next_target = q_values(config, num_actions, target_params, batch["next_obs"])
        target = td_targets(
            config, q_next_online, q_next_target, batch["reward"], batch["terminated"]
        )
        td = q_taken - target
        loss = optax.huber_loss(td, delta=config.huber_delta).mean()
        return loss, {"loss/td": loss, "q/mean": q_taken.mean(), "td/abs": jnp.abs(td).mean()}

    @jax.jit
    def update(state: DQNState, batch):
        grads, metrics = jax.grad(loss_fn, has_aux=True)(state.params, state.target_params, batch)
        updates, opt_state = opt.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        n = state.updates + 1
        copy = (n % config.target_every) == 0
        target = jax.tree.map(lambda p, t: jnp.where(copy, p, t), params, state.target_params)
        metrics["grad/norm"] = optax.global_norm(grads)
        return DQNState(params, target, opt_state, n), metrics

    return update


def epsilon(step: int, config: DQNConfig) -> float:
    """Linear decay from ``eps_start`` to ``eps_end`` over ``eps_decay_steps`` env steps
    (host-side arithmetic: the acting loop passes it to the jitted selector as a scalar)."""
    frac = min(max(step / config.eps_decay_steps, 0.0), 1.0)
    return config.eps_start + frac * (config.eps_end - config.eps_start)


@functools.lru_cache(maxsize=16)
def make_select_fn(config: DQNConfig, num_actions: int):
    """Jitted ``select(params, obs [B, F], key, eps) -> actions [B]`` (epsilon-greedy;
    ``eps=0`` is greedy)."""

    @jax.jit
    def select(params, obs_bf, key, eps):
        greedy = jnp.argmax(q_values(config, num_actions, params, obs_bf), axis=-1)
        k_explore, k_action = jax.random.split(key)
        explore = jax.random.uniform(k_explore, greedy.shape) < eps
        random = jax.random.randint(k_action, greedy.shape, 0, num_actions)
        return jnp.where(explore, random, greedy).astype(jnp.int32)

    return select


def buffer_init(capacity: int, obs_dim: int) -> ReplayBuffer:
    return ReplayBuffer(
        obs=jnp.zeros((capacity, obs_dim), jnp.float32),
        action=jnp.zeros((capacity,), jnp.int32),
        reward=jnp.zeros((capacity,), jnp.float32),
        next_obs=jnp.zeros((capacity, obs_dim), jnp.float32),
        terminated=jnp.zeros((capacity,), jnp.float32),
        size=jnp.zeros((), jnp.int32),
        pos=jnp.zeros((), jnp.int32),
    )


@functools.partial(jax.jit, donate_argnums=0)  # in place: no copy of the whole ring per add
def buffer_add(buf: ReplayBuffer, obs, action, reward, next_obs, terminated) -> ReplayBuffer:
    """Writes ``K`` transitions (leading axis K) at the ring position."""
    capacity = buf.obs.shape[0]
    idx = (buf.pos + jnp.arange(obs.shape[0])) % capacity
    return ReplayBuffer(
        obs=buf.obs.at[idx].set(obs),
        action=buf.action.at[idx].set(action.astype(jnp.int32)),
        reward=buf.reward.at[idx].set(reward.astype(jnp.float32)),
        next_obs=buf.next_obs.at[idx].set(next_obs),
        terminated=buf.terminated.at[idx].set(terminated.astype(jnp.float32)),
        size=jnp.minimum(buf.size + obs.shape[0], capacity),
        pos=(buf.pos + obs.shape[0]) % capacity,
    )


def buffer_sample(buf: ReplayBuffer, key: jax.Array, batch_size: int) -> dict[str, jax.Array]:
    """``batch_size`` transitions drawn uniformly (with replacement) from the filled part."""
    idx = jax.random.randint(key, (batch_size,), 0, jnp.maximum(buf.size, 1))
    return {
        "obs": buf.obs[idx],
        "action": buf.action[idx],
        "reward": buf.reward[idx],
        "next_obs": buf.next_obs[idx],
        "terminated": buf.terminated[idx],
    }


@functools.lru_cache(maxsize=16)
def make_train_step(config: DQNConfig, num_actions: int):
    """Jitted ``step(state, buf, key) -> (state, metrics)``: sample a batch and update."""
    update = make_update_fn(config, num_actions)

    @functools.partial(jax.jit, donate_argnums=0)
    def step(state: DQNState, buf: ReplayBuffer, key):
        return update(state, buffer_sample(buf, key, config.batch_size))

    return step
