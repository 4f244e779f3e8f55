"""Losses, KL estimators and aggregation: hand-computed cases and numpy references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.rl import kl as K
from jaxagent.models import token_logprobs_and_entropy
from jaxagent.rl import losses as L
from jaxagent.rl.config import LossConfig, KLConfig, RLConfig, RLConfigError, UpdateConfig
from jaxagent.rl.recipes import default_samples_per_task, get_recipe, recipe_names


def np_log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def ppo_reference(logp, old, adv, mask, eps_low, eps_high, lower):
    ratio = np.exp(logp - old)
    low = 1 - eps_low if lower == "subtract" else 1 / (1 + eps_low)
    loss = -np.minimum(ratio * adv, np.clip(ratio, low, 1 + eps_high) * adv)
    return loss * mask


def test_token_logprobs_and_entropy_match_numpy():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 5, 7)).astype(np.float32)
    tokens = rng.integers(0, 7, size=(2, 5))
    lp, ent = jax.jit(token_logprobs_and_entropy)(logits, tokens)
    ls = np_log_softmax(logits.astype(np.float64))
    ref_lp = np.zeros((2, 5))
    ref_ent = np.zeros((2, 5))
    for b in range(2):
        for t in range(1, 5):  # entry t is predicted by logits[t - 1]; entry 0 is 0
            ref_lp[b, t] = ls[b, t - 1, tokens[b, t]]
            ref_ent[b, t] = -(np.exp(ls[b, t - 1]) * ls[b, t - 1]).sum()
    np.testing.assert_allclose(lp, ref_lp, atol=1e-5)
    np.testing.assert_allclose(ent, ref_ent, atol=1e-5)


def test_aggregation_modes_hand_computed():
    loss = jnp.array([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0], [9.0, 9.0, 9.0, 9.0]])
    mask = jnp.array([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    # token mean: (1 + 2 + 3 + 4) / 4 = 2.5
    assert float(L.aggregate(loss, mask, "token_mean")) == pytest.approx(2.5)
    # seq mean of token means: (2 + 4) / 2 = 3 (the empty third row does not count)
    assert float(L.aggregate(loss, mask, "seq_mean_token_mean")) == pytest.approx(3.0)
    # seq sum / (2 sequences * 5): 10 / 10 = 1
    assert float(L.aggregate(loss, mask, "seq_sum_norm", norm_constant=5.0)) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="aggregation"):
        L.aggregate(loss, mask, "mean")


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_sum_norm"])
def test_aggregation_is_additive_over_microbatches(mode):
    rng = np.random.default_rng(1)
    loss = rng.normal(size=(6, 8))
    mask = (rng.random((6, 8)) < 0.5).astype(float)
    nt, ns = L.aggregation_denominators(mask)
    whole = L.aggregate(loss, mask, mode, norm_constant=3.0)
    parts = sum(
        L.aggregate(
            loss[i : i + 2], mask[i : i + 2], mode, num_tokens=nt, num_seqs=ns, norm_constant=3.0
        )
        for i in (0, 2, 4)
    )
    np.testing.assert_allclose(parts, whole, rtol=1e-6)


def test_ppo_clip_hand_computed():
    # ratio 1.5, A = +1, eps 0.2: min(1.5, 1.2) = 1.2 -> loss -1.2, clipped high.
    # ratio 0.5, A = -1: min(-0.5, -0.8) = -0.8 -> loss 0.8, clipped low.
    # ratio 1.1, A = +2: inside the range -> loss -2.2, no clip.
    lr = jnp.log(jnp.array([[1.5, 0.5, 1.1]]))
    adv = jnp.array([[1.0, -1.0, 2.0]])
    loss, lo, hi = L.ppo_clip_loss(lr, adv, 0.2, 0.2)
    np.testing.assert_allclose(loss, [[-1.2, 0.8, -2.2]], atol=1e-6)
    np.testing.assert_array_equal(lo, [[0, 1, 0]])
    np.testing.assert_array_equal(hi, [[1, 0, 0]])
    # clip-higher (DAPO 0.2 / 0.28): the first token is now capped at 1.28.
    loss, _, _ = L.ppo_clip_loss(lr, adv, 0.2, 0.28)
    np.testing.assert_allclose(loss[0, 0], -1.28, atol=1e-6)
    # LOOP-code lower bound 1 / (1 + 0.2) = 0.8333: the second token gives 0.8333.
    loss, _, _ = L.ppo_clip_loss(lr, adv, 0.2, 0.2, "reciprocal")
    np.testing.assert_allclose(loss[0, 1], 1 / 1.2, atol=1e-6)


@pytest.mark.parametrize("lower", ["subtract", "reciprocal"])
def test_ppo_loss_matches_numpy_and_gradient_is_zero_when_clipped(lower):
    rng = np.random.default_rng(2)
    logp = rng.normal(scale=0.3, size=(4, 9)) - 2
    old = logp + rng.normal(scale=0.3, size=(4, 9))
    adv = rng.normal(size=(4, 9))
    mask = (rng.random((4, 9)) < 0.6).astype(float)
    lr = L.importance_log_ratio(logp, old, mask)
    loss, lo, hi = L.ppo_clip_loss(lr, adv, 0.2, 0.28, lower)
    np.testing.assert_allclose(
        np.asarray(loss) * mask, ppo_reference(logp, old, adv, mask, 0.2, 0.28, lower), atol=1e-5
    )
    grad = jax.grad(
        lambda lp: jnp.sum(
            L.ppo_clip_loss(L.importance_log_ratio(lp, old, mask), adv, 0.2, 0.28, lower)[0] * mask
        )
    )(jnp.asarray(logp))
    clipped = (np.asarray(lo) + np.asarray(hi)) * mask
    assert clipped.sum() > 0 and (clipped == 0).sum() > 0
    np.testing.assert_array_equal(np.asarray(grad)[clipped > 0], 0.0)
    # Unclipped tokens: d(-ratio * A)/d logp = -ratio * A.
    free = (clipped == 0) & (mask > 0)
    np.testing.assert_allclose(np.asarray(grad)[free], (-np.exp(logp - old) * adv)[free], atol=1e-5)


def test_trajectory_and_turn_ratios_equal_products():
    rng = np.random.default_rng(4)
    logp = rng.normal(scale=0.2, size=(3, 10))
    old = logp + rng.normal(scale=0.2, size=(3, 10))
    mask = np.ones((3, 10))
    mask[:, :2] = 0  # prompt
    mask[:, 5:7] = 0  # an observation between two turns
    turns = np.full((3, 10), -1)
    turns[:, 2:5] = 0
    turns[:, 7:] = 1
    tok = np.exp(logp - old) * mask + (1 - mask)  # per-token ratios, 1 off policy tokens
    traj = np.exp(np.asarray(L.importance_log_ratio(logp, old, mask, "trajectory")))
    for b in range(3):
        np.testing.assert_allclose(traj[b][mask[b] > 0], np.prod(tok[b]), rtol=1e-5)
    turn = np.exp(np.asarray(L.importance_log_ratio(logp, old, mask, "turn", turns)))
    for b in range(3):
        np.testing.assert_allclose(turn[b, 2:5], np.prod(tok[b, 2:5]), rtol=1e-5)
        np.testing.assert_allclose(turn[b, 7:], np.prod(tok[b, 7:]), rtol=1e-5)
    with pytest.raises(ValueError, match="turn_ids"):
        L.importance_log_ratio(logp, old, mask, "turn")


def test_kl_estimators_hand_computed():
    # p = 0.5, p_ref = 0.25: log r = log 0.5 = -0.6931
    # k1 = 0.6931, k2 = 0.2402, k3 = 0.5 - 1 + 0.6931 = 0.1931
    lp, ref = jnp.log(jnp.array([0.5])), jnp.log(jnp.array([0.25]))
    np.testing.assert_allclose(K.kl_estimate(lp, ref, "k1"), [np.log(2)], atol=1e-6)
    np.testing.assert_allclose(K.kl_estimate(lp, ref, "k2"), [0.5 * np.log(2) ** 2], atol=1e-6)
    np.testing.assert_allclose(K.kl_estimate(lp, ref, "k3"), [np.log(2) - 0.5], atol=1e-6)
    with pytest.raises(ValueError, match="k4"):
        K.kl_estimate(lp, ref, "k4")


def test_kl_estimators_are_unbiased_on_average():
    # Sample from p and average: k1 and k3 estimate KL(p || q) without bias.
    rng = np.random.default_rng(5)
    p = np.array([0.6, 0.3, 0.1])
    q = np.array([0.3, 0.3, 0.4])
    x = rng.choice(3, size=200_000, p=p)
    true_kl = float(np.sum(p * np.log(p / q)))
    for est in ("k1", "k3"):
        val = float(jnp.mean(K.kl_estimate(jnp.log(p[x]), jnp.log(q[x]), est)))
        assert val == pytest.approx(true_kl, abs=5e-3)


def test_kl_penalized_rewards():
    r = jnp.array([[0.0, 1.0]])
    out = K.kl_penalized_rewards(
        r,
        jnp.log(jnp.array([[0.5, 0.5]])),
        jnp.log(jnp.array([[0.25, 0.5]])),
        jnp.array([[1.0, 1.0]]),
        beta=0.1,
        estimator="k1",
    )
    np.testing.assert_allclose(out, [[-0.1 * np.log(2), 1.0]], atol=1e-6)


def test_value_loss_clipped_hand_computed():
    # V = 2, V_old = 1, R = 3, eps 0.5: unclipped (2-3)^2 = 1; clipped V = 1.5 -> (1.5-3)^2 = 2.25.
    v = L.value_loss(jnp.array([2.0]), jnp.array([1.0]), jnp.array([3.0]), clip_eps=0.5)
    np.testing.assert_allclose(v, [0.5 * 2.25])
    np.testing.assert_allclose(L.value_loss(jnp.array([2.0]), None, jnp.array([3.0])), [0.5])


def test_reinforce_sft_rft():
    lp = jnp.array([[-1.0, -2.0]])
    np.testing.assert_allclose(L.reinforce_loss(lp, jnp.array([[2.0, -1.0]])), [[2.0, -2.0]])
    np.testing.assert_allclose(L.sft_loss(lp), [[1.0, 2.0]])
    np.testing.assert_array_equal(L.rft_keep_mask(jnp.array([1.0, 0.5, 2.0]), 1.0), [1, 0, 1])


def test_recipes_defaults_and_errors():
    assert set(recipe_names()) >= {
        "ppo",
        "grpo",
        "dr_grpo",
        "dapo",
        "loop",
        "rloo",
        "reinforce",
        "rft",
    }
    loop = get_recipe("loop")
    assert default_samples_per_task("loop") == 6
    assert (loop.loss.clip_eps_low, loop.update.num_epochs, loop.update.minibatch_size) == (
        0.1,
        2,
        32,
    )
    assert loop.kl.mode == "none" and not loop.critic.enabled and loop.advantage.std_mode == "none"
    assert (loop.lora.rank, loop.lora.alpha, loop.loss.ratio_level) == (16, 32.0, "token")
    assert loop.advantage.truncated == "keep"  # the documented default of every recipe
    assert not loop.needs_reference and get_recipe("grpo").needs_reference
    dapo = get_recipe("dapo")
    assert (dapo.loss.clip_eps_low, dapo.loss.clip_eps_high, dapo.loss.aggregation) == (
        0.2,
        0.28,
        "token_mean",
    )
    assert get_recipe("ppo").critic.enabled and get_recipe("ppo").advantage.estimator == "gae"
    assert get_recipe("reinforce").advantage.estimator == "batch_mean"
    assert [default_samples_per_task(n) for n in ("grpo", "dapo", "rloo", "ppo")] == [64, 16, 4, 1]
    # A section change keeps the preset's other fields of that section.
    grpo = get_recipe("grpo", kl={"beta": 0.1})
    assert (grpo.kl.beta, grpo.kl.mode, grpo.kl.estimator) == (0.1, "loss", "k3")
    with pytest.raises(KeyError, match="known recipes: dapo"):
        get_recipe("lopp")
    with pytest.raises(RLConfigError, match="loss.clip_eps"):
        get_recipe("loop", loss={"clip_eps": 0.2})
    with pytest.raises(RLConfigError, match="unknown RLConfig section 'losses'"):
        get_recipe("loop", losses={})
    with pytest.raises(ValueError, match="loss.aggregation='mean'"):
        LossConfig(aggregation="mean")
    with pytest.raises(ValueError, match="update.microbatch_size=5"):
        UpdateConfig(minibatch_size=32, microbatch_size=5)
    with pytest.raises(ValueError, match="kl.beta=0.0 must be > 0"):
        KLConfig(mode="loss", beta=0.0)
    with pytest.raises(ValueError, match="needs critic.enabled"):
        get_recipe("ppo", critic={"enabled": False})
    assert isinstance(RLConfig(), RLConfig)
