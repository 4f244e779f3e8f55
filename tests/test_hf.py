"""Parity of jaxagent's Flax LM with transformers' PyTorch Llama / Qwen2 (random tiny weights)."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from jaxagent.models import apply_model, load_hf, save_hf
from jaxagent.models.hf import _hf_layout

V = 96


def _llama(tmp_path, rope=None, max_shard_size="5GB", **kw):
    cfg = transformers.LlamaConfig(
        vocab_size=V,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=96,
        max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "rope_theta": 5000.0, **(rope or {})},
        attn_implementation="eager",
        **kw,
    )
    return _save(transformers.LlamaForCausalLM(cfg), tmp_path, max_shard_size)


def _qwen2(tmp_path):
    cfg = transformers.Qwen2Config(
        vocab_size=V,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=96,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        use_sliding_window=False,
        attn_implementation="eager",
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    )
    model = transformers.Qwen2ForCausalLM(cfg)
    with torch.no_grad():  # HF initialises biases to zero; make them matter
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0.0, 0.5)
    return _save(model, tmp_path, "5GB")


def _save(model, tmp_path, max_shard_size):
    torch.manual_seed(0)
    model = model.eval()
    path = str(tmp_path / "hf")
    model.save_pretrained(path, safe_serialization=True, max_shard_size=max_shard_size)
    return model, path


def _batch(batch=3, length=14, seed=0):
    """Tokens with left padding: row 1 has 4 pads, row 2 has 9."""
    tokens = np.random.RandomState(seed).randint(0, V, (batch, length))
    mask = np.ones((batch, length), np.int64)
    mask[1, :4] = 0
    mask[2, :9] = 0
    positions = np.maximum(np.cumsum(mask, 1) - 1, 0)
    return tokens, mask, positions


def _torch_logits(model, tokens, mask, positions):
    with torch.no_grad():
        return (
            model(
                input_ids=torch.tensor(tokens),
                attention_mask=torch.tensor(mask),
                position_ids=torch.tensor(positions),
            )
            .logits.float()
            .numpy()
        )


def _ours(graphdef, params, tokens, mask, positions):
    out = apply_model(
        graphdef, params, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask, jnp.int32)
    )
    return np.asarray(out.logits)


def _max_diff(a, b, mask):
    return float((np.abs(a - b) * mask[..., None]).max())


@pytest.mark.parametrize("scan_layers", [False, True])
def test_llama_gqa_sharded_left_padded_parity_and_export_roundtrip(tmp_path, scan_layers):
    model, path = _llama(tmp_path, max_shard_size="60KB")
    assert os.path.exists(os.path.join(path, "model.safetensors.index.json"))
    config, graphdef, params = load_hf(path, scan_layers=scan_layers)
    assert config.scan_layers == scan_layers and ("blocks" in params) == scan_layers
    assert (config.num_heads, config.num_kv_heads, config.tie_embeddings) == (4, 2, False)
    tokens, mask, positions = _batch()
    ref = _torch_logits(model, tokens, mask, positions)
    ours = _ours(graphdef, params, tokens, mask, positions)
    assert _max_diff(ours, ref, mask) <= 1e-4

    out = str(tmp_path / "export")
    save_hf(out, config, graphdef, params, max_shard_size="60KB")
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
    again = _torch_logits(reloaded.eval(), tokens, mask, positions)
    np.testing.assert_array_equal(again, ref)  # export -> reload: identical logits


@pytest.mark.parametrize("scan_layers", [False, True])
def test_qwen2_qkv_bias_tied_embeddings_parity_and_export(tmp_path, scan_layers):
    model, path = _qwen2(tmp_path)
    config, graphdef, params = load_hf(path, scan_layers=scan_layers)
    assert config.qkv_bias and config.tie_embeddings and "lm_head" not in params
    tokens, mask, positions = _batch(seed=1)
    ref = _torch_logits(model, tokens, mask, positions)
    assert _max_diff(_ours(graphdef, params, tokens, mask, positions), ref, mask) <= 1e-4
    out = str(tmp_path / "export")
    save_hf(out, config, graphdef, params)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
    assert isinstance(reloaded, transformers.Qwen2ForCausalLM)
    np.testing.assert_array_equal(_torch_logits(reloaded.eval(), tokens, mask, positions), ref)


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "linear", "factor": 4.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
    ],
)
def test_rope_scaling_parity(tmp_path, rope):
    model, path = _llama(tmp_path, rope=rope)
    config, graphdef, params = load_hf(path)
    assert config.rope_type == rope["rope_type"]
    tokens, mask, positions = _batch(length=40, seed=2)
    positions = positions + 60 * mask  # beyond the original context, where scaling matters
    ref = _torch_logits(model, tokens, mask, positions)
    assert _max_diff(_ours(graphdef, params, tokens, mask, positions), ref, mask) <= 1e-4


def test_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_hf(str(tmp_path))
    model, path = _llama(tmp_path)
    with open(os.path.join(path, "config.json")) as fh:
        hf = json.load(fh)

    def write(cfg):
        with open(os.path.join(path, "config.json"), "w") as fh:
            json.dump(cfg, fh)

    write({**hf, "model_type": "gpt2"})
    with pytest.raises(ValueError, match="model_type='gpt2'"):
        load_hf(path)
    write({**hf, "intermediate_size": 100})
    with pytest.raises(
        ValueError, match=r"mlp.gate_proj.weight .*\(96, 64\), expected \(100, 64\)"
    ):
        load_hf(path)
    write(hf)
    os.remove(os.path.join(path, "model.safetensors"))
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        load_hf(path)


def test_layout_covers_every_parameter():
    from jaxagent.models import ModelConfig, init_model
    import jax

    for config in (
        ModelConfig.test(),
        ModelConfig.test(qkv_bias=True, tie_embeddings=True),
        ModelConfig.test(qkv_bias=True, scan_layers=True),
    ):
        _, params = init_model(config, jax.random.key(0))
        mapped = {"/".join(t) for t, _, _, _ in _hf_layout(config).values()}
        flat = {
            "/".join(str(k.key) for k in path)
            for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]
        }
        assert mapped == flat


@pytest.mark.parametrize(
    "rope",
    [
        None,
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    ],
)
def test_export_config_reads_the_same_in_transformers_4_and_5_forms(tmp_path, rope):
    """An exported config.json carries both spellings of RoPE and dtype: the transformers-5
    ``rope_parameters``/``dtype`` and the 4.x ``rope_theta``/``rope_scaling``/``torch_dtype``.
    Each form alone gives the same model, and transformers 5 reads the file as written."""
    _, path = _llama(tmp_path, rope=rope)
    config, graphdef, params = load_hf(path)
    out = str(tmp_path / "export")
    save_hf(out, config, graphdef, params)
    with open(os.path.join(out, "config.json")) as fh:
        written = json.load(fh)
    assert written["rope_theta"] == 5000.0
    assert written["torch_dtype"] == written["dtype"] == "float32"
    if rope is None:
        assert written["rope_scaling"] is None
    else:
        assert written["rope_scaling"]["type"] == written["rope_scaling"]["rope_type"] == "llama3"
        assert written["rope_scaling"]["factor"] == 8.0
    # Each form alone (what a 4.x reader sees / what a 5.x-only writer leaves) is the same model.
    v4 = {k: v for k, v in written.items() if k not in ("rope_parameters", "dtype")}
    v5 = {
        k: v for k, v in written.items() if k not in ("rope_theta", "rope_scaling", "torch_dtype")
    }
    from jaxagent.models.hf_config import config_from_hf

    assert config_from_hf(v4) == config_from_hf(v5) == config
    reread = transformers.AutoConfig.from_pretrained(out)
    expect = {"rope_type": "default", "rope_theta": 5000.0, **(rope or {})}
    assert {k: reread.rope_parameters[k] for k in expect} == expect
