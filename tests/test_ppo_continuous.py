"""Continuous-control PPO pieces: GAE with truncation bootstrapping, the normalisers, the host
policy against the Flax modules, the loss against an inline reference, config errors."""

from pathlib import Path

import gymnasium as gym
import jax
import numpy as np
import pytest

from jaxagent.learners.ppo_continuous.update import PPOConfig, PPOLearner
from jaxagent.learners.ppo_continuous.losses import Minibatch, ppo_loss, rollout_gae
from jaxagent.learners.ppo_continuous.networks import NumpyPolicy, gaussian_logprob, init_networks
from jaxagent.learners.ppo_continuous.normalize import RewardScaler, RunningMoments, update_moments
from jaxagent.errors import ConfigError
from jaxagent.learners.ppo_continuous.train import load_ppo_config

CONFIG = Path(__file__).resolve().parent.parent / "configs/ppo_halfcheetah.yaml"


def test_gae_bootstraps_truncations_and_not_terminations_by_hand():
    # gamma 0.9, lambda 0.8 (gamma * lambda = 0.72). Row 2 of both envs is the next-step
    # autoreset placeholder (valid 0); values[2] is V(final obs) of the episode that ended at 1.
    rewards = np.array([[1, 0], [1, 2], [0, 0], [1, 1]], np.float32)  # [T=4, N=2]
    values = np.array([[0.5, 0.1], [0.6, 0.4], [0.7, 9.0], [0.2, 0.0], [0.3, 1.0]], np.float32)
    terminated = np.array([[0, 0], [0, 1], [0, 0], [0, 0]], np.float32)
    truncated = np.array([[0, 0], [1, 0], [0, 0], [0, 0]], np.float32)
    valid = np.array([[1, 1], [1, 1], [0, 0], [1, 1]], np.float32)
    adv, ret = jax.jit(rollout_gae, static_argnums=(5, 6))(
        rewards, values, terminated, truncated, valid, 0.9, 0.8
    )
    # env 0 (truncated at t=1, bootstraps V(final obs) = 0.7):
    #   t3: 1 + 0.9*0.3 - 0.2 = 1.07          t1: 1 + 0.9*0.7 - 0.6 = 1.03
    #   t0: 1 + 0.9*0.6 - 0.5 + 0.72*1.03 = 1.04 + 0.7416 = 1.7816
    # env 1 (terminated at t=1: next value 0, the 9.0 never enters):
    #   t3: 1 + 0.9*1.0 - 0 = 1.9             t1: 2 - 0.4 = 1.6
    #   t0: 0 + 0.9*0.4 - 0.1 + 0.72*1.6 = 0.26 + 1.152 = 1.412
    want = np.array([[1.7816, 1.412], [1.03, 1.6], [0.0, 0.0], [1.07, 1.9]])
    np.testing.assert_allclose(adv, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ret, (want + values[:-1]) * valid, rtol=1e-5, atol=1e-6)


def _gae_reference(rewards, values, terminated, truncated, valid, gamma, lam):
    T, N = rewards.shape
    adv = np.zeros((T, N))
    for i in range(N):
        nxt = 0.0
        for t in reversed(range(T)):
            if not valid[t, i]:
                continue  # the placeholder row; the step before it is done, so nothing chains
            done = terminated[t, i] or truncated[t, i]
            next_v = 0.0 if terminated[t, i] else values[t + 1, i]
            delta = rewards[t, i] + gamma * next_v - values[t, i]
            last = t == T - 1
            nxt = delta + (0.0 if (done or last) else gamma * lam * nxt)
            adv[t, i] = nxt
    return adv


def test_gae_matches_a_numpy_loop_on_random_episodes():
    rng = np.random.default_rng(0)
    T, N = 64, 5
    rewards = rng.normal(size=(T, N)).astype(np.float32)
    values = rng.normal(size=(T + 1, N)).astype(np.float32)
    ends = rng.random((T, N)) < 0.1
    kind = rng.random((T, N)) < 0.5
    terminated, truncated = (ends & kind).astype(np.float32), (ends & ~kind).astype(np.float32)
    valid = np.ones((T, N), np.float32)
    valid[1:] = 1.0 - ends[:-1]  # the row after an end is the autoreset placeholder
    terminated *= valid
    truncated *= valid
    adv, _ = jax.jit(rollout_gae, static_argnums=(5, 6))(
        rewards, values, terminated, truncated, valid, 0.99, 0.95
    )
    ref = _gae_reference(rewards, values, terminated, truncated, valid, 0.99, 0.95)
    np.testing.assert_allclose(adv, ref, rtol=1e-4, atol=1e-5)


def test_running_moments_match_numpy_over_batches():
    rng = np.random.default_rng(1)
    batches = [rng.normal(3.0, 2.0, size=(k, 4)) for k in (1, 7, 100, 3)]
    m = RunningMoments(0.0, np.zeros(4), np.zeros(4))  # no prior: exact
    for b in batches:
        m = update_moments(m, b)
    allx = np.concatenate(batches)
    np.testing.assert_allclose(m.mean, allx.mean(0), rtol=1e-12)
    np.testing.assert_allclose(m.var, allx.var(0), rtol=1e-12)
    assert m.count == len(allx)


def test_reward_scaler_divides_by_the_std_of_discounted_returns_and_skips_placeholders():
    rng = np.random.default_rng(2)
    gamma, n = 0.9, 3
    scaler = RewardScaler(n, gamma, clip=1e9)
    ret, seen = np.zeros(n), []
    for t in range(200):
        r = rng.normal(size=n)
        done = rng.random(n) < 0.05
        valid = rng.random(n) < 0.9
        out = scaler.scale(r, done, valid)
        ret = np.where(valid, gamma * ret + r, ret)
        seen.extend(ret[valid])
        want = r / np.sqrt(np.var(seen) + 1e-8) * valid
        ret = np.where(valid & done, 0.0, ret)
        # the 1e-4 prior (Gymnasium's) is all that separates the two
        np.testing.assert_allclose(out, want, rtol=1e-3, atol=1e-6)
    assert np.all(out[~valid] == 0)


def test_numpy_policy_matches_the_flax_modules():
    actor, critic, params = init_networks(jax.random.key(3), 5, 2, (16, 8))
    params = jax.tree.map(lambda x: np.asarray(x) + 0.1, params)  # non-trivial log-std
    obs = np.random.default_rng(4).normal(size=(7, 5)).astype(np.float32)

    @jax.jit  # one compilation instead of one per eager op
    def reference(params, obs):
        mean, log_std = actor.apply({"params": params["actor"]}, obs)
        return mean, log_std, critic.apply({"params": params["critic"]}, obs)

    mean, log_std, value = reference(params, obs)
    pol = NumpyPolicy(jax.device_get(params))
    np.testing.assert_allclose(pol.mean(obs), mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(pol.value(obs), value, rtol=1e-5, atol=1e-6)
    action, logp, v = pol.sample(obs, np.random.default_rng(5))
    np.testing.assert_allclose(logp, gaussian_logprob(mean, log_std, action), rtol=1e-5)
    np.testing.assert_allclose(v, value, rtol=1e-5, atol=1e-6)


def _loss_reference(mean, log_std, value, mb, eps, vf, ent):
    m = mb.valid
    logp = np.sum(
        -0.5 * ((mb.actions - mean) / np.exp(log_std)) ** 2 - log_std - 0.5 * np.log(2 * np.pi),
        -1,
    )
    ratio = np.exp(logp - mb.old_logprobs)
    a = mb.advantages[m > 0]
    adv = (mb.advantages - a.mean()) / (a.std() + 1e-8)
    surr = np.minimum(ratio * adv, np.clip(ratio, 1 - eps, 1 + eps) * adv)
    pg = -surr[m > 0].mean()
    vc = mb.old_values + np.clip(value - mb.old_values, -eps, eps)
    verr = np.maximum((value - mb.returns) ** 2, (vc - mb.returns) ** 2)
    v_loss = 0.5 * verr[m > 0].mean()
    entropy = np.sum(log_std + 0.5 * (1 + np.log(2 * np.pi)))
    return pg + vf * v_loss - ent * entropy


def test_ppo_loss_matches_an_inline_reference_with_masked_rows():
    actor, critic, params = init_networks(jax.random.key(6), 3, 2, (8,))
    rng = np.random.default_rng(7)
    M = 32
    mb = Minibatch(
        obs=rng.normal(size=(M, 3)).astype(np.float32),
        actions=rng.normal(size=(M, 2)).astype(np.float32),
        old_logprobs=rng.normal(-2.5, 0.3, size=M).astype(np.float32),
        old_values=rng.normal(size=M).astype(np.float32),
        advantages=rng.normal(size=M).astype(np.float32),
        returns=rng.normal(size=M).astype(np.float32),
        valid=(rng.random(M) < 0.8).astype(np.float32),
    )

    def apply_actor(p, o):
        return actor.apply({"params": p}, o)

    def apply_critic(p, o):
        return critic.apply({"params": p}, o)

    loss, metrics = jax.jit(
        lambda p, b: ppo_loss(
            p,
            apply_actor,
            apply_critic,
            b,
            clip_eps=0.2,
            vf_coef=0.5,
            ent_coef=0.01,
            clip_value=True,
        )
    )(params, mb)
    mean, log_std = apply_actor(params["actor"], mb.obs)
    value = apply_critic(params["critic"], mb.obs)
    want = _loss_reference(
        np.asarray(mean), np.asarray(log_std), np.asarray(value), mb, 0.2, 0.5, 0.01
    )
    np.testing.assert_allclose(loss, want, rtol=1e-5)
    assert 0.0 < float(metrics["policy/clip_frac"]) < 1.0  # the clip is exercised


def test_update_is_one_jitted_call_that_moves_params_and_keeps_shapes():
    c = PPOConfig(num_envs=2, horizon=16, epochs=2, minibatch_size=8, hidden=(8,))
    learner = PPOLearner(c, 3, 1, total_iterations=4)
    state = learner.init(jax.random.key(0))
    before = jax.device_get(state.params)
    rng = np.random.default_rng(0)
    from jaxagent.learners.ppo_continuous.update import Rollout

    T, N = 16, 2
    rollout = Rollout(
        obs=rng.normal(size=(T, N, 3)).astype(np.float32),
        actions=rng.normal(size=(T, N, 1)).astype(np.float32),
        logprobs=np.full((T, N), -1.4, np.float32),
        values=np.zeros((T + 1, N), np.float32),
        rewards=rng.normal(size=(T, N)).astype(np.float32),
        terminated=np.zeros((T, N), np.float32),
        truncated=np.zeros((T, N), np.float32),
        valid=np.ones((T, N), np.float32),
    )
    state, metrics = learner.update(state, rollout)
    after = jax.device_get(state.params)
    moved = jax.tree.map(lambda a, b: float(np.abs(a - b).max()), before, after)
    assert max(jax.tree.leaves(moved)) > 0
    assert all(np.isfinite(float(v)) for v in metrics.values())
    assert learner.update._cache_size() == 1


@pytest.mark.parametrize(
    "override, words",
    [
        (["ppo.minibatch_size=100"], ["ppo.minibatch_size=100", "divide"]),
        (["ppo.horizonn=10"], ["horizonn", "horizon"]),
        (["env.name=Cheetah"], ["env.name='Cheetah'", "HalfCheetah-v5"]),
        (["ppo.gamma=1.5"], ["ppo.gamma=1.5"]),
    ],
)
def test_bad_config_values_name_the_field_and_the_fix(override, words):
    with pytest.raises(ConfigError) as err:
        load_ppo_config(CONFIG, override)
    for w in words:
        assert w in str(err.value)


def test_inverted_pendulum_through_the_pool_matches_gymnasium():
    from jaxagent.envs.robot import MujocoVectorEnv

    n = 3
    ours = MujocoVectorEnv("InvertedPendulum-v5", n, max_episode_steps=40)
    ref = gym.vector.SyncVectorEnv(
        [lambda: gym.make("InvertedPendulum-v5", max_episode_steps=40) for _ in range(n)]
    )
    np.testing.assert_array_equal(ours.reset(seed=5)[0], ref.reset(seed=5)[0])
    rng, ends = np.random.default_rng(0), 0
    for _ in range(120):
        a = rng.uniform(-0.3, 0.3, (n, 1)).astype(np.float32)
        for x, y in zip(ours.step(a)[:4], ref.step(a)[:4]):
            np.testing.assert_array_equal(x, y)
        ends += int(ours._needs_reset.sum())
    assert ends > 3  # terminations, truncations and autoresets were all crossed
    ours.close()
