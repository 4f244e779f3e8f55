"""Rotary position embeddings with the scaling types HF Llama / Qwen2 configs use.

The inverse frequencies are computed once in numpy at trace time (they are constants of the
config), mirroring ``transformers.modeling_rope_utils`` in float32 so logits match HF.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.models.config import ModelConfig


def rope_frequencies(config: ModelConfig) -> tuple[np.ndarray, float]:
    """Inverse frequencies [head_dim // 2] float32 and the cos/sin scale (attention factor)."""
    dim = config.head_dim
    base = config.rope_theta
    inv_freq = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim))
    inv_freq = inv_freq.astype(np.float32)
    scaling = config.rope_scaling_dict
    rope_type = config.rope_type
    if rope_type == "default":
        return inv_freq, 1.0
    factor = float(scaling["factor"])
    if rope_type == "linear":
        return (inv_freq / np.float32(factor)).astype(np.float32), 1.0
    if rope_type == "llama3":
        return _llama3(inv_freq, factor, scaling), 1.0
    if rope_type == "yarn":
        return _yarn(config, factor, scaling)
    raise ValueError(f"rope_type={rope_type!r} is not supported")


def _llama3(inv_freq: np.ndarray, factor: float, scaling: dict) -> np.ndarray:
    low_freq_factor = float(scaling["low_freq_factor"])
    high_freq_factor = float(scaling["high_freq_factor"])
    old_context_len = float(scaling["original_max_position_embeddings"])
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = (2 * math.pi / inv_freq).astype(np.float32)
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / np.float32(factor), inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / np.float32(factor) + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def _yarn(config: ModelConfig, factor: float, scaling: dict) -> tuple[np.ndarray, float]:
    dim, base = config.head_dim, config.rope_theta
    original = float(scaling.get("original_max_position_embeddings", config.max_seq_len))

    def get_mscale(scale, mscale=1.0):
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
        else:
            attention_factor = get_mscale(factor)
    beta_fast = scaling.get("beta_fast") or 32
    beta_slow = scaling.get("beta_slow") or 1

    def correction_dim(num_rotations):
        return (dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    pos_freqs = (base ** (np.arange(0, dim, 2).astype(np.float32) / dim)).astype(np.float32)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (np.float32(factor) * pos_freqs)
    extra_factor = (1 - ramp).astype(np.float32)
    inv_freq = interpolation * (1 - extra_factor) + extrapolation * extra_factor
    return inv_freq.astype(np.float32), float(attention_factor)


def rope_cos_sin(config: ModelConfig, positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """cos, sin of shape [B, T, head_dim] (halves repeated, HF layout) for int positions [B, T]."""
    inv_freq, scale = rope_frequencies(config)
    freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [B, T, hd/2]
    emb = jnp.concatenate([freqs, freqs], axis=-1)  # [B, T, hd]
    return jnp.cos(emb) * scale, jnp.sin(emb) * scale


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate x [B, T, N, hd] by cos/sin [B, T, hd] (rotate-half convention of HF Llama)."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    return (x.astype(jnp.float32) * cos + rotated.astype(jnp.float32) * sin).astype(x.dtype)
