"""Flax NNX decoder LMs (Llama / Qwen2 family), KV cache, HF checkpoint import/export."""

from jaxagent.models.api import (
    ModelOutput,
    abstract_graphdef,
    abstract_params,
    apply_model,
    init_model,
    model_config,
    param_logical_axes,
    stack_layers,
    token_logprobs,
    token_logprobs_and_entropy,
    token_values,
    unstack_layers,
)
from jaxagent.models.cache import KVCache, grow_cache, init_cache
from jaxagent.models.config import ModelConfig
from jaxagent.models.hf import load_hf, load_tokenizer, save_hf

__all__ = [
    "KVCache",
    "ModelConfig",
    "ModelOutput",
    "abstract_graphdef",
    "abstract_params",
    "apply_model",
    "grow_cache",
    "init_cache",
    "init_model",
    "load_hf",
    "load_tokenizer",
    "save_hf",
    "model_config",
    "param_logical_axes",
    "stack_layers",
    "token_logprobs",
    "token_logprobs_and_entropy",
    "token_values",
    "unstack_layers",
]
