"""Advantage estimators: hand-computed cases and slow numpy references with masks and ragged groups."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.rl import advantages as A


# ----------------------------------------------------------------------------- slow references


def gae_reference(r, v, term, trunc, boot, mask, gamma, lam):
    b_, t_ = r.shape
    adv = np.zeros((b_, t_))
    for b in range(b_):
        idx = [t for t in range(t_) if mask[b, t]]
        next_adv = 0.0
        for i in reversed(range(len(idx))):
            t = idx[i]
            if term[b, t]:
                nv, chain = 0.0, False
            elif trunc[b, t] or i == len(idx) - 1:
                nv, chain = boot[b, t], False
            else:
                nv, chain = v[b, idx[i + 1]], True
            delta = r[b, t] + gamma * nv - v[b, t]
            adv[b, t] = delta + gamma * lam * (next_adv if chain else 0.0)
            next_adv = adv[b, t]
    return (adv + v) * mask, adv


def group_reference(r, g, valid, mode, eps):
    out = np.zeros_like(r)
    for i in range(len(r)):
        if not valid[i]:
            continue
        members = [j for j in range(len(r)) if g[j] == g[i] and valid[j]]
        x = r[members]
        if mode == "none":
            out[i] = r[i] - x.mean()
        else:
            std = x.std(ddof=0 if mode == "population" else (1 if len(x) > 1 else 0))
            out[i] = (r[i] - x.mean()) / (std + eps)
    return out


def loo_reference(r, g, valid):
    out = np.zeros_like(r)
    for i in range(len(r)):
        others = [r[j] for j in range(len(r)) if g[j] == g[i] and valid[j] and j != i]
        if valid[i] and others:
            out[i] = r[i] - np.mean(others)
    return out


# ----------------------------------------------------------------------------- GAE


def test_gae_hand_computed_termination_vs_truncation():
    # One row, 3 steps, reward 1 at the end, V = 0.5 everywhere, gamma = lambda = 1.
    # Terminated: returns are 1 at every step -> advantages 1 - 0.5 = 0.5.
    # Truncated with bootstrap 2: returns 1 + 2 = 3 -> advantages 2.5.
    r = jnp.array([[0.0, 0.0, 1.0]])
    v = jnp.full((1, 3), 0.5)
    last = jnp.array([[0.0, 0.0, 1.0]])
    ret, adv = A.compute_gae(r, v, last, 0 * last, jnp.array([2.0]), 1.0, 1.0)
    np.testing.assert_allclose(adv, [[0.5, 0.5, 0.5]], atol=1e-6)
    np.testing.assert_allclose(ret, [[1.0, 1.0, 1.0]], atol=1e-6)
    _, adv = A.compute_gae(r, v, 0 * last, last, jnp.array([2.0]), 1.0, 1.0)
    np.testing.assert_allclose(adv, [[2.5, 2.5, 2.5]], atol=1e-6)


def test_gae_skips_masked_steps_and_discounts():
    # Steps at t=0 and t=2 (t=1 is an observation token). gamma = 0.5, lambda = 1, V = 0.
    # Reward 4 at t=2 (terminal): A_2 = 4; A_0 = 0 + 0.5 * 0 - 0 + 0.5 * 4 = 2.
    r = jnp.array([[0.0, 100.0, 4.0]])  # the masked step's reward is ignored
    z = jnp.zeros((1, 3))
    term = jnp.array([[0.0, 0.0, 1.0]])
    _, adv = A.compute_gae(r, z, term, z, jnp.zeros(1), 0.5, 1.0, mask=jnp.array([[1.0, 0.0, 1.0]]))
    np.testing.assert_allclose(adv, [[2.0, 0.0, 4.0]], atol=1e-6)


@pytest.mark.parametrize("seed", [0, 1])
def test_gae_matches_numpy_reference(seed):
    rng = np.random.default_rng(seed)
    b, t = 5, 12
    r = rng.normal(size=(b, t))
    v = rng.normal(size=(b, t))
    mask = (rng.random((b, t)) < 0.7).astype(float)
    mask[0] = 0.0  # an empty row
    term = (rng.random((b, t)) < 0.15).astype(float)
    trunc = (rng.random((b, t)) < 0.15).astype(float)
    boot = rng.normal(size=(b, t))
    gamma, lam = 0.9, 0.8
    ret, adv = jax.jit(A.compute_gae, static_argnums=(5, 6))(
        r, v, term, trunc, boot, gamma, lam, mask
    )
    ref_ret, ref_adv = gae_reference(r, v, term, trunc, boot, mask, gamma, lam)
    np.testing.assert_allclose(np.asarray(adv) * mask, ref_adv * mask, atol=1e-5)
    np.testing.assert_allclose(ret, ref_ret, atol=1e-5)


# ----------------------------------------------------------------------------- groups


def test_group_normalized_hand_computed():
    r = jnp.array([1.0, 0.0, 1.0, 1.0])
    g = jnp.array([0, 0, 1, 1])
    # group 0: mean 0.5, population std 0.5 -> +-1; group 1: std 0 -> 0.
    np.testing.assert_allclose(
        A.group_normalized_advantages(r, g, "population", 1e-9), [1.0, -1.0, 0.0, 0.0], atol=1e-6
    )
    # sample std of {1, 0} is sqrt(0.5).
    np.testing.assert_allclose(
        A.group_normalized_advantages(r, g, "sample", 1e-9),
        [0.5 / 0.5**0.5, -0.5 / 0.5**0.5, 0.0, 0.0],
        atol=1e-5,
    )
    # Dr.GRPO: no std division.
    np.testing.assert_allclose(A.group_normalized_advantages(r, g, "none"), [0.5, -0.5, 0, 0])
    with pytest.raises(ValueError, match="std_mode"):
        A.group_normalized_advantages(r, g, "unbiased")


def test_leave_one_out_hand_computed():
    # A_0 = 1 - mean(0, 0) = 1; A_1 = 0 - mean(1, 0) = -0.5; singleton group -> 0.
    r = jnp.array([1.0, 0.0, 0.0, 7.0])
    g = jnp.array([3, 3, 3, 9])
    np.testing.assert_allclose(A.leave_one_out_advantages(r, g), [1.0, -0.5, -0.5, 0.0], atol=1e-6)
    # Identity: LOO = K / (K - 1) * (R - group mean).
    np.testing.assert_allclose(
        A.leave_one_out_advantages(r[:3], g[:3]),
        1.5 * A.group_normalized_advantages(r[:3], g[:3], "none"),
        atol=1e-6,
    )


@pytest.mark.parametrize("mode", ["population", "sample", "none"])
def test_group_estimators_match_numpy_with_ragged_groups(mode):
    rng = np.random.default_rng(3)
    r = rng.normal(size=20)
    g = rng.integers(0, 6, size=20)  # ragged group sizes, some singletons
    valid = (rng.random(20) < 0.8).astype(float)
    out = jax.jit(A.group_normalized_advantages, static_argnums=(2,))(r, g, mode, 1e-6, valid)
    np.testing.assert_allclose(out, group_reference(r, g, valid, mode, 1e-6), atol=1e-4, rtol=1e-5)
    loo = jax.jit(A.leave_one_out_advantages)(r, g, valid)
    np.testing.assert_allclose(loo, loo_reference(r, g, valid), atol=1e-5)


def test_drop_small_advantages_and_whiten():
    keep = A.drop_small_advantages(jnp.array([0.0, 0.005, -0.02, 0.01]), 0.01)
    np.testing.assert_array_equal(keep, [0, 0, 1, 1])
    x = jnp.array([[1.0, 2.0, 100.0], [3.0, 4.0, -100.0]])
    m = jnp.array([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    w = A.whiten(x, m)
    # masked values 1..4: mean 2.5, population std sqrt(1.25)
    np.testing.assert_allclose(
        w, (np.array([[1, 2, 2.5], [3, 4, 2.5]]) - 2.5) / 1.25**0.5 * m, atol=1e-5
    )


def test_sequence_rewards_to_tokens_and_broadcast():
    m = jnp.array([[0.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    np.testing.assert_allclose(
        A.sequence_rewards_to_tokens(jnp.array([3.0, 5.0]), m), [[0, 0, 3, 0], [0, 0, 0, 0]]
    )
    np.testing.assert_allclose(
        A.broadcast_sequence_advantages(jnp.array([2.0, 1.0]), m), [[0, 2, 2, 0], [0, 0, 0, 0]]
    )


# ----------------------------------------------------------------------------- jit and eager


class EstimatorVariantsTest(chex.TestCase):
    """Each estimator gives the numpy reference's values both traced (jit) and eagerly:
    static arguments (std mode, gamma, lambda) must stay Python values under jit."""

    def _batch(self):
        rng = np.random.default_rng(5)
        r = rng.normal(size=12).astype(np.float32)
        g = np.repeat(np.arange(4), 3).astype(np.int32)
        valid = np.ones(12, np.float32)
        valid[[2, 7]] = 0.0
        return r, g, valid

    @chex.variants(with_jit=True, without_jit=True)
    def test_group_estimators(self):
        r, g, valid = self._batch()
        norm = self.variant(A.group_normalized_advantages, static_argnums=(2,))
        chex.assert_trees_all_close(
            norm(r, g, "population", 1e-6, valid),
            group_reference(r, g, valid, "population", 1e-6).astype(np.float32),
            atol=1e-5,
        )
        loo = self.variant(A.leave_one_out_advantages)
        chex.assert_trees_all_close(
            loo(r, g, valid), loo_reference(r, g, valid).astype(np.float32), atol=1e-5
        )
        mean = self.variant(A.batch_mean_advantages)
        expect = (r - r[valid > 0].mean()) * valid
        chex.assert_trees_all_close(mean(r, valid), expect, atol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_gae(self):
        rng = np.random.default_rng(6)
        shape = (3, 7)
        r, v = (rng.normal(size=shape).astype(np.float32) for _ in range(2))
        term = np.zeros(shape, np.float32)
        trunc = np.zeros(shape, np.float32)
        term[0, -1], trunc[1, 3] = 1.0, 1.0
        boot = rng.normal(size=shape).astype(np.float32)
        mask = np.ones(shape, np.float32)
        mask[2, 5:] = 0.0
        gae = self.variant(A.compute_gae, static_argnums=(5, 6))
        ret, adv = gae(r, v, term, trunc, boot, 0.9, 0.8, mask=mask)
        ret_ref, adv_ref = gae_reference(r, v, term, trunc, boot, mask, 0.9, 0.8)
        chex.assert_trees_all_close((ret, adv * mask), (ret_ref, adv_ref * mask), atol=1e-5)
