"""Numerics on a real GPU: the checks the CPU suite makes, repeated where the kernels differ.

XLA's GPU backend picks other fusions, reduction orders and (for bf16) other matmul kernels
than the CPU one, so parity that holds on CPU is re-checked here: blockwise attention against
the reference ``attend``; the sampler's log-probs against the teacher-forced ones; the
rollout-vs-learner log-prob mismatch of a bf16 model, measured and printed as a JSON line;
and cuDNN's flash attention (``model.attention: cudnn``, what ``auto`` picks on a GPU)
against the blockwise tiles, values and gradients.

Run with ``pytest -m gpu`` (tests/conftest.py then leaves the backend alone); without a GPU
every test here is skipped with the reason.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import test_blockwise_attention as blockwise_cpu
from jaxagent.generate import Sampler, SamplingConfig
from jaxagent.models import ModelConfig, apply_model, init_model, token_logprobs


def _no_gpu_reason() -> str:
    backend = jax.default_backend()
    if backend == "gpu":
        return ""
    if "cpu" in (jax.config.jax_platforms or "").split(","):
        how = "JAX_PLATFORMS=cpu (select these tests with `-m gpu` to keep the real backend)"
    else:
        how = "no CUDA device or no CUDA jaxlib (pip install 'jax[cuda12]')"
    return f"needs a GPU: JAX's default backend is {backend!r}: {how}"


_REASON = _no_gpu_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(bool(_REASON), reason=_REASON)]


# ---- (a) blockwise attention == reference attend --------------------------------------------
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_blockwise_attention_matches_reference_on_gpu(dtype):
    # The CPU test's body (tolerance: the reference's own error against float64, doubled,
    # plus a few ulps) with its arrays now on the GPU.
    assert jax.default_backend() == "gpu"
    blockwise_cpu.test_values_match_the_reference_within_its_own_rounding(dtype)
    blockwise_cpu.test_gradients_match_the_reference(dtype)


# ---- (b), (c) sampled log-probs == teacher-forced log-probs ---------------------------------
_apply = jax.jit(apply_model, static_argnums=0)


def sampled_and_forced(cfg: ModelConfig, n_rows: int = 6, new: int = 24, seed: int = 0):
    """(sampled log-probs, teacher-forced log-probs of the same tokens), both [rows, new].

    Prompts of different lengths, sampled at temperature 1 with the KV-cache sampler, then
    the prompt + completion re-scored by one plain forward pass (the learner's view)."""
    graphdef, params = init_model(cfg, jax.random.key(seed))
    rng = np.random.RandomState(seed + 1)
    prompts = [list(rng.randint(1, cfg.vocab_size, n)) for n in rng.randint(2, 14, n_rows)]
    out = Sampler(graphdef)(
        params, prompts, SamplingConfig(max_new_tokens=new, temperature=1.0), jax.random.key(3)
    )
    toks, lps = np.asarray(out.tokens), np.asarray(out.logprobs, np.float64)
    seqs = [p + list(toks[i]) for i, p in enumerate(prompts)]
    t = max(map(len, seqs))
    tokens, segs = np.zeros((n_rows, t), np.int32), np.zeros((n_rows, t), np.int32)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)], segs[i, : len(s)] = s, 1
    positions = np.maximum(np.cumsum(segs, 1) - 1, 0)
    fwd = _apply(graphdef, params, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(segs))
    ref = np.asarray(token_logprobs(fwd.logits, jnp.asarray(tokens)), np.float64)
    forced = np.stack([ref[i, len(p) : len(p) + new] for i, p in enumerate(prompts)])
    return lps, forced


def test_sampled_logprobs_equal_teacher_forced_on_gpu():
    # tests/test_generate.py's property (atol 1e-4 in float32), on the GPU's kernels.
    lps, forced = sampled_and_forced(ModelConfig.test())
    np.testing.assert_allclose(lps, forced, atol=1e-4)


def test_bf16_rollout_vs_learner_mismatch_is_measured():
    """Mean / max |sampled - teacher-forced| log-prob for fp32 and bf16 activations (the
    off-policy error a bf16 sampler feeds the learner), printed as one JSON line; asserted only
    finite, with fp32 tighter than bf16."""
    row = {"check": "bf16_mismatch", "model": "ModelConfig.tiny", "backend": jax.default_backend()}
    for name in ("float32", "bfloat16"):
        cfg = ModelConfig.tiny(dtype=name, param_dtype=name)
        lps, forced = sampled_and_forced(cfg, n_rows=8, new=64)
        err = np.abs(lps - forced)
        assert np.all(np.isfinite(err)), name
        row[name] = {"mean_abs": float(err.mean()), "max_abs": float(err.max())}
    print("\n" + json.dumps(row))  # its own line amid pytest's progress dots
    assert row["float32"]["max_abs"] < row["bfloat16"]["max_abs"], row


# ---- (d) cuDNN flash attention == the blockwise tiles ----------------------------------------
@pytest.mark.parametrize("t", [256, 1024])
def test_cudnn_attention_equals_the_blockwise_tiles_on_gpu(t):
    """``model.attention: cudnn`` (``jax.nn.dot_product_attention(implementation="cudnn")``,
    the segment mask as its mask): values and q/k/v gradients of bf16 packed rows with
    padding, against float32 ground truth no worse than the blockwise tiles' own bf16
    error (doubled, plus one bf16 rounding of the largest entry)."""
    from jaxagent.models.blockwise import attend_blockwise, attend_cudnn

    (q, k, v), seg = blockwise_cpu._inputs(t, jnp.bfloat16, seed=5)
    w = jnp.asarray(np.random.default_rng(6).normal(size=q.shape), jnp.float32)
    w = w * (seg != 0)[:, :, None, None, None]  # padding outputs are ignored by every caller
    valid = np.asarray(seg != 0)

    def run(fn, *args):
        def loss(q, k, v):
            return jnp.sum(fn(q, k, v).astype(jnp.float32) * w)

        out = jax.jit(fn)(*args)
        grads = jax.jit(jax.grad(loss, (0, 1, 2)))(*args)
        return [np.asarray(x, np.float64) for x in (out, *grads)]

    blockwise = lambda q, k, v: attend_blockwise(q, k, v, seg)  # noqa: E731
    truth = run(blockwise, *(x.astype(jnp.float32) for x in (q, k, v)))
    ref = run(blockwise, q, k, v)
    got = run(lambda q, k, v: attend_cudnn(q, k, v, seg), q, k, v)
    eps = float(jnp.finfo(jnp.bfloat16).eps)
    for i, (g, r, tr) in enumerate(zip(got, ref, truth)):
        if i == 0:
            g, r, tr = g[valid], r[valid], tr[valid]
        scale = np.abs(tr).max()
        ref_err, got_err = np.abs(r - tr).max(), np.abs(g - tr).max()
        assert np.isfinite(g).all(), i
        assert got_err <= 2 * ref_err + eps * scale, (i, got_err, ref_err)


def test_auto_attention_is_cudnn_on_gpu_and_the_model_agrees():
    """``model.attention: auto`` on a GPU runs cuDNN (its custom call is in the program), and
    the tiny model's long-row loss and gradients (bf16 compute) are no further from the fp32
    blockwise model's than the bf16 blockwise model's are (doubled, plus one bf16 rounding)."""
    from jaxagent.models import apply_model

    t = 1024  # > blockwise.BLOCK: the kernel path
    tokens = jax.random.randint(jax.random.key(1), (2, t), 1, 8192)
    half = jnp.ones((2, t // 2), jnp.int32)
    seg = jnp.concatenate([half, 2 * half], 1)  # two packed episodes a row
    pos = jnp.concatenate([jnp.arange(t // 2)] * 2)[None].repeat(2, 0)
    results = {}
    for name, kernel, dtype in (
        ("truth", "blockwise", "float32"),
        ("blockwise", "blockwise", "bfloat16"),
        ("auto", "auto", "bfloat16"),
    ):
        cfg = ModelConfig.tiny(attention=kernel, dtype=dtype)
        graphdef, params = init_model(cfg, jax.random.key(0))

        def loss(p):
            logits = apply_model(graphdef, p, tokens, pos, seg).logits
            return jnp.mean(token_logprobs(logits, tokens))

        fn = jax.jit(jax.value_and_grad(loss))
        if kernel == "auto":
            assert "cudnn$fmha" in fn.lower(params).compile().as_text()
        value, grads = fn(params)
        leaves = [np.asarray(g, np.float64) for g in jax.tree.leaves(grads)]
        results[name] = (float(value), leaves)
    eps = float(jnp.finfo(jnp.bfloat16).eps)
    (v_tr, g_tr), (v_ref, g_ref), (v_got, g_got) = (
        results[k] for k in ("truth", "blockwise", "auto")
    )
    assert abs(v_got - v_tr) <= 2 * abs(v_ref - v_tr) + eps * abs(v_tr), (v_got, v_ref, v_tr)
    for tr, r, g in zip(g_tr, g_ref, g_got):
        scale = np.abs(tr).max()
        assert np.abs(g - tr).max() <= 2 * np.abs(r - tr).max() + eps * scale


# ---- (e) the prefill through cuDNN == the plain cached attention ------------------------------
def test_cudnn_prefill_cache_is_no_worse_than_the_plain_bf16_prefill_on_gpu():
    """The slot sampler's admit (``model.attention: cudnn``: a prompt chunk attends through
    cuDNN with the chunk's offset causal mask) of ragged prompts longer than the prefill
    chunk: the KV cache it writes is no further from the float32 plain prefill's than the
    bf16 plain prefill's is (doubled, plus one bf16 rounding of the largest entry), and the
    rows' lengths are equal. tests/test_prefill_cudnn.py checks the call's semantics on CPU
    through XLA's implementation of the same API."""
    from jaxagent.generate import SamplingConfig
    from jaxagent.generate.slots import SlotSampler

    rng = np.random.default_rng(1)
    rows = 8
    prompts = [rng.integers(4, 128, size=int(n)).tolist() for n in rng.integers(40, 300, rows)]
    sampling = SamplingConfig(max_new_tokens=4, temperature=1.0, prefill_chunk=128)
    caches = {}
    for name, kernel, dtype in (
        ("truth", "blockwise", "float32"),
        ("plain", "blockwise", "bfloat16"),
        ("cudnn", "cudnn", "bfloat16"),
    ):
        cfg = ModelConfig.test(num_heads=4, num_kv_heads=2, attention=kernel, dtype=dtype)
        graphdef, params = init_model(cfg, jax.random.key(0))
        slots = SlotSampler(graphdef, sampling, rows, 512, decode_steps=4)
        st = slots.init(params)
        ids = list(range(rows))
        st = slots.admit(
            params, slots.prepare(params), st, ids, prompts, [True] * rows,
            jax.random.key(3), ids, [0] * rows,
        )  # fmt: skip
        keys = [np.asarray(x, np.float64) for x in jax.tree.leaves(st.cache.keys)]
        caches[name] = (keys, np.asarray(st.cache.lengths))
    eps = float(jnp.finfo(jnp.bfloat16).eps)
    (k_tr, n_tr), (k_ref, n_ref), (k_got, n_got) = (caches[k] for k in ("truth", "plain", "cudnn"))
    np.testing.assert_array_equal(n_got, n_ref)
    np.testing.assert_array_equal(n_got, n_tr)
    for tr, r, g in zip(k_tr, k_ref, k_got):
        assert np.isfinite(g).all()
        scale = np.abs(tr).max()
        assert np.abs(g - tr).max() <= 2 * np.abs(r - tr).max() + eps * scale
