"""Prefill memory: the compiled sampler's temporaries with and without chunked prefill.

A prompt prefilled in one call builds [rows, heads, prompt, capacity] float32 attention
scores: four times the memory per doubling of the prompt. ``SamplingConfig.prefill_chunk``
writes it into the KV cache ``chunk`` tokens at a time (each chunk attending to the cache
written so far), so the scores are [rows, heads, chunk, capacity]: twice per doubling.

Nothing runs on the device: each figure is ``Sampler.lower(...).compile().memory_analysis()
.temp_size_in_bytes`` of the sampler call (prefill plus a one-token decode) for ``rows``
prompts of each length, random weights. Prints the setup, the figures and their ratios per
doubling, and one JSON line at the end.

    python benchmarks/prefill_memory.py                       # 8 rows, 1k/2k/4k, chunk 512
    python benchmarks/prefill_memory.py --lengths 1024 2048 4096 8192 --chunk 256
    python benchmarks/prefill_memory.py --time     # also the wall time of each call (runs it)
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import jax

from jaxagent.generate import Sampler, SamplingConfig
from jaxagent.models import ModelConfig, init_model

GIB = 2**30


def temp_bytes(sampler, params, rows: int, length: int, chunk: int) -> int:
    cfg = SamplingConfig(max_new_tokens=1, greedy=True, prefill_chunk=chunk)
    prompts = [[1] * length] * rows
    lowered = sampler.lower(params, prompts, cfg, jax.random.key(0))
    return int(lowered.compile().memory_analysis().temp_size_in_bytes)


def wall_s(sampler, params, rows: int, length: int, chunk: int) -> float:
    """Seconds of one call (prefill plus one token), after a compiling call."""
    cfg = SamplingConfig(max_new_tokens=1, greedy=True, prefill_chunk=chunk)
    prompts = [[1] * length] * rows
    jax.block_until_ready(sampler(params, prompts, cfg, jax.random.key(0)).tokens)
    t0 = time.perf_counter()
    jax.block_until_ready(sampler(params, prompts, cfg, jax.random.key(0)).tokens)
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096])
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--time", action="store_true", help="also run each call and time it")
    args = ap.parse_args()

    cfg = ModelConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=args.heads,
        num_kv_heads=args.kv_heads,
        head_dim=args.hidden // args.heads,
        intermediate_size=4 * args.hidden,
        max_seq_len=2 * max(args.lengths),
    )
    graphdef, params = init_model(cfg, jax.random.key(0))
    print(
        f"setup: backend={jax.default_backend()} machine={platform.machine()} "
        f"jax={jax.__version__} rows={args.rows} chunk={args.chunk} model=D{cfg.hidden_size} "
        f"L{cfg.num_layers} H{cfg.num_heads}/KV{cfg.num_kv_heads} hd{cfg.head_dim} "
        f"V{cfg.vocab_size} dtype={cfg.dtype}"
    )
    sampler = Sampler(graphdef)
    results = {"rows": args.rows, "chunk": args.chunk, "lengths": args.lengths}
    for name, chunk in (("chunked", args.chunk), ("one_call", 0)):
        figures = [temp_bytes(sampler, params, args.rows, n, chunk) for n in args.lengths]
        ratios = [b / a for a, b in zip(figures, figures[1:])]
        print(
            f"{name:>9}: temp GiB "
            + " / ".join(f"{n}: {b / GIB:.3f}" for n, b in zip(args.lengths, figures))
            + "  ratio per doubling "
            + " ".join(f"{r:.2f}x" for r in ratios)
        )
        results[name] = {"temp_bytes": figures, "ratios": [round(r, 3) for r in ratios]}
        if args.time:
            secs = [wall_s(sampler, params, args.rows, n, chunk) for n in args.lengths]
            print(
                f"{name:>9}: wall s "
                + " / ".join(f"{n}: {s:.2f}" for n, s in zip(args.lengths, secs))
            )
            results[name]["wall_s"] = [round(s, 3) for s in secs]
    print(json.dumps(results))


if __name__ == "__main__":
    main()
