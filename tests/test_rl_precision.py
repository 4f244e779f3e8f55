"""The dtypes a bfloat16 run trains in: float32 Adam moments (``optim.moments_dtype``), float32
LoRA adapters merged in float32 (``lora.dtype``), a LoRA base that stays bit-identical, and a
critic's value head trained beside the adapters."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest

from jaxagent.models import ModelConfig, init_model
from jaxagent.rl.config import RLConfigError
from jaxagent.rl.lora import init_lora, merge_lora
from jaxagent.rl.model_fns import model_apply_fn, model_logprob_fn
from jaxagent.rl.recipes import get_recipe
from jaxagent.rl.train_state import TrainState, begin_sampling, end_sampling, make_optimizer
from jaxagent.rl.update import make_update_step

from test_rl_common import on_policy_batch

BF16 = jnp.bfloat16


def _adam_after(moments: str, dtype, steps: int):
    """AdamW's update at step ``steps`` of a constant gradient, params of ``dtype``."""
    cfg = get_recipe(
        "loop", optim={"learning_rate": 1e-3, "moments_dtype": moments, "max_grad_norm": 0.0}
    )
    tx = make_optimizer(cfg)
    p = jnp.ones((64,), dtype)
    # bfloat16 gradient values, so every run sees the same numbers
    g = (jnp.linspace(0.5, 2.0, 64) * 1e-2).astype(BF16).astype(dtype)

    @jax.jit
    def run(p, g):
        body = lambda s, _: (tx.update(g, s, p)[1], None)  # noqa: E731
        s, _ = jax.lax.scan(body, tx.init(p), None, length=steps - 1)
        return tx.update(g, s, p)

    return run(p, g)


def test_float32_moments_keep_adam_exact_over_bfloat16_params():
    # In bfloat16, b2 = 0.999 rounds to 1.0 and nu's (1 - b2) g^2 increments round away once
    # nu is ~2^9 of them: nu stops tracking g^2 and the step size drifts. Float32 moments
    # compute exactly what a float32 AdamW computes on the same (bfloat16-valued) gradients;
    # only the final cast of the update to bfloat16 rounds.
    steps = 1500
    u32, s32 = _adam_after("float32", BF16, steps)
    u16, s16 = _adam_after("param", BF16, steps)
    ref, _ = _adam_after("param", jnp.float32, steps)
    moments = lambda s: {x.dtype for x in jax.tree.leaves(s) if x.ndim}  # noqa: E731
    assert moments(s32) == {jnp.dtype(jnp.float32)} and moments(s16) == {jnp.dtype(BF16)}
    assert u32.dtype == BF16  # the update comes back in the parameters' dtype
    ref16 = np.asarray(ref.astype(BF16)).astype(np.float32)
    # the same float32 arithmetic, rounded once to bfloat16: at most one ulp apart (a
    # differently fused program may flip a rounding tie), exact here
    ulp = np.spacing(np.abs(ref16).astype(ml_dtypes.bfloat16)).astype(np.float32)
    assert np.all(np.abs(np.asarray(u32).astype(np.float32) - ref16) <= ulp)
    # bfloat16 moments: measured 18% to 68% off after 1500 steps
    rel = np.abs(np.asarray(u16).astype(np.float32) / ref16 - 1)
    assert rel.min() > 0.1, rel


def test_float32_moments_keep_the_optimiser_state_layout():
    # The mesh's shardings (optax.tree_map_params) and the fused step's block slicing find
    # Adam's parameter-shaped trees as without the wrapper; the fused step accepts it.
    from jaxagent.rl.fused_step import check_elementwise

    params = {"layer_0": {"w": jnp.ones((4, 8), BF16)}, "embed": jnp.ones((16, 4), BF16)}
    cfg = get_recipe("loop", lora={"rank": 0}, optim={"moments_dtype": "float32"})
    tx = make_optimizer(cfg)
    plain = make_optimizer(cfg.override(optim={"moments_dtype": "param"}))
    state = tx.init(params)
    assert jax.tree.structure(state) == jax.tree.structure(plain.init(params))
    specs = optax.tree_map_params(
        tx, lambda _, x: "param", state, params, transform_non_params=lambda _: None
    )
    assert jax.tree.leaves(specs) == ["param"] * 4  # mu and nu of both leaves
    check_elementwise(tx)


def test_moments_dtype_is_validated():
    with pytest.raises(RLConfigError, match="optim.moments_dtype='fp16'"):
        get_recipe("loop", optim={"moments_dtype": "fp16"})
    with pytest.raises(RLConfigError, match="lora.dtype='half'"):
        get_recipe("loop", lora={"dtype": "half"})


def test_lora_merge_rounds_once_in_float32():
    # bfloat16 kernels, float32 adapters: merged = bf16(W + delta) with W + delta formed in
    # float32 (exact to 2^-24 relative), so each merged entry is within half a bfloat16 ulp
    # (plus float32 slack) of the exact sum; rounding delta to bfloat16 first would not be.
    k = jax.random.split(jax.random.key(0), 3)
    w = (0.05 * jax.random.normal(k[0], (64, 96))).astype(BF16)
    adapters = init_lora({"up_proj": w}, 8, ("up_proj",), k[1])
    ad = adapters["up_proj"]
    assert ad["a"].dtype == jnp.float32 and ad["b"].dtype == jnp.float32
    ad["b"] = 0.01 * jax.random.normal(k[2], ad["b"].shape)
    merged = np.asarray(merge_lora({"up_proj": w}, adapters, 16.0, 8)["up_proj"])
    assert merged.dtype == ml_dtypes.bfloat16
    a, b = (np.asarray(ad[n], np.float64) for n in ("a", "b"))
    exact = np.asarray(w).astype(np.float64) + 2.0 * a @ b
    half_ulp = 0.5 * np.spacing(np.abs(exact).astype(ml_dtypes.bfloat16)).astype(np.float64)
    err = np.abs(merged.astype(np.float64) - exact)
    assert np.all(err <= half_ulp * (1 + 1e-3) + 1e-6 * np.abs(exact)), (err / half_ulp).max()
    # the delta rounded to bfloat16 before the sum (the old merge): some entries land a
    # whole ulp away
    twice = np.asarray(w).astype(np.float32) + (2.0 * a @ b).astype(ml_dtypes.bfloat16)
    err2 = np.abs(twice.astype(ml_dtypes.bfloat16).astype(np.float64) - exact)
    assert np.any(err2 > half_ulp * 1.01)


@pytest.fixture(scope="module")
def bf16_model():
    cfg = ModelConfig.test(num_layers=1, param_dtype="bfloat16", value_head=True)
    graphdef, params = init_model(cfg, jax.random.key(0))
    batch = on_policy_batch(model_apply_fn(graphdef), params, batch_size=8, with_values=True)
    return graphdef, params, batch


def _host(tree):
    return jax.tree.map(lambda x: np.asarray(jnp.copy(x)), tree)


def _lora_run(bf16_model, rl, iterations=3):
    """``iterations`` of (sampling copy, update) as the trainer runs them: (start base,
    start adapters, final state, the last sampling copy's leaves)."""
    graphdef, params, batch = bf16_model
    params = jax.tree.map(jnp.copy, params)  # the state owns (and donates) its buffers
    state = TrainState.create(params, rl, jax.random.key(1))
    base0, adapters0 = _host(state.frozen_params), _host(state.params)
    update = make_update_step(rl, logprob_fn=model_logprob_fn(graphdef))
    for _ in range(iterations):
        merged, state = begin_sampling(state)
        seen = _host(merged)
        state, merged = end_sampling(state, merged), None
        state, _ = update(state, batch)
    return base0, adapters0, state, seen


def _changed(a, b) -> float:
    """Fraction of entries that differ."""
    a, b = jax.tree.leaves(a), jax.tree.leaves(b)
    return sum(int(np.sum(np.asarray(x) != np.asarray(y))) for x, y in zip(a, b)) / sum(
        x.size for x in a
    )


def test_lora_base_stays_bit_identical_and_float32_adapters_train(bf16_model):
    rl = get_recipe(
        "loop",
        lora={"rank": 4, "alpha": 8.0},
        optim={"learning_rate": 1e-4},
        update={"minibatch_size": 4},
        advantage={"drop_below": 0.0},
    )
    base0, adapters0, state, seen = _lora_run(bf16_model, rl)
    # The sampling copy never touched the base (merging into the base's own buffers and
    # subtracting after rounds twice per round trip: 16.6% of bfloat16 entries had drifted
    # after 200 round trips).
    for a, b in zip(jax.tree.leaves(base0), jax.tree.leaves(state.frozen_params)):
        assert np.array_equal(a, np.asarray(b))
    # the copy sampled from was base + adapters of that iteration (merge_lora itself)
    assert _changed(seen, base0) > 0
    # Adam's second step moves a (the first moves b only: a's gradient is 0 while b = 0) by
    # about lr = 1e-4, under half a bfloat16 ulp for |a| > 2^-6: float32 adapters keep it.
    a_moved = _changed(
        [v["a"] for v in adapters0.values()], [v["a"] for v in _host(state.params).values()]
    )
    assert a_moved > 0.9, a_moved
    assert all(v["a"].dtype == jnp.float32 for v in state.params.values())


def test_bfloat16_adapters_round_small_updates_away(bf16_model):
    # The same run with the adapters in the base's dtype: most of a's updates vanish.
    rl = get_recipe(
        "loop",
        lora={"rank": 4, "alpha": 8.0, "dtype": "param"},
        optim={"learning_rate": 1e-4},
        update={"minibatch_size": 4},
        advantage={"drop_below": 0.0},
    )
    _, adapters0, state, _ = _lora_run(bf16_model, rl)
    assert all(v["a"].dtype == BF16 for v in state.params.values())
    a_moved = _changed(
        [v["a"] for v in adapters0.values()], [v["a"] for v in _host(state.params).values()]
    )
    assert a_moved < 0.5, a_moved


def test_ppo_under_lora_trains_the_value_head_and_not_the_base(bf16_model, tmp_path):
    from jaxagent.train.checkpoint import Checkpointer

    rl = get_recipe(
        "ppo",
        lora={"rank": 4, "alpha": 8.0},
        kl={"mode": "none"},
        optim={"learning_rate": 1e-2},
        update={"minibatch_size": 4},
        critic={"value_coef": 1.0, "value_clip_eps": 0.0},
    )
    base0, adapters0, state, seen = _lora_run(bf16_model, rl)
    for a, b in zip(jax.tree.leaves(base0), jax.tree.leaves(state.frozen_params)):
        assert np.array_equal(a, np.asarray(b))
    for name in ("value_kernel", "value_bias"):
        before, after = adapters0[name]["full"], np.asarray(state.params[name]["full"])
        assert after.dtype == np.float32 and np.abs(after - before).max() > 1e-3, name
    # sampling and the critic's values run with the trained head, cast to the base's dtype
    merged, state = begin_sampling(state)
    trained = state.params["value_kernel"]["full"].astype(BF16)
    np.testing.assert_array_equal(np.asarray(merged["value_kernel"]), np.asarray(trained))
    state, merged = end_sampling(state, merged), None
    # saved and restored with the state
    ckpt = Checkpointer(tmp_path / "ckpt")
    ckpt.save(1, state, {"note": "lora+critic"})
    ckpt.wait()
    like = jax.tree.map(jnp.zeros_like, state)
    restored, _ = ckpt.restore(1, like)
    ckpt.close()
    assert _changed(_host(restored.params), _host(state.params)) == 0.0


def test_critic_under_lora_needs_a_value_head():
    _, params = init_model(ModelConfig.test(num_layers=1), jax.random.key(0))
    rl = get_recipe("ppo", lora={"rank": 4}, kl={"mode": "none"})
    with pytest.raises(RLConfigError, match="critic.enabled=true with lora.rank=4"):
        TrainState.create(params, rl, jax.random.key(1))
