"""Chunked prefill and shared-prompt prefill: the same samples, less memory, fewer tokens."""

import dataclasses

import jax
import numpy as np
import pytest

from jaxagent.errors import ConfigError
from jaxagent.generate import Sampler, SamplingConfig
from jaxagent.models import ModelConfig, init_model

V = 128


@pytest.fixture(scope="module")
def model():
    # initializer 0.1-scale weights would need a custom init; instead scale params so
    # next-token distributions are peaked and greedy has no near-ties.
    graphdef, params = init_model(ModelConfig.test(max_seq_len=1024), jax.random.key(0))
    params = jax.tree.map(lambda x: x * 5.0 if x.ndim >= 2 else x, params)
    return graphdef, params


def _prompts(lengths, seed=0):
    rng = np.random.RandomState(seed)
    return [list(rng.randint(1, V, n)) for n in lengths]


def _logprob_atol(out):
    # Chunking changes only the accumulation order of the attention sums (the same keys,
    # positions and mask per query): float32 rounding of O(eps * sqrt(context)) relative to
    # logits of magnitude |logit|, times a few layers. Derived from the logits' scale.
    eps = float(np.finfo(np.float32).eps)
    scale = max(1.0, float(np.max(np.abs(np.asarray(out.logprobs)))))
    return 64 * eps * scale * np.sqrt(512)


@pytest.mark.parametrize("greedy", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_chunked_prefill_samples_what_one_call_samples(model, greedy):
    graphdef, params = model
    # Ragged rows, longest several chunks of 32 (t = 512, 16 chunks; a short row ends in
    # the first chunk, so later chunks are padding for it).
    prompts = _prompts([300, 37, 129, 5])
    base = SamplingConfig(max_new_tokens=12, greedy=greedy, prefill_chunk=0)
    sampler = Sampler(graphdef)
    ref = sampler(params, prompts, base, jax.random.key(1))
    for chunk in (32, 96):  # 96: not a power of two, t rounds to whole chunks
        out = sampler(
            params, prompts, dataclasses.replace(base, prefill_chunk=chunk), jax.random.key(1)
        )
        np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
        np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(ref.lengths))
        np.testing.assert_allclose(
            np.asarray(out.logprobs), np.asarray(ref.logprobs), atol=_logprob_atol(ref), rtol=0
        )
        np.testing.assert_array_equal(np.asarray(out.cache.lengths), np.asarray(ref.cache.lengths))
    # A continuation on top of a chunked prefill goes on as on top of a one-call prefill.
    more = _prompts([70, 3, 0, 11], seed=2)
    cfg = dataclasses.replace(base, prefill_chunk=32)
    a = sampler(params, more, base, jax.random.key(3), cache=ref.cache)
    b = sampler(params, more, cfg, jax.random.key(3), cache=out.cache)
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))


def test_prefill_chunk_is_validated():
    with pytest.raises(ConfigError, match="prefill_chunk"):
        SamplingConfig(prefill_chunk=-1)


def _prefill_temp_bytes(graphdef, params, prompt_len, chunk, rows=1):
    sampler = Sampler(graphdef)
    cfg = SamplingConfig(max_new_tokens=1, greedy=True, prefill_chunk=chunk)
    prompts = [[1] * prompt_len] * rows
    lowered = sampler.lower(params, prompts, cfg, jax.random.key(0))
    return lowered.compile().memory_analysis().temp_size_in_bytes


def test_chunked_prefill_temporaries_grow_linearly():
    # Width-32 model: the compiled plan's temporaries at 1k / 2k / 4k-token prompts. One
    # call holds [rows, heads, prompt, capacity] scores (4x a doubling); chunks of 256 hold
    # [rows, heads, 256, capacity] (2x), plus the cache and activations (also linear).
    cfg = ModelConfig.test(
        num_layers=1,
        hidden_size=32,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        intermediate_size=64,
        max_seq_len=8192,
    )
    graphdef, params = init_model(cfg, jax.random.key(0))
    lens = (1000, 2000, 4000)
    chunked = [_prefill_temp_bytes(graphdef, params, n, 256) for n in lens]
    whole = [_prefill_temp_bytes(graphdef, params, n, 0) for n in lens[1:]]
    for small, big in zip(chunked, chunked[1:]):
        assert big <= 2.2 * small, (chunked, whole)
    assert whole[-1] / whole[-2] > 3.0, whole  # the quadratic figure the chunks remove
    assert chunked[-1] * 4 < whole[-1], (chunked, whole)


def test_shared_prompts_prefill_once_and_sample_the_same(model):
    graphdef, params = model
    k = 4
    tasks = _prompts([40, 9, 77], seed=5)
    prompts = [p for p in tasks for _ in range(k)]  # K samples of each task, as a rollout
    cfg = SamplingConfig(max_new_tokens=10, prefill_chunk=32)
    plain, shared = Sampler(graphdef), Sampler(graphdef)
    ids = range(len(prompts))
    a = plain(params, prompts, cfg, jax.random.key(7), row_ids=ids)
    b = shared(params, prompts, cfg, jax.random.key(7), row_ids=ids, share_prompts=True)
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    np.testing.assert_array_equal(np.asarray(a.lengths), np.asarray(b.lengths))
    np.testing.assert_allclose(
        np.asarray(a.logprobs), np.asarray(b.logprobs), atol=_logprob_atol(a), rtol=0
    )
    assert plain.prefilled_tokens == sum(map(len, prompts))
    assert shared.prefilled_tokens == sum(map(len, tasks))  # K-fold fewer
    # The copied cache rows continue exactly like the separately prefilled ones.
    more = _prompts([3] * len(prompts), seed=6)
    c = plain(params, more, cfg, jax.random.key(8), cache=a.cache, row_ids=ids)
    d = shared(params, more, cfg, jax.random.key(8), cache=b.cache, row_ids=ids)
    np.testing.assert_array_equal(np.asarray(c.tokens), np.asarray(d.tokens))


@pytest.mark.parametrize(
    "variant",
    [
        dict(scan_layers=True),
        pytest.param(dict(kv_cache_dtype="bfloat16"), marks=pytest.mark.slow),
        dict(sharded=True),
    ],
)
def test_chunked_and_shared_prefill_across_model_variants(variant):
    """Stacked cache (the chunk loop carries it), a bf16 cache (chunks read back rounded
    keys exactly as one call does), rows sharded over a mesh (shared prompts' copied rows
    are constrained to the rows' sharding): same greedy tokens as the plain call."""
    from jaxagent.models import param_logical_axes
    from jaxagent.parallel.layout import DeviceLayout
    from jaxagent.parallel.mesh import make_mesh

    variant = dict(variant)
    sharded = variant.pop("sharded", False)
    graphdef, params = init_model(ModelConfig.test(**variant), jax.random.key(0))
    params = jax.tree.map(lambda x: x * 5.0 if x.ndim >= 2 else x, params)
    tasks = _prompts([150, 20, 67, 3], seed=11)
    prompts = [p for p in tasks for _ in range(2)]
    base = SamplingConfig(max_new_tokens=8, greedy=True, prefill_chunk=0)
    ref = Sampler(graphdef)(params, prompts, base, jax.random.key(0))
    if sharded:
        mesh = make_mesh(data=4, fsdp=2)
        params = DeviceLayout(mesh, param_logical_axes(graphdef, params)).params(params)
    cfg = dataclasses.replace(base, prefill_chunk=32)
    sampler = Sampler(graphdef)
    out = sampler(params, prompts, cfg, jax.random.key(0), share_prompts=True)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    np.testing.assert_array_equal(np.asarray(out.cache.lengths), np.asarray(ref.cache.lengths))
    assert sampler.prefilled_tokens == sum(map(len, tasks))
    if sharded:
        assert out.cache.keys[0].sharding.spec[0] == ("data", "fsdp")
