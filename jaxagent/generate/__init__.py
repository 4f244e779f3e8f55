"""Jitted batched sampling with a per-row-length KV cache (prefill + while_loop decode)."""

from jaxagent.generate.sampler import SampleOutput, Sampler
from jaxagent.generate.sampling import SamplingConfig, sample_tokens

__all__ = ["SampleOutput", "Sampler", "SamplingConfig", "sample_tokens"]
