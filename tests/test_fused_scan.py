"""The fused optimiser with ``model.scan_layers`` (``jaxagent.rl.fused_step.ScanHook``): the
scan over the stacked blocks is one custom VJP whose backward loop steps each layer's slice of
the stacked parameters and moments in place. The same step as the plain scanned update, with
no stacked gradient in memory."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxagent.models import ModelConfig, abstract_graphdef, init_model
from jaxagent.rl import get_recipe
from jaxagent.rl.model_fns import model_apply_fn, model_logprob_fn
from jaxagent.rl.train_state import TrainState, clip_by_global_norm_scaled, make_optimizer
from jaxagent.rl.update import make_update_step
from jaxagent.types import TokenBatch
from test_rl_common import (
    assert_trees_close_f32,
    copy_tree,
    on_policy_batch,
    single_and_sharded_update,
)

LR = 1e-3


def _cfg(fused, **kw):
    update = dict(minibatch_size=8, num_epochs=2, fused_optimizer=fused)
    return get_recipe("loop", lora={"rank": 0}, update=update, **kw)


def _setup():
    cfg = ModelConfig.test(num_layers=2, scan_layers=True)
    graphdef, params = init_model(cfg, jax.random.key(0))
    batch = on_policy_batch(model_apply_fn(graphdef), params, batch_size=16, seq_len=12)
    return graphdef, params, batch


def _run(tx, graphdef, params, batch, fused, **kw):
    cfg = _cfg(fused, **kw)
    state = TrainState.create(copy_tree(params), cfg, jax.random.key(1), optimizer=tx)
    update = make_update_step(cfg, optimizer=tx, logprob_fn=model_logprob_fn(graphdef))
    return update(state, batch)


def test_fused_scan_step_matches_the_plain_scan_step_sgd():
    """SGD keeps the step linear in the gradient: the stacked parameters after 4 clipped steps
    (2 epochs x 2 minibatches) agree with the plain scanned step's at the float32
    reassociation bound of a gradient summed over 8 x 12 token terms, and so do the losses
    and gradient norms."""
    graphdef, params, batch = _setup()
    tx = optax.chain(clip_by_global_norm_scaled(0.05), optax.sgd(0.1))
    plain, m0 = _run(tx, graphdef, params, batch, fused=False)
    fused, m1 = _run(tx, graphdef, params, batch, fused=True)
    assert float(m0["optim/grad_norm"]) > 0.05  # the clip is active
    assert_trees_close_f32(plain.params, fused.params, n_terms=4 * 96)
    moved = max(
        float(jnp.max(jnp.abs(a - b)))
        for a, b in zip(*map(jax.tree.leaves, (plain.params["blocks"], params["blocks"])))
    )
    assert moved > 1e-4  # the stacked blocks did step
    for k in ("loss/total", "optim/grad_norm", "guard/nonfinite", "kl/approx_old_new"):
        np.testing.assert_allclose(float(m1[k]), float(m0[k]), rtol=1e-5, atol=1e-7, err_msg=k)


def test_fused_scan_step_matches_the_plain_scan_step_adamw():
    """make_optimizer's AdamW + clip: Adam's moments (linear in the gradients) agree at the
    reassociation bound, the gradient norms to 1e-5; parameters are not compared at 1e-5
    after Adam (a near-zero gradient entry's sign moves one by up to 2 x lr a step)."""
    graphdef, params, batch = _setup()
    kw = dict(optim={"learning_rate": LR, "max_grad_norm": 0.5})
    tx = make_optimizer(_cfg(False, **kw))
    plain, m0 = _run(tx, graphdef, params, batch, False, **kw)
    fused, m1 = _run(tx, graphdef, params, batch, True, **kw)
    assert_trees_close_f32(plain.opt_state, fused.opt_state, n_terms=4 * 96)
    diffs = np.concatenate(
        [
            np.abs(np.ravel(a - b))
            for a, b in zip(*map(jax.tree.leaves, (plain.params, fused.params)))
        ]
    )
    assert diffs.max() <= 4 * 2 * LR
    np.testing.assert_allclose(
        float(m1["optim/grad_norm"]), float(m0["optim/grad_norm"]), rtol=1e-5
    )


def test_fused_scan_step_skips_a_nonfinite_step():
    graphdef, params, batch = _setup()
    batch = batch.replace(rewards=jnp.full_like(batch.rewards, jnp.nan))
    state, m = _run(make_optimizer(_cfg(True)), graphdef, params, batch, fused=True)
    assert float(m["guard/nonfinite"]) == 1.0
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert all(float(jnp.max(jnp.abs(x))) == 0 for x in jax.tree.leaves(state.opt_state) if x.ndim)


@pytest.mark.slow  # two compiles of a 6-layer step
def test_fused_scan_step_holds_no_stacked_gradient():
    """XLA's accounting of the compiled scanned step (tests/test_fused_step.py's shape, 6
    layers of width 384): the fused step's temporaries are below the plain scanned step's by
    more than a quarter of the stacked blocks' gradient bytes (30.7 MB). Measured on CPU:
    plain 41.8 MB, fused 24.7 MB (unrolled: plain 33.7, fused 14.4)."""
    cfg_model = ModelConfig.test(
        num_layers=6,
        hidden_size=384,
        intermediate_size=1024,
        num_heads=4,
        num_kv_heads=4,
        scan_layers=True,
    )
    graphdef = abstract_graphdef(cfg_model)
    params = jax.eval_shape(lambda k: init_model(cfg_model, k)[1], jax.random.key(0))
    blocks = sum(x.size * 4 for x in jax.tree.leaves(params["blocks"]))
    b, t = 8, 16
    i32 = lambda: jax.ShapeDtypeStruct((b, t), jnp.int32)  # noqa: E731
    f32 = lambda: jax.ShapeDtypeStruct((b, t), jnp.float32)  # noqa: E731
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
    assert temps[True] < temps[False] - 0.25 * blocks, (temps, blocks)


@pytest.mark.slow  # a single-device and a mesh update
def test_fused_scan_step_sharded_equals_single_device():
    """On 8 simulated devices (data=4 x fsdp=2: the stacked weights and moments split over
    fsdp, sliced a layer at a time in the backward loop): the single device's moments and
    metrics, at tests/test_fused_step.py's bound for the same model."""
    graphdef, params, batch = _setup()
    cfg = _cfg(True)
    tx = make_optimizer(cfg)
    fn = model_logprob_fn(graphdef)
    single, m1, state, m8 = single_and_sharded_update(cfg, tx, fn, graphdef, params, batch)
    assert "fsdp" in str(state.params["blocks"]["mlp"]["up_proj"].sharding.spec)
    n_terms = 4 * 2 * (16 * 12 + 2 * (64 + 64 + 96 + 12) + 64 + 128)
    assert_trees_close_f32(single.opt_state, state.opt_state, n_terms)
    for k in ("loss/policy", "optim/grad_norm", "entropy/mean"):
        np.testing.assert_allclose(m8[k], m1[k], rtol=1e-5, atol=1e-6)
