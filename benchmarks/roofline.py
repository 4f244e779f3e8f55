"""The arithmetic of a dense decoder, shared by the benchmarks.

A benchmark's throughput means little without the best figure the machine allows for the
same work. ``machine_peaks`` reads this machine's fp32 matmul rate and copy bandwidth from the one
probe, ``jaxagent.perf.roofline.measure_cpu_peaks``; the ``*_flops`` functions count the
multiply-adds a Llama-style decoder must do (the embedding is a gather and costs none).
``ceiling_s`` turns both into the least time a piece of work can take:
``max(flops / peak, bytes / bandwidth)``.
"""

from __future__ import annotations

from jaxagent.perf.roofline import measure_cpu_peaks


def machine_peaks(reps: int = 20) -> dict:
    """``{"matmul_flop_s", "copy_bytes_s"}``: the best of ``reps`` probes of each."""
    flop_s, copy_s = measure_cpu_peaks(reps)
    return {"matmul_flop_s": flop_s, "copy_bytes_s": copy_s}


def layer_params(hidden: int, heads: int, kv_heads: int, mlp: int, head_dim: int) -> int:
    """Weights of one block's matmuls: q/k/v/o projections and the SwiGLU MLP."""
    return hidden * head_dim * (2 * heads + 2 * kv_heads) + 3 * hidden * mlp


def decoder_shape(
    *, layers: int, hidden: int, heads: int, kv_heads: int, mlp: int, head_dim: int, vocab: int
) -> dict:
    """The model arguments of ``forward_flops`` for a Llama-style decoder."""
    return dict(
        layers=layers,
        layer_p=layer_params(hidden, heads, kv_heads, mlp, head_dim),
        hidden=hidden,
        vocab=vocab,
        heads=heads,
        head_dim=head_dim,
    )


def forward_flops(
    *,
    layers: int,
    layer_p: int,
    hidden: int,
    vocab: int,
    heads: int,
    head_dim: int,
    tokens: int,
    mean_context: float,
    head_positions: int,
) -> float:
    """One forward pass over ``tokens`` tokens, each attending ``mean_context`` keys on
    average, with vocabulary logits at ``head_positions`` positions."""
    attention = 4 * layers * heads * head_dim * mean_context * tokens
    return 2 * layers * layer_p * tokens + attention + 2 * hidden * vocab * head_positions


def ceiling_s(flops: float, nbytes: float, peaks: dict) -> float:
    """Least time for work of ``flops`` and ``nbytes`` of memory traffic at the peaks."""
    return max(flops / peaks["matmul_flop_s"], nbytes / peaks["copy_bytes_s"])
