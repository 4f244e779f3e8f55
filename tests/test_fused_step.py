"""The optimiser fused into the backward pass (jaxagent.rl.fused_step): the same step as the
plain update, with the gradient tree never in memory."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxagent.models import ModelConfig, abstract_graphdef, init_model
from jaxagent.rl import get_recipe
from jaxagent.rl.config import RLConfigError
from jaxagent.rl.model_fns import model_logprob_fn
from jaxagent.rl.train_state import TrainState, clip_by_global_norm_scaled, make_optimizer
from jaxagent.rl.update import make_update_step
from jaxagent.rl.model_fns import model_apply_fn
from test_rl_common import (
    assert_trees_close_f32,
    copy_tree,
    on_policy_batch,
    single_and_sharded_update,
)

LR = 1e-3


def _cfg(fused=False, **kw):
    update = dict(minibatch_size=8, num_epochs=2, fused_optimizer=fused)
    return get_recipe("loop", lora={"rank": 0}, update=update, **kw)


# unrolled blocks (layer_0, layer_1) and stacked ones (model.scan_layers: the scan over the
# blocks is one custom VJP whose backward loop steps each layer's slice, fused_step.ScanHook)
SCAN = pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scan"])
# the same, the scanned case left to the nightly run (its compiles are the slow part)
SCAN_SLOW = pytest.mark.parametrize(
    "scan", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["unrolled", "scan"]
)


def _blocks(params):
    """The block parameters' leaves (stacked under "blocks" with scan_layers)."""
    return [
        x
        for k, v in params.items()
        if k.startswith("layer_") or k == "blocks"
        for x in jax.tree.leaves(v)
    ]


def _setup(scan=False):
    cfg = ModelConfig.test(num_layers=2, scan_layers=scan)
    graphdef, params = init_model(cfg, jax.random.key(0))
    batch = on_policy_batch(model_apply_fn(graphdef), params, batch_size=16, seq_len=12)
    return graphdef, params, batch


def _run(tx, graphdef, params, batch, fused, **kw):
    cfg = _cfg(fused, **kw)
    state = TrainState.create(copy_tree(params), cfg, jax.random.key(1), optimizer=tx)
    update = make_update_step(cfg, optimizer=tx, logprob_fn=model_logprob_fn(graphdef))
    return update(state, batch)


# 2 epochs x 2 minibatches = 4 optimiser steps, global-norm clipping active (norm ~1.5 > 0.05)
@SCAN
def test_fused_step_matches_plain_step_sgd(scan):
    """SGD keeps the step linear in the gradient, so the parameters after 4 clipped steps
    agree at the float32 reassociation bound of a gradient summed over the minibatch's
    8 x 12 token terms (the fused program sums them in another order)."""
    graphdef, params, batch = _setup(scan)
    tx = optax.chain(clip_by_global_norm_scaled(0.05), optax.sgd(0.1))
    plain, m0 = _run(tx, graphdef, params, batch, fused=False)
    fused, m1 = _run(tx, graphdef, params, batch, fused=True)
    assert float(m0["optim/grad_norm"]) > 0.05  # the clip is active
    assert_trees_close_f32(plain.params, fused.params, n_terms=4 * 96)
    moved = max(
        float(jnp.max(jnp.abs(a - b))) for a, b in zip(_blocks(plain.params), _blocks(params))
    )
    assert moved > 1e-4  # the comparison is not between two untouched models (blocks too)
    for k in ("loss/total", "optim/grad_norm", "guard/nonfinite", "kl/approx_old_new"):
        np.testing.assert_allclose(float(m1[k]), float(m0[k]), rtol=1e-5, atol=1e-7, err_msg=k)


@SCAN
def test_fused_step_matches_plain_step_adamw(scan):
    """make_optimizer's AdamW + clip: the moments (linear in the gradients) agree at the
    reassociation bound; a parameter may differ by Adam's sign of a near-zero gradient
    entry (at most 2 x lr a step), nearly all agree to 1e-6."""
    graphdef, params, batch = _setup(scan)
    tx = make_optimizer(_cfg(optim={"learning_rate": LR, "max_grad_norm": 0.5}))
    plain, m0 = _run(tx, graphdef, params, batch, False, optim={"learning_rate": LR})
    fused, m1 = _run(tx, graphdef, params, batch, True, optim={"learning_rate": LR})
    assert_trees_close_f32(plain.opt_state, fused.opt_state, n_terms=4 * 96)
    diffs = np.concatenate(
        [
            np.abs(np.ravel(a - b))
            for a, b in zip(*map(jax.tree.leaves, (plain.params, fused.params)))
        ]
    )
    assert diffs.max() <= 4 * 2 * LR
    assert np.mean(diffs < 1e-6) > 0.999
    np.testing.assert_allclose(
        float(m1["optim/grad_norm"]), float(m0["optim/grad_norm"]), rtol=1e-5
    )


@SCAN
def test_fused_step_skips_a_nonfinite_step(scan):
    """The guard decides between the passes: a NaN loss leaves params and moments as they
    were and is counted, as in the plain step."""
    graphdef, params, batch = _setup(scan)
    batch = batch.replace(rewards=jnp.full_like(batch.rewards, jnp.nan))
    tx = make_optimizer(_cfg())
    state, m = _run(tx, graphdef, params, batch, fused=True)
    assert float(m["guard/nonfinite"]) == 1.0
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert all(float(jnp.max(jnp.abs(x))) == 0 for x in jax.tree.leaves(state.opt_state) if x.ndim)


@SCAN_SLOW
def test_fused_step_holds_no_gradient_tree(scan):
    """XLA's own accounting of the compiled step: the fused step's temporaries are smaller
    than the plain step's by more than half the blocks' gradient bytes (the plain step keeps
    them all; the fused one a block's at a time). Measured: 33.7 vs 14.4 MB, blocks 30.7 MB."""
    # Gradients must dominate the temporaries for the difference to show (at 4 x 256 with
    # 64-token rows the activations do, and the fused step's two passes cost more).
    # Scanned: the backward loop holds one layer's gradient slice, but the scan's saved
    # inputs and the stacked update cost more than the unrolled step, so the margin is a
    # quarter (measured on CPU: plain 41.8 MB, fused 24.7 MB).
    cfg_model = ModelConfig.test(
        num_layers=6,
        hidden_size=384,
        intermediate_size=1024,
        num_heads=4,
        num_kv_heads=4,
        scan_layers=scan,
    )
    graphdef = abstract_graphdef(cfg_model)
    params = jax.eval_shape(lambda k: init_model(cfg_model, k)[1], jax.random.key(0))
    blocks = sum(x.size * 4 for x in _blocks(params))
    b, t = 8, 16
    i32 = lambda: jax.ShapeDtypeStruct((b, t), jnp.int32)
    f32 = lambda: jax.ShapeDtypeStruct((b, t), jnp.float32)
    from jaxagent.types import TokenBatch

    batch = TokenBatch(
        tokens=i32(),
        positions=i32(),
        segment_ids=i32(),
        loss_mask=f32(),
        old_logprobs=f32(),
        advantages=f32(),
        rewards=jax.ShapeDtypeStruct((b,), jnp.float32),
        group_ids=jax.ShapeDtypeStruct((b,), jnp.int32),
        turn_ids=i32(),
    )
    temps = {}
    for fused in (False, True):
        cfg = _cfg(fused)
        tx = make_optimizer(cfg)
        state = jax.eval_shape(
            lambda p: TrainState.create(p, cfg, jax.random.key(0), optimizer=tx), params
        )
        step = make_update_step(cfg, optimizer=tx, logprob_fn=model_logprob_fn(graphdef))
        temps[fused] = step.lower(state, batch).compile().memory_analysis().temp_size_in_bytes
    assert temps[True] < temps[False] - (0.25 if scan else 0.5) * blocks, (temps, blocks)


def test_fused_step_refuses_what_it_cannot_do_exactly():
    graphdef, params, _ = _setup()
    with pytest.raises(RLConfigError, match="fused_optimizer.*microbatch_size"):
        get_recipe(
            "loop", update={"minibatch_size": 8, "microbatch_size": 4, "fused_optimizer": True}
        )
    with pytest.raises(RLConfigError, match="fused_optimizer=true with lora.rank=16"):
        get_recipe("loop", lora={"rank": 16}, update={"fused_optimizer": True})
    cfg = _cfg(True)
    fn = model_logprob_fn(graphdef)
    # optax's own clip computes the norm of whatever it is given: a block's, in the fused step
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1))
    with pytest.raises(ValueError, match="depends on the others"):
        make_update_step(cfg, optimizer=tx, logprob_fn=fn)
    with pytest.raises(ValueError, match="model's own log-prob function"):
        make_update_step(cfg, optimizer=make_optimizer(cfg), apply_fn=model_apply_fn(graphdef))


@SCAN_SLOW
def test_fused_step_sharded_equals_single_device(scan):
    """The fused step on 8 simulated devices (data=4 x fsdp=2: the blocks' weights and
    moments split over fsdp inside each block's backward) gives the single-device step's
    moments and metrics, at the bound of tests/test_parallel.py's sharded-update test."""
    graphdef, params, batch = _setup(scan)
    cfg = _cfg(True)
    tx = make_optimizer(cfg)
    fn = model_logprob_fn(graphdef)
    single, m1, state, m8 = single_and_sharded_update(cfg, tx, fn, graphdef, params, batch)
    block = state.params["blocks"] if scan else state.params["layer_0"]
    assert "fsdp" in str(block["mlp"]["up_proj"].sharding.spec)
    # As test_rl_vocab_head's mesh test: the 16 x 12 token positions per weight gradient plus
    # the 2-layer chain's contractions (hidden 64, heads 64, intermediate 96, attention 12,
    # head 64, vocabulary 128), for each of the 4 optimiser steps, x2 for nu
    n_terms = 4 * 2 * (16 * 12 + 2 * (64 + 64 + 96 + 12) + 64 + 128)
    assert_trees_close_f32(single.opt_state, state.opt_state, n_terms)
    for k in ("loss/policy", "optim/grad_norm", "entropy/mean"):
        np.testing.assert_allclose(m8[k], m1[k], rtol=1e-5, atol=1e-6)
