"""Hugging Face ``config.json`` <-> ``ModelConfig`` for the Llama and Qwen2 families.

``config_from_hf`` reads both transformers-4 and -5 spellings of the RoPE settings;
``config_to_hf`` builds the transformers config object ``save_hf`` writes, and
``_add_legacy_keys`` adds the transformers-4 keys beside it so every release reads the same
model. Re-exported by ``jaxagent.models.hf``.
"""

from __future__ import annotations

import json
from typing import Any

from jaxagent.models.config import ModelConfig

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")


def config_from_hf(hf: dict, **overrides) -> ModelConfig:
    """ModelConfig from a parsed HF ``config.json`` dict (plus overrides such as dtypes)."""
    model_type = hf.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"config.json model_type={model_type!r} is not supported; "
            f"jaxagent loads {SUPPORTED_MODEL_TYPES}"
        )
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"config.json hidden_act={hf['hidden_act']!r}; only 'silu' is supported")
    if hf.get("mlp_bias"):
        raise ValueError("config.json mlp_bias=true is not supported (Llama MLPs have no bias)")
    if hf.get("use_sliding_window"):
        raise ValueError("config.json use_sliding_window=true is not supported; set it to false")
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    theta = rope.pop("rope_theta", None) or hf.get("rope_theta", 10000.0)
    if "type" in rope:  # the transformers-4 name; 4.x writes it beside (or instead of) rope_type
        kind = rope.pop("type")
        rope.setdefault("rope_type", kind)
    if rope.get("rope_type", "default") == "default":
        rope = {}
    heads = hf["num_attention_heads"]
    kwargs: dict[str, Any] = dict(
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        intermediate_size=hf["intermediate_size"],
        rope_theta=float(theta),
        rope_scaling=tuple(sorted(rope.items())) or None,
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        qkv_bias=True if model_type == "qwen2" else bool(hf.get("attention_bias", False)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        max_seq_len=int(hf.get("max_position_embeddings", 2048)),
        model_type=model_type,
        bos_token_id=_first(hf.get("bos_token_id")),
        eos_token_id=_first(hf.get("eos_token_id")),
        pad_token_id=_first(hf.get("pad_token_id")),
    )
    kwargs.update(overrides)
    return ModelConfig(**kwargs)


def _first(x):
    return x[0] if isinstance(x, (list, tuple)) and x else x


def config_to_hf(config: ModelConfig):
    """A transformers config object (LlamaConfig / Qwen2Config) for ``config``."""
    import transformers

    rope = {"rope_type": "default", **config.rope_scaling_dict, "rope_theta": config.rope_theta}
    common = dict(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        intermediate_size=config.intermediate_size,
        rms_norm_eps=config.rms_norm_eps,
        tie_word_embeddings=config.tie_embeddings,
        max_position_embeddings=config.max_seq_len,
        rope_parameters=rope,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        dtype=config.param_dtype,
    )
    if config.model_type == "qwen2":
        if config.head_dim * config.num_heads != config.hidden_size or not config.qkv_bias:
            raise ValueError(
                "save_hf: Qwen2 needs head_dim * num_heads == hidden_size and "
                "qkv_bias=True; export as model_type='llama' instead"
            )
        return transformers.Qwen2Config(**common, use_sliding_window=False)
    return transformers.LlamaConfig(
        **common, head_dim=config.head_dim, attention_bias=config.qkv_bias, mlp_bias=False
    )


def _add_legacy_keys(config_path: str) -> None:
    """Write the transformers-4 spellings of the RoPE and dtype settings beside the
    transformers-5 ones, so every release that reads the checkpoint sees the same model.

    transformers 5 writes ``rope_parameters`` (theta inside) and ``dtype``; 4.x reads the
    top-level ``rope_theta``, ``rope_scaling`` (``None`` for plain RoPE, with the older ``type``
    key beside ``rope_type``) and ``torch_dtype``, and would silently use theta 10000 and no
    scaling without them. transformers 5 reads ``rope_scaling`` first when present, so both
    keys must describe the same RoPE.
    """
    with open(config_path) as fh:
        hf = json.load(fh)
    rope = dict(hf.get("rope_parameters") or {})
    hf["rope_theta"] = rope.pop("rope_theta", hf.get("rope_theta", 10000.0))
    kind = rope.get("rope_type", "default")
    hf["rope_scaling"] = None if kind == "default" else {**rope, "type": kind}
    if "dtype" in hf and "torch_dtype" not in hf:
        hf["torch_dtype"] = hf["dtype"]
    with open(config_path, "w") as fh:
        json.dump(hf, fh, indent=2, sort_keys=True)
        fh.write("\n")
