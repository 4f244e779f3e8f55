"""Blockwise attention: equal to the reference ``attend`` (values and gradients, fp32 and
bf16, against a float64 ground truth), memory linear in sequence length (read from the
compiled plan), and the model's long-row path equal to its short-row path."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxagent.models import blockwise, transformer as TR
from jaxagent.models.blockwise import attend_blockwise, tiling

B, K, G, HD = 2, 2, 2, 16


def _inputs(t, dtype, seed=0):
    r = np.random.default_rng(seed)
    q = r.normal(size=(B, t, K, G, HD)) * HD**-0.5
    k, v = r.normal(size=(B, K, t, HD)), r.normal(size=(B, K, t, HD))
    seg = np.zeros((B, t), np.int32)  # row 0: two packed episodes and padding; row 1: one
    seg[0, : t // 3], seg[0, t // 3 : 3 * t // 4], seg[1, : t - 7] = 1, 2, 1
    return [jnp.asarray(x, dtype) for x in (q, k, v)], jnp.asarray(seg)


def _mask(seg):
    t = seg.shape[1]
    causal = np.arange(t)[None, :, None] >= np.arange(t)[None, None, :]
    return causal & (seg[:, :, None] == seg[:, None, :]) & (seg[:, None, :] != 0)


def _truth(q, k, v, seg):
    """float64 numpy attention; [B, T, K, G, hd]."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    s = np.einsum("btkgh,bksh->bkgts", q, k)
    s = np.where(_mask(np.asarray(seg))[:, None, None], s, -1e300)  # padding rows: ignored
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bkgts,bksh->bkgth", p, v).transpose(0, 3, 1, 2, 4)


# 200 tokens: no tile of at least 64 divides the row, which is padded to 256 inside.
@pytest.mark.parametrize("t", [256, 200])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_values_match_the_reference_within_its_own_rounding(dtype, t):
    (q, k, v), seg = _inputs(t, dtype)
    valid = np.asarray(seg != 0)
    truth = _truth(q, k, v, seg)[valid]
    ref = np.asarray(TR.attend(q, k, v, jnp.asarray(_mask(np.asarray(seg)))), np.float64)
    got = np.asarray(attend_blockwise(q, k, v, seg, block=64), np.float64)
    ref_err = np.abs(ref[valid] - truth).max()
    got_err = np.abs(got[valid] - truth).max()
    # The tolerance is the reference implementation's own error against float64: tiling
    # changes the order of the sums, never the precision (the online softmax runs in fp32).
    assert got_err <= 2 * ref_err + 4 * float(jnp.finfo(dtype).eps), (got_err, ref_err)


@pytest.mark.parametrize("t", [192, 200])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_gradients_match_the_reference(dtype, t):
    (q, k, v), seg = _inputs(t, dtype, seed=1)
    mask = jnp.asarray(_mask(np.asarray(seg)))
    w = jnp.asarray(np.random.default_rng(2).normal(size=q.shape), jnp.float32)
    w = w * (seg != 0)[:, :, None, None, None]  # padding outputs are ignored by every caller

    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32) * w)

    def grads(fn, *args):
        return [np.asarray(g, np.float64) for g in jax.jit(jax.grad(loss(fn), (0, 1, 2)))(*args)]

    ref = grads(lambda q, k, v: TR.attend(q, k, v, mask), q, k, v)
    got = grads(lambda q, k, v: attend_blockwise(q, k, v, seg, block=32), q, k, v)
    # Ground truth: the reference in fp32 on the same (rounded) inputs.
    truth = grads(
        lambda q, k, v: TR.attend(q, k, v, mask), *(x.astype(jnp.float32) for x in (q, k, v))
    )
    t = q.shape[1]
    for r, g, tr in zip(ref, got, truth):
        scale = np.abs(tr).max()
        if dtype == jnp.float32:
            # a sum of t fp32 terms in another order: at most t roundings apart
            assert np.abs(g - r).max() <= t * float(jnp.finfo(jnp.float32).eps) * scale
        else:  # no worse than the reference's own bf16 error (plus one bf16 rounding)
            ref_err, got_err = np.abs(r - tr).max(), np.abs(g - tr).max()
            assert got_err <= 2 * ref_err + float(jnp.finfo(jnp.bfloat16).eps) * scale


def test_attention_temporaries_grow_linearly_with_length():
    """From the compiled plans of value-and-grad at 1k / 2k / 4k tokens: the reference grows
    4x per doubling (the [T, S] scores), the blockwise path at most 2.2x."""

    def temp_bytes(fn, t):
        q = jax.ShapeDtypeStruct((1, t, K, 4, 64), jnp.float32)
        kv = jax.ShapeDtypeStruct((1, K, t, 64), jnp.float32)
        seg = jax.ShapeDtypeStruct((1, t), jnp.int32)
        grad = jax.value_and_grad(lambda q, k, v, s: jnp.sum(fn(q, k, v, s) ** 2), (0, 1, 2))
        return jax.jit(grad).lower(q, kv, kv, seg).compile().memory_analysis().temp_size_in_bytes

    def reference(q, k, v, seg):
        t = seg.shape[1]
        causal = jnp.arange(t)[None, :, None] >= jnp.arange(t)[None, None, :]
        mask = causal & (seg[:, :, None] == seg[:, None, :]) & (seg[:, None, :] != 0)
        return TR.attend(q, k, v, mask)

    ours = [temp_bytes(attend_blockwise, t) for t in (1024, 2048, 4096)]
    ref = [temp_bytes(reference, t) for t in (1024, 2048, 4096)]
    assert ref[2] / ref[1] > 3.5  # the quadratic path, for contrast
    for a, b in zip(ours, ours[1:]):
        assert b / a <= 2.2, ours
    assert ours[2] < ref[2] / 10, (ours, ref)


def test_tiles_divide_the_row_and_stay_long():
    # (tile, padded row): a row no long tile divides is padded, never cut into tiny tiles
    # (the web recipe's 626-token SFT rows took tiles of 2 tokens and 11x the step time)
    assert tiling(4096) == (512, 4096) and tiling(1536) == (512, 1536)
    assert tiling(640) == (128, 640) and tiling(626) == (128, 640)
    assert tiling(1000) == (512, 1024) and tiling(200, block=64) == (64, 256)


def test_the_model_attends_long_rows_tile_by_tile_with_the_same_logits(monkeypatch):
    from jaxagent.models import ModelConfig

    cfg = ModelConfig.test(vocab_size=97, max_seq_len=256)
    model = TR.Transformer(cfg, nnx.Rngs(0))
    tokens = jnp.asarray(np.random.default_rng(0).integers(1, 97, size=(2, 128)), jnp.int32)
    seg = jnp.asarray(np.where(np.arange(128) < 100, 1, 0)[None].repeat(2, 0), jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(128), (2, 128))
    graphdef, state = nnx.split(model)

    def logits(state):
        m = nnx.merge(graphdef, state)
        return m.logits(m.hidden(tokens, pos, seg, remat=True)[0])

    ref = logits(state)
    monkeypatch.setattr(TR, "BLOCK", 64)  # rows of 128 now take the blockwise path
    got = logits(state)
    valid = np.asarray(seg != 0)
    np.testing.assert_allclose(np.asarray(got)[valid], np.asarray(ref)[valid], atol=2e-5)
    # and the gradient flows through the tiles (under remat, as the trainer runs it)
    g = jax.grad(lambda s: jnp.sum(jnp.where(seg[..., None] != 0, logits(s), 0.0) ** 2))(state)
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(g))


@pytest.mark.parametrize("t", [256, 200])
def test_splash_kernel_equals_the_blockwise_tiles(t):
    """The Pallas splash kernel (``model.attention: splash``, TPU), run in the Pallas
    interpreter: values and gradients equal the pure-JAX tiles' within fp32 reassociation
    (a sum of t terms in another order), on packed rows with padding (200: padded inside)."""
    from jaxagent.models.blockwise import attend_splash

    (q, k, v), seg = _inputs(t, jnp.float32, seed=3)
    w = jnp.asarray(np.random.default_rng(4).normal(size=q.shape), jnp.float32)
    w = w * (seg != 0)[:, :, None, None, None]  # padding outputs are ignored by every caller

    def run(fn):
        out, grads = jax.value_and_grad(lambda q, k, v: jnp.sum(fn(q, k, v) * w), (0, 1, 2))(
            q, k, v
        )
        return [np.asarray(x, np.float64) for x in (fn(q, k, v), *grads)]

    ref = run(lambda q, k, v: attend_blockwise(q, k, v, seg, block=128))
    got = run(lambda q, k, v: attend_splash(q, k, v, seg, block=128, interpret=True))
    valid = np.asarray(seg != 0)
    eps = float(jnp.finfo(jnp.float32).eps)
    np.testing.assert_allclose(got[0][valid], ref[0][valid], atol=t * eps)
    for g, r in zip(got[1:], ref[1:]):
        assert np.abs(g - r).max() <= t * eps * np.abs(r).max()


def test_splash_runs_per_device_under_a_mesh(monkeypatch):
    """``model.attention: splash`` on a data=4 x tensor=2 mesh (rows over data, KV heads over
    tensor): the kernel runs per device under ``shard_map`` and the long-row logits and
    gradients equal the blockwise model's on one device."""
    import dataclasses

    from jax.sharding import NamedSharding, PartitionSpec as P

    from jaxagent.models import ModelConfig, init_model, param_logical_axes
    from jaxagent.parallel.mesh import make_mesh, param_shardings

    cfg = ModelConfig.test(vocab_size=97, max_seq_len=256, num_heads=4, num_kv_heads=2)
    graphdef, params = init_model(cfg, jax.random.key(0))
    splash_def, _ = init_model(dataclasses.replace(cfg, attention="splash"), jax.random.key(0))
    rng = np.random.default_rng(5)
    tokens = jnp.asarray(rng.integers(1, 97, size=(4, 128)), jnp.int32)
    seg = jnp.asarray(np.where(np.arange(128) < 100, 1, 0)[None].repeat(4, 0), jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(128), (4, 128))
    monkeypatch.setattr(TR, "BLOCK", 64)  # rows of 128 take the long-row path

    def logits_and_grads(graphdef, params, sharding=None):
        def f(params):
            m = nnx.merge(graphdef, params)
            h = m.hidden(tokens, pos, seg, remat=True, activation_sharding=sharding)[0]
            z = m.logits(h)
            return jnp.sum(jnp.where(seg[..., None] != 0, z, 0.0) ** 2), z

        (_, z), g = jax.jit(jax.value_and_grad(f, has_aux=True))(params)
        return np.asarray(z), g

    ref, ref_g = logits_and_grads(graphdef, params)
    mesh = make_mesh(data=4, tensor=2)
    sharded = jax.device_put(
        params, param_shardings(params, param_logical_axes(graphdef, params), mesh)
    )
    calls = []
    real = blockwise.attend_splash
    monkeypatch.setattr(
        blockwise, "attend_splash", lambda *a, **kw: calls.append(kw) or real(*a, **kw)
    )
    got, got_g = logits_and_grads(splash_def, sharded, NamedSharding(mesh, P("data")))
    assert calls and all(kw["interpret"] for kw in calls)  # the kernel ran, interpreted on CPU
    valid = np.asarray(seg != 0)
    np.testing.assert_allclose(got[valid], ref[valid], atol=2e-5)
    for a, b in zip(jax.tree.leaves(got_g), jax.tree.leaves(ref_g)):
        a, b = np.asarray(a), np.asarray(b)
        assert np.abs(a - b).max() <= 1e-4 * max(1.0, np.abs(b).max())
