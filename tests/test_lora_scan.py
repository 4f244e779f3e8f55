"""LoRA over a ``scan_layers`` model: adapters stacked along the layer axis, merged inside
each scan step, equal to LoRA over the same weights unrolled."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.models import ModelConfig, abstract_graphdef, init_model, stack_layers
from jaxagent.rl.lora import LoraParams, init_lora, merge_lora
from jaxagent.rl.model_fns import model_logprob_fn
from jaxagent.rl.recipes import sft_config
from jaxagent.rl.train_state import TrainState, make_optimizer
from jaxagent.rl.update import make_update_step
from jaxagent.types import TokenBatch

L, RANK, ALPHA = 3, 4, 8.0
TARGETS = ("q_proj", "v_proj", "o_proj", "down_proj")


@pytest.fixture(scope="module")
def models():
    cfg = ModelConfig.test(num_layers=L)
    graphdef, params = init_model(cfg, jax.random.key(0))
    adapters = init_lora(params, RANK, TARGETS, jax.random.key(1))
    # b != 0, so every adapter (a and b) has a gradient and the merge changes the model
    keys = iter(jax.random.split(jax.random.key(2), len(adapters)))
    adapters = {
        k: {"a": v["a"], "b": 0.05 * jax.random.normal(next(keys), v["b"].shape)}
        for k, v in adapters.items()
    }
    scan_def = abstract_graphdef(cfg.replace(scan_layers=True))
    scan_params = stack_layers(params, L)
    stacked = {}
    for name in {k.split("/", 1)[1] for k in adapters}:
        pairs = [adapters[f"layer_{i}/{name}"] for i in range(L)]
        stacked[f"blocks/{name}"] = jax.tree.map(lambda *xs: jnp.stack(xs), *pairs)
    tokens = jax.random.randint(jax.random.key(3), (2, 24), 0, cfg.vocab_size)
    pos = jnp.broadcast_to(jnp.arange(24), (2, 24))
    seg = jnp.ones_like(tokens)
    return (graphdef, params, adapters), (scan_def, scan_params, stacked), (tokens, pos, seg)


def _loss_and_grads(graphdef, base, adapters, data, remat=True):
    fn = model_logprob_fn(graphdef, remat=remat, head_chunk=16, vocab_chunk=64)

    def loss(ad):
        lp, _, _ = fn(LoraParams(base, ad, ALPHA, RANK), *data)
        return -jnp.mean(lp[:, 1:])

    return jax.jit(jax.value_and_grad(loss))(adapters)


def test_init_lora_stacks_adapters_along_the_layer_axis(models):
    (_, params, _), (_, scan_params, _), _ = models
    flat = init_lora(params, RANK, TARGETS, jax.random.key(1))
    stacked = init_lora(scan_params, RANK, TARGETS, jax.random.key(1))
    assert set(stacked) == {"blocks/" + k.split("/", 1)[1] for k in flat}
    for k, v in stacked.items():
        one = flat["layer_0/" + k.split("/", 1)[1]]
        assert v["a"].shape == (L, *one["a"].shape) and v["b"].shape == (L, *one["b"].shape)
    # the merge of stacked adapters is the stacked merge of each layer's
    merged = merge_lora(scan_params, stacked, ALPHA, RANK)
    per_layer = stack_layers(
        merge_lora(
            params,
            {
                f"layer_{i}/" + k.split("/", 1)[1]: jax.tree.map(lambda x: x[i], v)
                for k, v in stacked.items()
                for i in range(L)
            },
            ALPHA,
            RANK,
        ),
        L,
    )
    for a, b in zip(jax.tree.leaves(merged), jax.tree.leaves(per_layer)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_lora_scan_layers_loss_and_gradients_equal_unrolled(models):
    (g, p, ad), (sg, sp, sad), data = models
    loss, grads = _loss_and_grads(g, p, ad, data)
    s_loss, s_grads = _loss_and_grads(sg, sp, sad, data)
    # The tolerance: the gap between two exact ways of computing the unrolled model (the
    # merge inside each rematerialised block, and an eager merge without remat), which
    # differ only in XLA's fusion and summation order, as the scanned program does.
    e_loss, e_grads = _loss_and_grads(g, p, ad, data, remat=False)
    eps = float(jnp.finfo(jnp.float32).eps)
    tol_loss = 10 * max(abs(float(loss - e_loss)), eps * abs(float(loss)))
    assert abs(float(s_loss - loss)) <= tol_loss, (float(s_loss), float(loss), tol_loss)
    for name in ad:
        stacked_name = "blocks/" + name.split("/", 1)[1]
        i = int(name.split("/")[0][6:])
        for part in ("a", "b"):
            ref, lazy = np.asarray(e_grads[name][part]), np.asarray(grads[name][part])
            scale = np.abs(ref).max()
            tol = 10 * max(np.abs(ref - lazy).max(), eps * scale) + 1e-6 * scale
            got = np.asarray(s_grads[stacked_name][part][i])
            assert np.abs(got - lazy).max() <= tol, (name, part, np.abs(got - lazy).max(), tol)
            assert scale > 0  # a real gradient was compared


def _sft_batch(tokens):
    b, t = tokens.shape
    zeros = jnp.zeros((b, t), jnp.float32)
    return TokenBatch(
        tokens=tokens.astype(jnp.int32),
        positions=jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t)),
        segment_ids=jnp.ones((b, t), jnp.int32),
        loss_mask=zeros.at[:, 1:].set(1.0),
        old_logprobs=zeros,
        advantages=zeros + 1.0,
        rewards=jnp.ones((b,), jnp.float32),
        group_ids=jnp.arange(b, dtype=jnp.int32),
        turn_ids=jnp.zeros((b, t), jnp.int32),
    )


def test_tiny_lora_scan_run_trains():
    cfg = ModelConfig.test(num_layers=2, scan_layers=True)
    graphdef, params = init_model(cfg, jax.random.key(0))
    rl = sft_config(1e-2, 8, 4).override(lora={"rank": 4, "alpha": 8.0})
    tx = make_optimizer(rl)
    state = TrainState.create(params, rl, jax.random.key(1), optimizer=tx)
    assert all(k.startswith("blocks/") for k in state.params)
    base0 = jax.tree.map(np.asarray, state.frozen_params)
    step = make_update_step(
        rl, logprob_fn=model_logprob_fn(graphdef), optimizer=tx, compute_advantages=False
    )
    tokens = jnp.tile(jnp.arange(16) % 7 + 3, (4, 1))
    batch = _sft_batch(tokens)
    losses = []
    for _ in range(8):
        state, m = step(state, batch)
        losses.append(float(m["loss/total"]))
    assert losses[-1] < losses[0] - 0.5, losses
    for a, b in zip(jax.tree.leaves(base0), jax.tree.leaves(state.frozen_params)):
        np.testing.assert_array_equal(a, np.asarray(b))
