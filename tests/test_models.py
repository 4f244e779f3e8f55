"""The Flax LM on its own: packing, padding, KV-cache chunks, log-probs, axes, value head, dtypes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.models import (
    ModelConfig,
    apply_model,
    init_cache,
    init_model,
    load_hf,
    param_logical_axes,
    save_hf,
    token_logprobs,
)

_apply = jax.jit(apply_model, static_argnums=0)
CFG = ModelConfig.test(rope_theta=500.0)


@pytest.fixture(scope="module")
def model():
    return init_model(CFG, jax.random.key(0))


def _forward(graphdef, params, tokens, segs, positions=None, cache=None):
    tokens, segs = jnp.asarray(tokens, jnp.int32), jnp.asarray(segs, jnp.int32)
    if positions is None:
        positions = jnp.maximum(jnp.cumsum(segs != 0, axis=1) - 1, 0)
    return _apply(graphdef, params, tokens, jnp.asarray(positions, jnp.int32), segs, cache)


def test_packed_and_left_padded_rows_match_unpadded(model):
    graphdef, params = model
    rng = np.random.RandomState(0)
    a, b = rng.randint(0, CFG.vocab_size, 7), rng.randint(0, CFG.vocab_size, 5)
    alone_a = np.asarray(_forward(graphdef, params, a[None], np.ones((1, 7))).logits)[0]
    alone_b = np.asarray(_forward(graphdef, params, b[None], np.ones((1, 5))).logits)[0]
    # one packed row [a | b | pad] with positions restarting, and one left-padded row of b
    tokens = np.zeros((2, 14), np.int32)
    segs = np.zeros((2, 14), np.int32)
    pos = np.zeros((2, 14), np.int32)
    tokens[0, :7], segs[0, :7], pos[0, :7] = a, 1, np.arange(7)
    tokens[0, 7:12], segs[0, 7:12], pos[0, 7:12] = b, 2, np.arange(5)
    tokens[1, 9:], segs[1, 9:], pos[1, 9:] = b, 1, np.arange(5)
    logits = np.asarray(_forward(graphdef, params, tokens, segs, pos).logits)
    np.testing.assert_allclose(logits[0, :7], alone_a, atol=1e-5)
    np.testing.assert_allclose(logits[0, 7:12], alone_b, atol=1e-5)
    np.testing.assert_allclose(logits[1, 9:], alone_b, atol=1e-5)
    assert np.isfinite(logits).all()  # fully masked padding rows stay finite


def test_ragged_cache_chunks_equal_full_forward(model):
    graphdef, params = model
    rng = np.random.RandomState(1)
    lengths = [[3, 4, 2], [1, 6, 5]]  # per row: sizes of three appended chunks
    seqs = [rng.randint(0, CFG.vocab_size, sum(ls)) for ls in lengths]
    cache = init_cache(CFG, 2, 32)
    got = [[], []]
    done = [0, 0]
    for c in range(3):
        width = max(ls[c] for ls in lengths) + 1
        tokens = np.zeros((2, width), np.int32)
        segs = np.zeros((2, width), np.int32)
        for r, ls in enumerate(lengths):
            chunk = seqs[r][done[r] : done[r] + ls[c]]
            if r == 0:  # row 0 left-padded, row 1 right-padded: both must work
                tokens[r, width - ls[c] :], segs[r, width - ls[c] :] = chunk, 1
            else:
                tokens[r, : ls[c]], segs[r, : ls[c]] = chunk, 1
        positions = np.asarray(cache.lengths)[:, None] + np.maximum(np.cumsum(segs, 1) - 1, 0)
        out = _forward(graphdef, params, tokens, segs, positions, cache)
        cache = out.cache
        for r in range(2):
            got[r].append(np.asarray(out.logits)[r][segs[r] == 1])
            done[r] += lengths[r][c]
    np.testing.assert_array_equal(np.asarray(cache.lengths), [9, 12])
    for r in range(2):
        full = np.asarray(
            _forward(graphdef, params, seqs[r][None], np.ones((1, len(seqs[r])))).logits
        )[0]
        np.testing.assert_allclose(np.concatenate(got[r]), full, atol=1e-5)


def test_token_logprobs_alignment():
    rng = np.random.RandomState(2)
    logits = rng.randn(2, 5, 7).astype(np.float32)
    tokens = rng.randint(0, 7, (2, 5))
    got = np.asarray(token_logprobs(jnp.asarray(logits), jnp.asarray(tokens)))
    expect = np.zeros((2, 5))
    for b in range(2):
        for t in range(1, 5):  # entry t scores tokens[t] with the logits at t - 1
            z = logits[b, t - 1].astype(np.float64)
            expect[b, t] = z[tokens[b, t]] - np.log(np.exp(z - z.max()).sum()) - z.max()
    np.testing.assert_allclose(got, expect, atol=1e-5)
    assert got.dtype == np.float32


def test_logical_axes_cover_params(model):
    graphdef, params = model
    axes = param_logical_axes(graphdef, params)
    flat_p = dict(jax.tree_util.tree_flatten_with_path(params)[0])
    flat_a = dict(
        jax.tree_util.tree_flatten_with_path(axes, is_leaf=lambda x: isinstance(x, tuple))[0]
    )
    assert flat_p.keys() == flat_a.keys()
    allowed = {"vocab", "embed", "heads", "kv_heads", "mlp", None}
    sizes = {
        "vocab": CFG.vocab_size,
        "embed": CFG.hidden_size,
        "heads": CFG.num_heads,
        "kv_heads": CFG.num_kv_heads,
        "mlp": CFG.intermediate_size,
    }
    for path, names in flat_a.items():
        shape = flat_p[path].shape
        assert len(names) == len(shape) and set(names) <= allowed, (path, names, shape)
        for name, size in zip(names, shape):
            assert name is None or sizes[name] == size, (path, names, shape)


def test_value_head_and_checkpoint_roundtrip(tmp_path):
    cfg = CFG.replace(value_head=True)
    graphdef, params = init_model(cfg, jax.random.key(1))
    params["value_bias"] = jnp.asarray(0.25)
    tokens = np.random.RandomState(3).randint(0, cfg.vocab_size, (2, 6))
    out = _forward(graphdef, params, tokens, np.ones((2, 6)))
    assert out.values.shape == (2, 6) and out.values.dtype == jnp.float32
    assert np.ptp(np.asarray(out.values)) > 0  # depends on the hidden state
    save_hf(str(tmp_path), cfg, graphdef, params, max_shard_size=50_000)
    cfg2, graphdef2, params2 = load_hf(str(tmp_path))
    assert cfg2.value_head
    jax.tree.map(np.testing.assert_array_equal, params, params2)
    out2 = _forward(graphdef2, params2, tokens, np.ones((2, 6)))
    np.testing.assert_array_equal(np.asarray(out2.values), np.asarray(out.values))


def test_bfloat16_params_close_to_float32(model):
    graphdef, params = model
    cfg16 = CFG.replace(param_dtype="bfloat16", dtype="bfloat16")
    graphdef16, _ = init_model(cfg16, jax.random.key(0))
    params16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    tokens = np.random.RandomState(4).randint(0, CFG.vocab_size, (2, 8))
    ref = np.asarray(_forward(graphdef, params, tokens, np.ones((2, 8))).logits)
    out = _forward(graphdef16, params16, tokens, np.ones((2, 8))).logits
    assert out.dtype == jnp.float32
    assert np.abs(np.asarray(out) - ref).max() < 0.05 * np.abs(ref).max() + 1e-3


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="num_heads=6 must be a multiple of num_kv_heads=4"):
        ModelConfig.test(num_heads=6, num_kv_heads=4)
    with pytest.raises(ValueError, match="param_dtype='int8'"):
        ModelConfig.test(param_dtype="int8")
    with pytest.raises(ValueError, match="rope_type='dynamic'"):
        ModelConfig.test(rope_scaling={"rope_type": "dynamic", "factor": 2.0})
