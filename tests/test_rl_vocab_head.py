"""Memory-lean training pieces: the vocabulary-chunked head and the cotangent-ordered remat."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.rl.vocab_head import checkpoint_in_backward, chunked_head_logprobs
from test_rl_common import assert_logprob_fns_match, max_abs_diff, on_policy_batch


def direct_logprobs(h, w, targets, tied):
    logp = jax.nn.log_softmax(h @ (w.T if tied else w), axis=-1)
    lp = jnp.take_along_axis(logp, targets[:, None], axis=1)[:, 0]
    return lp, -jnp.sum(jnp.exp(logp) * logp, axis=-1)


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("chunk,rows", [(7, 5), (16, 13), (37, 4), (100, 64)])  # V = 37, N = 13
def test_chunked_head_matches_log_softmax(tied, chunk, rows):
    k = jax.random.split(jax.random.key(0), 5)
    n, d, v = 13, 8, 37
    h = 2.0 * jax.random.normal(k[0], (n, d))
    w = jax.random.normal(k[1], (v, d) if tied else (d, v))
    targets = jax.random.randint(k[2], (n,), 0, v)
    a, b = jax.random.normal(k[3], (n,)), jax.random.normal(k[4], (n,))

    def objective(fn):
        def f(h, w):
            lp, ent = fn(h, w)
            return jnp.sum(a * lp + b * ent), (lp, ent)

        return jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))

    (_, out_c), g_c = objective(
        lambda h, w: chunked_head_logprobs(h, w, targets, None, rows, chunk, tied)
    )(h, w)
    (_, out_d), g_d = objective(lambda h, w: direct_logprobs(h, w, targets, tied))(h, w)
    for x, y in zip(out_c + g_c, out_d + g_d):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-5)
    assert float(jnp.abs(g_d[1]).max()) > 1e-2  # the head gradient is not trivially zero


def test_chunked_head_skips_masked_out_rows():
    # Rows outside the mask: 0 out, no gradient; rows inside: exact, wherever they sit
    # (blocks of 4 rows after the masked-in rows are gathered to the front).
    k = jax.random.split(jax.random.key(2), 4)
    n, d, v = 23, 8, 37
    h, w = jax.random.normal(k[0], (n, d)), jax.random.normal(k[1], (d, v))
    targets = jax.random.randint(k[2], (n,), 0, v)
    mask = jax.random.uniform(k[3], (n,)) < 0.4
    assert 0 < int(mask.sum()) < n

    def f(fn):
        def obj(h, w):
            lp, ent = fn(h, w)
            return jnp.sum(jnp.where(mask, lp + 0.5 * ent, 0.0)), (lp, ent)

        return jax.jit(jax.value_and_grad(obj, argnums=(0, 1), has_aux=True))

    (_, (lp, ent)), (gh, gw) = f(lambda h, w: chunked_head_logprobs(h, w, targets, mask, 4, 16))(
        h, w
    )
    (_, (lp_d, ent_d)), (gh_d, gw_d) = f(lambda h, w: direct_logprobs(h, w, targets, False))(h, w)
    np.testing.assert_allclose(lp, jnp.where(mask, lp_d, 0.0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ent, jnp.where(mask, ent_d, 0.0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gh, gh_d, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gw, gw_d, rtol=1e-5, atol=1e-5)
    assert float(jnp.abs(gh[~mask]).max()) == 0.0


def test_chunked_head_memory_is_one_block_of_logits():
    # N = 1024 rows x V = 8192: the full logits are 32 MiB (and their gradient as much); the
    # head in blocks of 256 rows x 1024 columns holds 1 MiB of logits at a time, and its
    # gradient is one copy of the 2 MiB head kernel.
    n, d, v = 1024, 64, 8192
    h = jax.ShapeDtypeStruct((n, d), jnp.float32)
    w = jax.ShapeDtypeStruct((d, v), jnp.float32)
    targets = jnp.zeros((n,), jnp.int32)

    def grad_of(fn):
        return jax.jit(jax.grad(lambda h, w: jnp.sum(sum(fn(h, w))), argnums=(0, 1)))

    chunked = grad_of(lambda h, w: chunked_head_logprobs(h, w, targets, None, 256, 1024))
    direct = grad_of(lambda h, w: direct_logprobs(h, w, targets, False))
    temp = lambda f: f.lower(h, w).compile().memory_analysis().temp_size_in_bytes
    logits_bytes = n * v * 4
    assert temp(direct) > logits_bytes
    assert temp(chunked) < logits_bytes / 4, temp(chunked) / logits_bytes


def _mlp_block(params, x, scale):
    w1, w2 = params
    return x + scale * (jnp.tanh(x @ w1) @ w2)


def test_checkpoint_in_backward_gradients_and_memory():
    # A stack of 8 blocks with wide activations ([2048, 512] per block, 4 MiB) and small
    # weights: remat that works keeps about one block's activations, not eight.
    layers, n, d, f = 8, 2048, 32, 512
    keys = jax.random.split(jax.random.key(1), 2 * layers + 1)
    params = [
        (
            0.2 * jax.random.normal(keys[2 * i], (d, f)),
            0.2 * jax.random.normal(keys[2 * i + 1], (f, d)),
        )
        for i in range(layers)
    ]
    x = jax.random.normal(keys[-1], (n, d))
    scale = jnp.float32(0.5)

    def loss(block):
        def f(params, x):
            for p in params:
                x = block(p, x, scale)
            return jnp.sum(jnp.sin(x))

        return jax.jit(jax.grad(f, argnums=(0, 1)))

    plain, lean = loss(_mlp_block), loss(checkpoint_in_backward(_mlp_block))
    assert max_abs_diff(lean(params, x), plain(params, x)) <= 1e-4
    act = n * f * 4  # bytes of one block's hidden activation
    temp = lambda fn: fn.lower(params, x).compile().memory_analysis().temp_size_in_bytes
    assert temp(plain) > 0.9 * layers * act  # the plain backward stores every block's tanh
    assert temp(lean) < 3 * act, (temp(lean) / act, temp(plain) / act)


@pytest.mark.parametrize(
    "tied,skip",
    [
        (False, True),  # the trainer's learner pass: in CI
        pytest.param(False, False, marks=pytest.mark.slow),
        pytest.param(True, False, marks=pytest.mark.slow),
    ],
)
def test_lean_logprob_fn_vocab_chunks_match_logits_path(tied, skip):
    # The lean path (block remat, head over blocks of 5 positions and chunks of 48 vocabulary
    # entries, neither dividing) against the plain logits path, tied and untied, values
    # included, with and without skipping the positions that carry no loss.
    from jaxagent.models import ModelConfig, init_model
    from jaxagent.rl.model_fns import model_logprob_fn

    cfg = ModelConfig.test(num_layers=2, value_head=True, tie_embeddings=tied)
    graphdef, params = init_model(cfg, jax.random.key(0))
    lean = model_logprob_fn(graphdef, head_chunk=5, vocab_chunk=48, skip_unmasked_chunks=skip)
    assert_logprob_fns_match(graphdef, params, lean)


@pytest.mark.slow  # test_mesh_trainer and test_parallel check sharded updates in CI
def test_lean_update_on_8_device_mesh_equals_single_device():
    # The Trainer's learner pass (block remat, head over loss positions only) sharded over
    # data=4 x fsdp=2: the gathered head rows and the cotangent-ordered remat partition
    # like any other op, and the update matches the single-device one.
    from jaxagent.models import ModelConfig, init_model
    from jaxagent.rl.model_fns import model_apply_fn, model_logprob_fn
    from jaxagent.rl.recipes import get_recipe
    from jaxagent.rl.train_state import make_optimizer
    from test_rl_common import assert_trees_close_f32, single_and_sharded_update

    graphdef, params = init_model(ModelConfig.test(num_layers=2), jax.random.key(0))
    config = get_recipe(
        "loop",
        lora={"rank": 0},
        optim={"learning_rate": 1e-3},
        update={"minibatch_size": 8, "microbatch_size": 4, "num_epochs": 1},
        advantage={"drop_below": 0.0},
    )
    batch = on_policy_batch(model_apply_fn(graphdef), params, batch_size=16)
    tx = make_optimizer(config)
    fn = model_logprob_fn(graphdef, head_chunk=16, vocab_chunk=48, skip_unmasked_chunks=True)

    single, m1, state, m8 = single_and_sharded_update(config, tx, fn, graphdef, params, batch)
    # Compare what is smooth in the gradient: Adam's moments (mu ~ 0.1 g, nu ~ 0.001 g^2). The
    # parameters are not compared: Adam maps a near-zero gradient entry to a step of about
    # +-lr, so reduction-order noise on another CPU flips whole updates. The bound counts every
    # sum whose order the layout may change, to first order: the 16 x 12 token positions a
    # weight gradient sums over, plus the contractions along the forward/backward chain (per
    # layer: hidden 64, heads x head_dim 64, intermediate 96, attention over 12 positions; the
    # head's hidden 64 and vocabulary 128), for each of the 2 optimiser steps, x2 for nu's
    # squared gradient. (Counting the token sums alone, 384 terms, was exceeded by 1.4x on a
    # fresh run here: the chain's reductions matter as much.)
    chain = 2 * (64 + 64 + 96 + 12) + 64 + 128
    assert_trees_close_f32(single.opt_state, state.opt_state, n_terms=2 * 2 * (16 * 12 + chain))
    np.testing.assert_allclose(m8["loss/policy"], m1["loss/policy"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m8["optim/grad_norm"], m1["optim/grad_norm"], rtol=1e-5)
    assert float(m1["optim/grad_norm"]) > 0


def test_lora_merged_inside_blocks_matches_eager_merge():
    # With LoRA the lean pass gets the base and the adapters unmerged (LoraParams) and merges
    # each block's kernels inside its rematerialisation; one SGD step (the gradient itself)
    # equals the one through the eagerly merged logits path.
    import optax

    from jaxagent.models import ModelConfig, init_model
    from jaxagent.rl.model_fns import model_apply_fn, model_logprob_fn
    from jaxagent.rl.recipes import get_recipe
    from jaxagent.rl.train_state import TrainState
    from jaxagent.rl.update import make_update_step
    from test_rl_common import copy_tree

    graphdef, params = init_model(ModelConfig.test(num_layers=2), jax.random.key(0))
    cfg = get_recipe(
        "loop",
        update={"minibatch_size": 8, "microbatch_size": 4, "num_epochs": 1},
        advantage={"drop_below": 0.0},
    )
    assert cfg.lora.rank > 0
    batch = on_policy_batch(model_apply_fn(graphdef), params, batch_size=8)
    tx = optax.sgd(1.0)
    start = TrainState.create(copy_tree(params), cfg, jax.random.key(0), optimizer=tx)
    out = []
    for kw in (
        dict(apply_fn=model_apply_fn(graphdef)),
        dict(logprob_fn=model_logprob_fn(graphdef)),
    ):
        state = TrainState.create(copy_tree(params), cfg, jax.random.key(0), optimizer=tx)
        out.append(make_update_step(cfg, optimizer=tx, **kw)(state, batch)[0].params)
    assert max_abs_diff(out[0], start.params) > 1e-3  # the adapters moved
    assert max_abs_diff(out[1], out[0]) <= 1e-6
