"""``ModelConfig.scan_layers``: the blocks as one scanned, stacked module.

The scanned model must compute what the unrolled one computes from the same weights
(``stack_layers``): logits and values, cached prefill and greedy decode, gradients through
the trainer's learner pass; HF import / export must round-trip; the mesh must shard the
stacked kernels like the unrolled ones (layer axis whole); and the compile time of the
update step must not grow with depth.
"""

import functools
import math
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxagent.generate import Sampler, SamplingConfig
from jaxagent.models import (
    ModelConfig,
    apply_model,
    init_cache,
    init_model,
    load_hf,
    param_logical_axes,
    save_hf,
    stack_layers,
    unstack_layers,
)
from jaxagent.models.api import abstract_graphdef
from jaxagent.models import abstract_params

L = 3
EPS = float(jnp.finfo(jnp.float32).eps)


@functools.cache
def _pair(tie_embeddings: bool = False):
    """(unrolled graphdef, params), (scanned graphdef, the same weights stacked)."""
    config = ModelConfig.test(
        num_layers=L, qkv_bias=True, value_head=True, tie_embeddings=tie_embeddings
    )
    graphdef, params = init_model(config, jax.random.key(0))
    scanned = abstract_graphdef(config.replace(scan_layers=True))
    return (graphdef, params), (scanned, stack_layers(params, L))


def _tol(ref) -> float:
    """fp32 reassociation bound: the two programs may sum each contraction (width <= 96)
    in a different order, each of the L blocks and the head adding sqrt(K) eps relative
    error on the scale of the output."""
    scale = float(jnp.max(jnp.abs(ref))) + 1.0
    return 4 * (L + 1) * math.sqrt(96) * EPS * scale


def _batch(b=3, t=12, seed=0):
    rng = np.random.default_rng(seed)
    tokens = jnp.asarray(rng.integers(1, 128, (b, t)), jnp.int32)
    seg = np.ones((b, t), np.int32)
    seg[0, :3] = 0  # left padding
    seg[1, 7:] = 2  # two packed sequences
    pos = np.maximum(np.cumsum(seg > 0, axis=1) - 1, 0)
    pos[1, 7:] = np.arange(t - 7)
    return tokens, jnp.asarray(pos, jnp.int32), jnp.asarray(seg)


def test_params_are_stacked_with_an_unsharded_layer_axis():
    (graphdef, params), (scanned, stacked) = _pair()
    fresh = abstract_params(
        ModelConfig.test(num_layers=L, qkv_bias=True, value_head=True, scan_layers=True)
    )

    assert jax.tree.structure(fresh) == jax.tree.structure(stacked)
    assert not any(k.startswith("layer_") for k in fresh)
    assert fresh["blocks"]["attn"]["q_proj"].shape == (L, 64, 4, 16)
    axes = param_logical_axes(scanned, stacked)
    unrolled_axes = param_logical_axes(graphdef, params)
    is_axes = lambda x: isinstance(x, tuple)  # noqa: E731
    for path, ax in jax.tree_util.tree_leaves_with_path(axes["blocks"], is_leaf=is_axes):
        one = unrolled_axes["layer_0"]
        for k in path:
            one = one[k.key]
        assert ax == (None, *one), path
    # unstack is the inverse of stack
    back = unstack_layers(stacked)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.all(a == b)), back, params))


def test_layers_and_cache_mismatch_raise():
    (_, _), (scanned, stacked) = _pair()
    model = nnx.merge(scanned, stacked)
    with pytest.raises(ValueError, match="scan_layers"):
        model.layers()
    tokens, pos, seg = _batch()
    unrolled_cache = init_cache(ModelConfig.test(num_layers=L), 3, 16)
    with pytest.raises(ValueError, match="stacked KV cache"):
        model.hidden(tokens, pos, seg, unrolled_cache)


@pytest.mark.parametrize("length", [12, 600])  # 600 > blockwise.BLOCK: tiled attention
def test_logits_and_values_equal_the_unrolled_model(length):
    (graphdef, params), (scanned, stacked) = _pair()
    tokens, pos, seg = _batch(t=length)
    ref = apply_model(graphdef, params, tokens, pos, seg)
    out = apply_model(scanned, stacked, tokens, pos, seg)
    live = np.asarray(seg) > 0
    np.testing.assert_allclose(
        np.asarray(out.logits)[live], np.asarray(ref.logits)[live], atol=_tol(ref.logits)
    )
    np.testing.assert_allclose(
        np.asarray(out.values)[live], np.asarray(ref.values)[live], atol=_tol(ref.values)
    )


def test_cached_prefill_and_decode_equal_the_unrolled_model():
    (graphdef, params), (scanned, stacked) = _pair()
    cfg = ModelConfig.test(num_layers=L)
    tokens, pos, seg = _batch()
    ref = apply_model(graphdef, params, tokens, pos, seg, init_cache(cfg, 3, 32))
    scfg = cfg.replace(scan_layers=True)
    out = apply_model(scanned, stacked, tokens, pos, seg, init_cache(scfg, 3, 32))
    assert out.cache.keys.shape == (L, 3, 2, 16, 32) and out.cache.capacity == 32
    live = np.asarray(seg) > 0
    tol = _tol(ref.logits)
    np.testing.assert_allclose(np.asarray(out.logits)[live], np.asarray(ref.logits)[live], atol=tol)
    np.testing.assert_allclose(np.asarray(out.cache.keys), np.stack(ref.cache.keys), atol=tol)
    np.testing.assert_allclose(np.asarray(out.cache.values), np.stack(ref.cache.values), atol=tol)
    np.testing.assert_array_equal(out.cache.lengths, ref.cache.lengths)


@pytest.mark.parametrize(
    "layout", ["row_major", pytest.param("output_major", marks=pytest.mark.slow)]
)
def test_greedy_sampling_gives_the_same_tokens(layout):
    """Two turns (the second grows the cache past its first capacity): same tokens, and
    log-probs within the logits' tolerance."""
    (graphdef, params), (scanned, stacked) = _pair()
    prompts = [[1, 5, 9, 3, 7], [2, 7], [4, 4, 4]]
    outs = []
    for g, p in ((graphdef, params), (scanned, stacked)):
        sampler = Sampler(g, decode_layout=layout)
        a = sampler(p, prompts, SamplingConfig(max_new_tokens=10, greedy=True), jax.random.key(0))
        cap = a.cache.capacity
        obs = [[6, 8], [9], [10, 11, 12]]
        b = sampler(
            p, obs, SamplingConfig(max_new_tokens=80, greedy=True), jax.random.key(0), a.cache
        )
        assert b.cache.capacity > cap
        outs.append(jax.device_get((a.tokens, b.tokens, a.logprobs, b.logprobs)))
    (t1, u1, l1, k1), (t2, u2, l2, k2) = outs
    np.testing.assert_array_equal(t2, t1)
    np.testing.assert_array_equal(u2, u1)
    np.testing.assert_allclose(l2, l1, atol=1e-5)
    np.testing.assert_allclose(k2, k1, atol=1e-5)


@pytest.mark.parametrize("remat", [pytest.param(False, marks=pytest.mark.slow), True])
def test_gradients_equal_through_the_learner_pass(remat):
    """The trainer's ``model_logprob_fn`` (remat: ``checkpoint_in_backward`` wraps the scanned
    block) gives the unrolled model's gradients, stacked."""
    from jaxagent.rl.model_fns import model_logprob_fn

    (graphdef, params), (scanned, stacked) = _pair()
    tokens, pos, seg = _batch()
    mask = (seg > 0).astype(jnp.float32)

    def loss(fn, p):
        logp, ent, values = fn(p, tokens, pos, seg, mask)
        return jnp.sum(logp * mask) + 0.1 * jnp.sum(ent * mask) + jnp.sum(values * mask)

    ref = jax.grad(lambda p: loss(model_logprob_fn(graphdef, remat=remat), p))(params)
    got = jax.grad(lambda p: loss(model_logprob_fn(scanned, remat=remat), p))(stacked)
    ref = stack_layers(ref, L)
    for path, g in jax.tree_util.tree_leaves_with_path(got):
        r = ref
        for k in path:
            r = r[k.key]
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=_tol(r), err_msg=str(path))


def test_hf_round_trip(tmp_path):
    (graphdef, params), (scanned, stacked) = _pair(tie_embeddings=False)
    config = ModelConfig.test(num_layers=L, qkv_bias=True, value_head=True, scan_layers=True)
    save_hf(str(tmp_path / "s"), config, scanned, stacked, max_shard_size="40KB")
    # what the scanned model exported loads unrolled as the original weights, exactly
    _, _, unrolled = load_hf(str(tmp_path / "s"))
    flat = jax.tree.map(np.asarray, unrolled)
    jax.tree.map(np.testing.assert_array_equal, flat, jax.tree.map(np.asarray, params))
    # and loads back stacked, exactly
    cfg2, g2, again = load_hf(str(tmp_path / "s"), scan_layers=True)
    assert cfg2.scan_layers and "blocks" in again
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, again), stacked)
    # the unrolled model's export is the same files' contents
    unrolled_cfg = config.replace(scan_layers=False)
    save_hf(str(tmp_path / "u"), unrolled_cfg, graphdef, params)
    _, _, from_unrolled = load_hf(str(tmp_path / "u"), scan_layers=True)
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, from_unrolled), stacked)


def test_sharded_scanned_sampler_matches_one_device():
    """Stacked kernels placed by the mesh rules (layer axis whole, the rest as unrolled) and
    the stacked cache split over rows: the unsharded unrolled model's tokens."""
    from jaxagent.parallel.layout import DeviceLayout
    from jaxagent.parallel.mesh import make_mesh

    (graphdef, params), (scanned, stacked) = _pair()
    mesh = make_mesh(data=4, fsdp=2)
    sharded = DeviceLayout(mesh, param_logical_axes(scanned, stacked)).params(stacked)
    spec = sharded["blocks"]["mlp"]["up_proj"].sharding.spec
    assert spec[0] is None and "fsdp" in str(spec), spec
    cfg = SamplingConfig.create(max_new_tokens=8, temperature=1.0)
    prompts = [[int(i) % 120 + 4 for i in range(n, 3 * n)] for n in range(1, 9)]
    outs = []
    for g, p in ((graphdef, params), (scanned, sharded)):
        out = Sampler(g)(p, prompts, cfg, jax.random.key(1))
        outs.append(jax.device_get((out.tokens, out.logprobs)))
    assert out.cache.keys.sharding.spec[1] == ("data", "fsdp")
    np.testing.assert_array_equal(outs[1][0], outs[0][0])
    np.testing.assert_allclose(outs[1][1], outs[0][1], atol=1e-5)


def test_scan_layers_composes_with_lora_and_the_fused_optimiser():
    from jaxagent.train.config import load_config

    assert load_config(None, ["model.scan_layers=true", "rl.lora.rank=0"]).model.scan_layers
    # LoRA works over the stacked blocks (tests/test_lora_scan.py), and so does the fused
    # optimiser (tests/test_fused_step.py)
    assert load_config(None, ["model.scan_layers=true", "rl.lora.rank=8"]).model.scan_layers
    fused = ["model.scan_layers=true", "rl.lora.rank=0", "rl.update.fused_optimizer=true"]
    assert load_config(None, fused).rl_config.update.fused_optimizer


@pytest.mark.slow  # ~25 s: four compiles of an update step
def test_update_compile_time_does_not_grow_with_depth(monkeypatch):
    """benchmarks/compile_depth.py's measurement at width 64: the 28-layer scanned update step
    compiles in at most twice the 4-layer one's time (unrolled it is 2.6x here)."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    sys.modules.pop("compile_depth", None)
    from compile_depth import depth_config, update_compile_seconds

    shallow = update_compile_seconds(depth_config(4, 64, scan_layers=True))["total_s"]
    deep = update_compile_seconds(depth_config(28, 64, scan_layers=True))["total_s"]
    assert deep <= 2 * shallow, (deep, shallow)


@pytest.mark.slow  # ~30 s: SFT, rollouts, two PPO updates with block remat, checkpoints
def test_trainer_runs_with_scanned_blocks(tmp_path):
    from test_train import ROOT, TINY

    from jaxagent.train.config import load_config
    from jaxagent.train.metrics_log import read_jsonl
    from jaxagent.train.trainer import Trainer

    skip = ("model.num_layers", "rl.update.remat", "train.iterations")
    overrides = [o for o in TINY if not o.startswith(skip)] + [
        "model.num_layers=2",
        "model.scan_layers=true",
        "rl.lora.rank=0",
        "rl.update.remat=true",
        "train.iterations=2",
        f"train.out_dir={tmp_path}",
    ]
    Trainer(load_config(ROOT / "configs/quickstart.yaml", overrides), echo=lambda s: None).run()
    updates = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "loss/total" in r]
    assert len(updates) == 2
    assert all(math.isfinite(r["loss/total"]) and r["optim/grad_norm"] > 0 for r in updates)
