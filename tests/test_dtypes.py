"""Dtypes are honoured for fresh and loaded models: param dtype, compute dtype, KV-cache dtype.

bf16 compute with fp32 master weights (``param_dtype=float32, dtype=bfloat16``) keeps the
parameters and the Adam state in float32 and runs every matmul in bfloat16.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.generate import Sampler, SamplingConfig
from jaxagent.models import (
    ModelConfig,
    abstract_graphdef,
    apply_model,
    init_cache,
    init_model,
    save_hf,
)
from jaxagent.rl.recipes import get_recipe
from jaxagent.rl.train_state import TrainState
from jaxagent.rl.update import make_update_step
from jaxagent.rl.model_fns import model_apply_fn
from jaxagent.types import TokenBatch

EPS_BF16 = float(jnp.finfo(jnp.bfloat16).eps)  # 2^-7 (8 significant bits with the hidden one)


@pytest.fixture(scope="module")
def fp32_model():
    """One fp32 model for every test: dtypes only change the graphdef (abstract_graphdef of
    a config with other dtypes runs the same parameters), so no test builds a second one."""
    cfg = ModelConfig.test()
    graphdef, params = init_model(cfg, jax.random.key(0))
    return cfg, graphdef, params


def test_bf16_logits_within_bf16_tolerance_of_fp32(fp32_model):
    cfg32, graphdef32, params = fp32_model
    graphdef16 = abstract_graphdef(cfg32.replace(dtype="bfloat16"))
    tokens = jax.random.randint(jax.random.key(1), (4, 24), 0, cfg32.vocab_size)
    pos = jnp.broadcast_to(jnp.arange(24), (4, 24))
    seg = jnp.ones((4, 24), jnp.int32)
    l32 = apply_model(graphdef32, params, tokens, pos, seg).logits
    l16 = apply_model(graphdef16, params, tokens, pos, seg).logits
    assert l16.dtype == jnp.float32  # the head accumulates in float32 whatever the compute
    err = float(jnp.max(jnp.abs(l16 - l32)))
    scale = float(jnp.max(jnp.abs(l32)))
    # bf16 rounds every activation to 2^-8 relative (half an ulp); the chain embedding ->
    # 2 blocks (norm, qkv, attention, o, norm, gate/up, down: ~8 roundings each) -> head has
    # ~20 roundings, so the logits may move by ~20 * 2^-8 of their scale; 20 * EPS_BF16
    # (= 2x that) is the bound. It must also be an actual bf16 computation (err > fp32 noise).
    assert err <= 20 * EPS_BF16 * scale, (err, scale)
    assert err > 1e-4 * scale


def test_kv_cache_dtype_halves_cache_memory(fp32_model):
    cfg, _, params = fp32_model
    full = init_cache(cfg, 8, 128)
    half = init_cache(cfg.replace(kv_cache_dtype="bfloat16"), 8, 128)
    nbytes = lambda c: sum(x.nbytes for x in (*c.keys, *c.values))
    assert nbytes(half) * 2 == nbytes(full)
    # The sampler follows the model's kv_cache_dtype (fp32 weights, bf16 cache).
    graphdef = abstract_graphdef(cfg.replace(kv_cache_dtype="bfloat16"))
    sampling = SamplingConfig.create(max_new_tokens=4, temperature=1.0)
    out = Sampler(graphdef)(params, [[1, 2, 3]] * 2, sampling, jax.random.key(0))
    assert out.cache.keys[0].dtype == jnp.bfloat16
    assert jax.tree.leaves(params)[0].dtype == jnp.float32


def test_loaded_model_honours_dtypes_and_value_head(tmp_path, fp32_model):
    from jaxagent.train.model_section import ModelSection
    from jaxagent.train.policy import build_model

    cfg, graphdef, params = fp32_model
    save_hf(str(tmp_path), cfg, graphdef, params)
    tok = type("Tok", (), {"__len__": lambda self: cfg.vocab_size})()
    section = ModelSection(
        init_from=str(tmp_path),
        param_dtype="bfloat16",
        dtype="bfloat16",
        kv_cache_dtype="bfloat16",
        value_head=True,
    )
    _, loaded, mc = build_model(section, tok, jax.random.key(1))
    assert (mc.param_dtype, mc.dtype, mc.kv_cache_dtype) == ("bfloat16",) * 3
    assert {x.dtype for x in jax.tree.leaves(loaded)} == {jnp.dtype(jnp.bfloat16)}
    # A fresh value head (not in the checkpoint): zero bias, small random kernel.
    assert float(loaded["value_bias"]) == 0.0 and float(jnp.abs(loaded["value_kernel"]).max()) > 0
    np.testing.assert_array_equal(
        np.asarray(loaded["embed"], np.float32),
        np.asarray(params["embed"].astype(jnp.bfloat16), np.float32),
    )


@pytest.mark.slow  # 24 sample + update iterations
def test_bf16_compute_fp32_master_weights_learns():
    """bf16 compute, fp32 parameters and Adam state: the rule reward (share of completion
    tokens equal to a target) rises from ~1/vocab, as in test_rl_learning's fp32 runs."""
    vocab, target, prompt_len, new, tasks, k = 32, 5, 4, 8, 4, 8
    cfg = ModelConfig.test(vocab_size=vocab, num_layers=1, dtype="bfloat16")
    graphdef, params = init_model(cfg, jax.random.key(0))
    config = get_recipe(
        "loop",
        update={"minibatch_size": tasks * k},
        optim={"learning_rate": 2e-3},
        lora={"rank": 0},
    )
    state = TrainState.create(params, config, jax.random.key(1))
    update = make_update_step(config, model_apply_fn(graphdef))
    sampler, sampling = Sampler(graphdef), SamplingConfig(max_new_tokens=new)
    prompts = jnp.repeat(jax.random.randint(jax.random.key(2), (tasks, prompt_len), 0, vocab), k, 0)
    groups = jnp.repeat(jnp.arange(tasks), k)
    key, rewards = jax.random.key(3), []
    for _ in range(24):
        key, sk = jax.random.split(key)
        out = sampler(state.model_params(), np.asarray(prompts).tolist(), sampling, sk)
        gen = jnp.arange(new)[None, :] < out.lengths[:, None]
        reward = jnp.sum((out.tokens == target) * gen, axis=1) / new
        batch = TokenBatch.from_completions(
            prompts, out.tokens, out.logprobs, out.lengths, reward, groups
        )
        rewards.append(float(reward.mean()))
        state, m = update(state, batch)
        assert np.isfinite(float(m["loss/total"]))
    leaves = jax.tree.leaves((state.params, state.opt_state))
    assert {x.dtype for x in leaves if jnp.issubdtype(x.dtype, jnp.floating)} == {
        jnp.dtype(jnp.float32)
    }
    start, end = np.mean(rewards[:3]), np.mean(rewards[-5:])
    assert start < 0.15 and end > start + 0.3, rewards


@pytest.mark.parametrize("bad", ["float64", "int8"])
def test_bad_kv_cache_dtype_names_the_field(bad):
    from jaxagent.train.model_section import ModelSection
    from jaxagent.errors import ConfigError

    with pytest.raises(ConfigError, match="model.kv_cache_dtype"):
        ModelSection(kv_cache_dtype=bad)
