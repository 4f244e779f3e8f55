"""Sampler parity: greedy vs transformers.generate, log-probs vs teacher forcing, cache continuation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from jaxagent.generate import Sampler, SamplingConfig, sample_tokens
from jaxagent.models import ModelConfig, apply_model, init_model, load_hf, token_logprobs

V = 128
_apply = jax.jit(apply_model, static_argnums=0)


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory):
    torch.manual_seed(0)
    # initializer_range 0.1 makes next-token distributions peaked, so greedy has no near-ties.
    cfg = transformers.LlamaConfig(
        vocab_size=V,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=96,
        max_position_embeddings=256,
        initializer_range=0.1,
        attn_implementation="eager",
    )
    model = transformers.LlamaForCausalLM(cfg).eval()
    path = str(tmp_path_factory.mktemp("hf") / "llama")
    model.save_pretrained(path, safe_serialization=True)
    _, graphdef, params = load_hf(path)
    return model, graphdef, params, Sampler(graphdef)  # one sampler: compiled shapes are shared


def _prompts(lengths, seed=0):
    rng = np.random.RandomState(seed)
    return [list(rng.randint(1, V, n)) for n in lengths]


def _teacher_forced(graphdef, params, seqs):
    """Log-probs [B, T] of right-padded sequences by a plain forward pass."""
    t = max(len(s) for s in seqs)
    tokens = np.zeros((len(seqs), t), np.int32)
    segs = np.zeros((len(seqs), t), np.int32)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)], segs[i, : len(s)] = s, 1
    positions = np.maximum(np.cumsum(segs, 1) - 1, 0)
    out = _apply(graphdef, params, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(segs))
    return np.asarray(token_logprobs(out.logits, jnp.asarray(tokens))), np.asarray(out.logits)


def test_greedy_matches_transformers_generate(hf_model):
    model, graphdef, params, sampler = hf_model
    prompts = _prompts([5, 11, 3, 8])
    n = 32
    out = sampler(params, prompts, SamplingConfig(max_new_tokens=n, greedy=True), jax.random.key(0))

    t = max(map(len, prompts))
    ids = np.zeros((4, t), np.int64)
    mask = np.zeros((4, t), np.int64)
    for i, p in enumerate(prompts):  # left padding, as HF decoder-only generation expects
        ids[i, t - len(p) :], mask[i, t - len(p) :] = p, 1
    with torch.no_grad():
        ref = model.generate(
            input_ids=torch.tensor(ids),
            attention_mask=torch.tensor(mask),
            do_sample=False,
            max_new_tokens=n,
            min_new_tokens=n,
            eos_token_id=None,
            pad_token_id=0,
        )
    ref_new = ref[:, t:].numpy()
    np.testing.assert_array_equal(np.asarray(out.tokens), ref_new)
    np.testing.assert_array_equal(np.asarray(out.lengths), [n] * 4)
    # The cache now holds prompt + all generated tokens of each row.
    np.testing.assert_array_equal(np.asarray(out.cache.lengths), [len(p) + n for p in prompts])


def test_sampled_logprobs_equal_teacher_forced_and_stop_tokens(hf_model):
    _, graphdef, params, sampler = hf_model
    prompts = _prompts([4, 9, 2, 6, 13], seed=1)
    compiles = sampler.num_compiles
    cfg = SamplingConfig(max_new_tokens=24, temperature=1.0)
    out = sampler(params, prompts, cfg, jax.random.key(3))
    toks, lps = np.asarray(out.tokens), np.asarray(out.logprobs)
    seqs = [p + list(toks[i]) for i, p in enumerate(prompts)]
    ref, _ = _teacher_forced(graphdef, params, seqs)
    for i, p in enumerate(prompts):
        np.testing.assert_allclose(lps[i], ref[i, len(p) : len(p) + 24], atol=1e-4)

    # Stop on the token row 0 produced at step 5: row 0 ends there (stop token kept), other
    # rows are unaffected unless they produced it too; same key -> same samples before stopping.
    stop = int(toks[0, 5])
    out2 = sampler(
        params,
        prompts,
        SamplingConfig(max_new_tokens=24, stop_token_ids=(stop,)),
        jax.random.key(3),
    )
    lengths = np.asarray(out2.lengths)
    for i in range(len(prompts)):
        hits = np.nonzero(toks[i] == stop)[0]
        expect = hits[0] + 1 if hits.size else 24
        assert lengths[i] == expect
        np.testing.assert_array_equal(np.asarray(out2.tokens)[i, :expect], toks[i, :expect])
        assert (np.asarray(out2.tokens)[i, expect:] == 0).all()
        assert (np.asarray(out2.logprobs)[i, expect:] == 0).all()
    assert sampler.num_compiles == compiles + 2  # two sampling configs, one shape bucket


def test_continuation_equals_fresh_prefill(hf_model):
    _, graphdef, params, sampler = hf_model
    prompts = _prompts([7, 3, 12], seed=2)
    greedy = SamplingConfig(max_new_tokens=6, greedy=True)
    turn1 = sampler(params, prompts, greedy, jax.random.key(0))
    gen1 = [list(np.asarray(turn1.tokens)[i]) for i in range(3)]
    obs = _prompts([5, 1, 9], seed=3)  # ragged environment observations
    history = [p + g + o for p, g, o in zip(prompts, gen1, obs)]

    # Next-token logits after appending the observation to the cache == fresh prefill.
    cache = turn1.cache
    t = max(map(len, obs))
    tokens = np.zeros((3, t), np.int32)
    segs = np.zeros((3, t), np.int32)
    for i, o in enumerate(obs):
        tokens[i, : len(o)], segs[i, : len(o)] = o, 1
    positions = np.asarray(cache.lengths)[:, None] + np.maximum(np.cumsum(segs, 1) - 1, 0)
    step = _apply(
        graphdef,
        params,
        jnp.asarray(tokens),
        jnp.asarray(positions),
        jnp.asarray(segs),
        cache=cache,
    )
    _, fresh_logits = _teacher_forced(graphdef, params, history)
    for i, o in enumerate(obs):
        np.testing.assert_allclose(
            np.asarray(step.logits)[i, len(o) - 1], fresh_logits[i, len(history[i]) - 1], atol=1e-4
        )

    # The sampler's continuation decodes exactly like a fresh call on the whole history.
    turn1 = sampler(params, prompts, greedy, jax.random.key(0))  # (the cache above was consumed)
    cont = sampler(
        params,
        obs,
        SamplingConfig(max_new_tokens=8, greedy=True),
        jax.random.key(1),
        cache=turn1.cache,
    )
    fresh = sampler(
        params, history, SamplingConfig(max_new_tokens=8, greedy=True), jax.random.key(1)
    )
    np.testing.assert_array_equal(np.asarray(cont.tokens), np.asarray(fresh.tokens))
    np.testing.assert_allclose(np.asarray(cont.logprobs), np.asarray(fresh.logprobs), atol=1e-4)

    # Rows with no new tokens are left alone: only row 1 continues.
    again = sampler(
        params,
        [[], [5, 6], []],
        SamplingConfig(max_new_tokens=8, greedy=True),
        jax.random.key(2),
        cache=cont.cache,
    )
    np.testing.assert_array_equal(np.asarray(again.lengths), [0, 8, 0])
    expect = [len(h) + 8 for h in history]
    expect[1] += 2 + 8
    np.testing.assert_array_equal(np.asarray(again.cache.lengths), expect)


def test_row_keys_make_a_split_batch_sample_like_the_whole(hf_model):
    # A multi-host rollout: each host samples its rows with their global row numbers. Four
    # rows at once and the same rows as two halves (rows 0-1, rows 2-3) must draw the same
    # tokens at temperature 1; without row ids the halves draw other tokens.
    _, _, params, sampler = hf_model
    prompts = _prompts([6, 9, 4, 7], seed=5)
    cfg = SamplingConfig(max_new_tokens=12, temperature=1.0)
    key = jax.random.key(3)
    whole = sampler(params, prompts, cfg, key, row_ids=[10, 11, 12, 13])
    lo = sampler(params, prompts[:2], cfg, key, row_ids=[10, 11])
    hi = sampler(params, prompts[2:], cfg, key, row_ids=[12, 13])
    split = np.concatenate([np.asarray(lo.tokens), np.asarray(hi.tokens)])
    np.testing.assert_array_equal(split, np.asarray(whole.tokens))
    np.testing.assert_allclose(
        np.concatenate([np.asarray(lo.logprobs), np.asarray(hi.logprobs)]),
        np.asarray(whole.logprobs),
        atol=1e-5,
    )
    plain = sampler(params, prompts[2:], cfg, key)  # one stream for the batch
    assert not np.array_equal(np.asarray(plain.tokens), np.asarray(whole.tokens)[2:])
    # a row's stream is its own: renumbering the other rows leaves row 0 unchanged
    other = sampler(params, prompts, cfg, key, row_ids=[10, 21, 22, 23])
    np.testing.assert_array_equal(np.asarray(other.tokens)[0], np.asarray(whole.tokens)[0])


def test_top_k_top_p_distribution():
    # 4 tokens with probabilities 0.5, 0.25, 0.15, 0.10.
    probs = np.array([0.5, 0.25, 0.15, 0.10])
    logits = jnp.tile(jnp.log(jnp.asarray(probs, jnp.float32)), (20000, 1))
    key = jax.random.key(0)
    for cfg, expect in [
        (SamplingConfig(), probs),
        (SamplingConfig(top_k=2), np.array([2 / 3, 1 / 3, 0, 0])),
        # nucleus 0.7: 0.5 + 0.25 reaches it; tokens 2 and 3 are cut. With top-k the nucleus
        # is taken on the renormalised top-k distribution (as HF warpers do): 0.5/0.9 + 0.25/0.9
        # = 0.83 covers 0.8 but not 0.9.
        (SamplingConfig(top_p=0.7), np.array([2 / 3, 1 / 3, 0, 0])),
        (SamplingConfig(top_k=3, top_p=0.8), np.array([2 / 3, 1 / 3, 0])),
        (SamplingConfig(top_k=3, top_p=0.9), np.array([0.5, 0.25, 0.15]) / 0.9),
    ]:
        tokens, lps = jax.jit(sample_tokens, static_argnums=2)(key, logits, cfg)
        freq = np.bincount(np.asarray(tokens), minlength=4) / 20000
        np.testing.assert_allclose(freq[: len(expect)], expect, atol=0.015)
        # log-probs are before filtering: log of the unfiltered probability
        np.testing.assert_allclose(np.asarray(lps), np.log(probs)[np.asarray(tokens)], atol=1e-5)


def test_bad_inputs_raise():
    graphdef, params = init_model(ModelConfig.test(max_seq_len=64), jax.random.key(0))
    sampler = Sampler(graphdef)
    with pytest.raises(ValueError, match="temperature"):
        SamplingConfig(temperature=0.0)
    with pytest.raises(ValueError, match="outside"):
        sampler(params, [[1, 500]], SamplingConfig(max_new_tokens=4), jax.random.key(0))
    with pytest.raises(ValueError, match="max_seq_len"):
        sampler(params, [[1, 2]], SamplingConfig(max_new_tokens=100), jax.random.key(0))
    with pytest.raises(ValueError, match="every row is empty"):
        sampler(params, [[], []], SamplingConfig(max_new_tokens=4), jax.random.key(0))


@pytest.mark.parametrize("layout", ["row_major", "output_major"])
def test_qwen_style_fused_decode_matches_teacher_forcing(layout):
    # QKV bias + tied embeddings exercise the fused q/k/v kernel and the hoisted head, in
    # both decode layouts (row-major [in, out] and output-major [out, in] kernels).
    cfg = ModelConfig.test(qkv_bias=True, tie_embeddings=True, model_type="qwen2")
    graphdef, params = init_model(cfg, jax.random.key(5))
    keys = iter(jax.random.split(jax.random.key(6), 8))
    for layer in ("layer_0", "layer_1"):
        for name in ("q_bias", "k_bias", "v_bias"):
            attn = params[layer]["attn"]
            attn[name] = 0.5 * jax.random.normal(next(keys), attn[name].shape)
    prompts = _prompts([3, 8], seed=7)
    cfg_s = SamplingConfig(max_new_tokens=10)
    out = Sampler(graphdef, decode_layout=layout)(params, prompts, cfg_s, jax.random.key(8))
    plain = Sampler(graphdef, fuse_weights=False)(params, prompts, cfg_s, jax.random.key(8))
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(plain.tokens))
    seqs = [p + list(np.asarray(out.tokens)[i]) for i, p in enumerate(prompts)]
    ref, _ = _teacher_forced(graphdef, params, seqs)
    for i, p in enumerate(prompts):
        np.testing.assert_allclose(
            np.asarray(out.logprobs)[i], ref[i, len(p) : len(p) + 10], atol=1e-4
        )


def test_output_major_decode_keeps_kernels_per_params_version():
    """Output-major decode kernels are built once per parameter version: reused across calls
    (turns) with the same params, rebuilt when params change; a continued multi-turn cache
    gives the same tokens and log-probs as the row-major layout."""
    graphdef, params = init_model(ModelConfig.test(), jax.random.key(0))
    om = Sampler(graphdef, decode_layout="output_major")
    rm = Sampler(graphdef, decode_layout="row_major")
    prompts, obs = _prompts([5, 9, 3], seed=1), _prompts([2, 4, 1], seed=2)
    cfg = SamplingConfig(max_new_tokens=6)
    outs = {}
    for name, sampler in (("om", om), ("rm", rm)):
        first = sampler(params, prompts, cfg, jax.random.key(3))
        toks = np.asarray(first.tokens)
        second = sampler(params, obs, cfg, jax.random.key(4), cache=first.cache)
        outs[name] = (toks, np.asarray(second.tokens), np.asarray(second.logprobs))
    for a, b in zip(outs["om"], outs["rm"]):
        np.testing.assert_allclose(a, b, atol=1e-5)
    kept = om._prepared[1]
    om(params, prompts, cfg, jax.random.key(5))
    assert om._prepared[1] is kept  # same params arrays: not rebuilt
    new_params = jax.tree.map(lambda x: x * 1.01, params)
    om(new_params, prompts, cfg, jax.random.key(5))
    assert om._prepared[1] is not kept
    np.testing.assert_allclose(
        np.asarray(om._prepared[1]["lm_head_t"]), np.asarray(new_params["lm_head"]).T, rtol=1e-6
    )
    om.release()
    assert om._prepared is None and rm._prepared is None  # row-major keeps nothing
    with pytest.raises(ValueError, match="decode_layout"):
        Sampler(graphdef, decode_layout="column")
    # "auto" on CPU: output-major only for models too big for cache, at small batch.
    auto = Sampler(graphdef)
    big = {"w": jax.ShapeDtypeStruct((16 * 2**20,), jnp.float32)}  # 64 MiB
    assert not auto.output_major(params, 8)
    assert auto.output_major(big, 8) and not auto.output_major(big, 64)
