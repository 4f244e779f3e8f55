"""Model configuration for the Llama / Qwen2 decoder family.

Every field is static: changing any of them changes parameter shapes or the traced program,
so a ``ModelConfig`` is hashable and travels inside the NNX graphdef.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import jax.numpy as jnp

from jaxagent.models.blockwise import KERNELS

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def _dtype_name(value: Any, field: str) -> str:
    name = value if isinstance(value, str) else jnp.dtype(value).name
    if name not in _DTYPES:
        raise ValueError(
            f"ModelConfig.{field}={value!r} is not supported; use one of {sorted(_DTYPES)}"
        )
    return name


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Architecture of a decoder-only LM (Llama / Qwen2 family)."""

    vocab_size: int  # number of token ids
    hidden_size: int  # model width D
    num_layers: int  # transformer blocks L
    num_heads: int  # query heads H
    num_kv_heads: int  # key/value heads K (GQA when K < H); H % K == 0
    head_dim: int  # per-head width (often D // H)
    intermediate_size: int  # SwiGLU width F
    rope_theta: float = 10000.0  # RoPE base wavelength
    # RoPE scaling as sorted (key, value) pairs, e.g. (("factor", 2.0), ("rope_type", "linear"));
    # None means plain RoPE. Use ``rope_scaling_dict`` to read it.
    rope_scaling: Optional[tuple[tuple[str, Any], ...]] = None
    rms_norm_eps: float = 1e-6  # RMSNorm epsilon
    qkv_bias: bool = False  # Qwen2 has biases on q/k/v projections
    tie_embeddings: bool = False  # lm head reuses the embedding matrix
    param_dtype: str = "float32"  # storage dtype of parameters
    dtype: str = "float32"  # activation / matmul dtype (logits are always float32)
    kv_cache_dtype: str = ""  # the sampler's KV cache; "" = ``dtype``
    value_head: bool = False  # add a scalar value head on the final hidden state (PPO critic)
    # Blocks as one stacked module run by jax.lax.scan: trace and compile time independent of
    # depth (params under "blocks" with a leading layer axis instead of layer_0 .. layer_{L-1};
    # HF import / export is unchanged).
    scan_layers: bool = False
    # Attention over rows longer than ``blockwise.BLOCK`` tokens in the no-cache (training)
    # pass: "blockwise", pure-JAX flash tiles on every backend; "splash", JAX's Pallas
    # splash-attention kernel for TPU (compiled for TPU ahead of time and checked in the
    # Pallas interpreter here; not yet run on a chip); "cudnn", cuDNN's fused flash
    # attention on NVIDIA GPUs (``jax.nn.dot_product_attention``; compiled for H100 ahead
    # of time); "auto", cuDNN on GPU, splash on TPU, blockwise elsewhere, by the platform
    # the program is compiled for.
    attention: str = "blockwise"
    max_seq_len: int = 2048  # longest position the model is meant for (HF max_position_embeddings)
    model_type: str = "llama"  # HF family used when exporting: "llama" or "qwen2"
    bos_token_id: Optional[int] = None
    eos_token_id: Optional[int] = None
    pad_token_id: Optional[int] = None

    def __post_init__(self):
        for name in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "intermediate_size",
            "max_seq_len",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelConfig.{name}={value!r} must be a positive int")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"ModelConfig.num_heads={self.num_heads} must be a multiple of "
                f"num_kv_heads={self.num_kv_heads}; pick num_kv_heads dividing num_heads"
            )
        if self.attention not in KERNELS:
            raise ValueError(
                f"ModelConfig.attention={self.attention!r}; use one of {KERNELS} "
                "('splash': the Pallas kernel for TPU; 'cudnn': cuDNN on NVIDIA GPUs; "
                "'auto': by platform)"
            )
        if self.model_type not in ("llama", "qwen2"):
            raise ValueError(f"ModelConfig.model_type={self.model_type!r}; use 'llama' or 'qwen2'")
        object.__setattr__(self, "param_dtype", _dtype_name(self.param_dtype, "param_dtype"))
        object.__setattr__(self, "dtype", _dtype_name(self.dtype, "dtype"))
        if self.kv_cache_dtype:
            name = _dtype_name(self.kv_cache_dtype, "kv_cache_dtype")
            object.__setattr__(self, "kv_cache_dtype", name)
        if isinstance(self.rope_scaling, dict):
            object.__setattr__(self, "rope_scaling", tuple(sorted(self.rope_scaling.items())))
        if self.rope_scaling is not None:
            rope_type = self.rope_type
            if rope_type not in ROPE_TYPES:
                raise ValueError(
                    f"ModelConfig.rope_scaling rope_type={rope_type!r} is not supported; "
                    f"supported: {ROPE_TYPES}"
                )
            scaling = self.rope_scaling_dict
            if rope_type != "default" and "factor" not in scaling:
                raise ValueError(f"ModelConfig.rope_scaling for {rope_type!r} needs a 'factor'")

    @property
    def rope_scaling_dict(self) -> dict:
        return dict(self.rope_scaling or ())

    @property
    def rope_type(self) -> str:
        scaling = self.rope_scaling_dict
        return scaling.get("rope_type", scaling.get("type", "default"))

    @property
    def jnp_dtype(self):
        return _DTYPES[self.dtype]

    @property
    def jnp_param_dtype(self):
        return _DTYPES[self.param_dtype]

    @property
    def jnp_kv_cache_dtype(self):
        return _DTYPES[self.kv_cache_dtype or self.dtype]

    @property
    def num_groups(self) -> int:
        return self.num_heads // self.num_kv_heads

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    # Presets (gemma-style classmethods). Overrides win.
    @classmethod
    def tiny(cls, **overrides) -> "ModelConfig":
        """The benchmark's tiny model: vocab 8192, D 256, 4 layers, 4 heads, 2 KV heads."""
        base = dict(
            vocab_size=8192,
            hidden_size=256,
            num_layers=4,
            num_heads=4,
            num_kv_heads=2,
            head_dim=64,
            intermediate_size=688,
            max_seq_len=2048,
        )
        return cls(**{**base, **overrides})

    @classmethod
    def test(cls, **overrides) -> "ModelConfig":
        """A very small model for unit tests (vocab 128, D 64, 2 layers, GQA 4:2)."""
        base = dict(
            vocab_size=128,
            hidden_size=64,
            num_layers=2,
            num_heads=4,
            num_kv_heads=2,
            head_dim=16,
            intermediate_size=96,
            max_seq_len=512,
        )
        return cls(**{**base, **overrides})

    @classmethod
    def base_768(cls, **overrides) -> "ModelConfig":
        """768 hidden x 12 layers, vocab 32000 (about 134M parameters, untied)."""
        base = dict(
            vocab_size=32000,
            hidden_size=768,
            num_layers=12,
            num_heads=12,
            num_kv_heads=12,
            head_dim=64,
            intermediate_size=2048,
            max_seq_len=2048,
        )
        return cls(**{**base, **overrides})

    @classmethod
    def qwen2_0_5b(cls, **overrides) -> "ModelConfig":
        """Qwen2.5-0.5B shapes (QKV bias, tied embeddings)."""
        base = dict(
            vocab_size=151936,
            hidden_size=896,
            num_layers=24,
            num_heads=14,
            num_kv_heads=2,
            head_dim=64,
            intermediate_size=4864,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
            qkv_bias=True,
            tie_embeddings=True,
            max_seq_len=32768,
            model_type="qwen2",
        )
        return cls(**{**base, **overrides})
