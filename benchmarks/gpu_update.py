"""One LOOP update of a >= 1B HF-shaped random model: tokens/s, MFU and peak memory.

The default shape is Llama-3.2-1B's (vocab 128256, hidden 2048, 16 layers, 32 heads, 8 KV
heads, MLP 8192, tied embeddings: 1.24B parameters), fp32 parameters and Adam moments, bf16
activations, full fine-tuning (no LoRA), block remat and the chunked vocabulary head
(``model_logprob_fn(skip_unmasked_chunks=True)``, the trainer's learner pass). The batch is
``--rows`` episodes padded to ``--len`` tokens, each between half and all of ``--len`` long,
the second half of each episode carrying the loss; groups of 4 for LOOP's leave-one-out
baseline.

MFU follows the 6 * N * tokens convention: N all parameters (the tied embedding is the
vocabulary head's matmul), tokens the unpadded ones (padding is work, not progress), against
the chip's bf16 peak from ``jaxagent.perf.roofline.CHIP_PEAKS`` (on CPU: the fp32 matmul peak
measured now). Peak memory is ``jax.devices()[0].memory_stats()["peak_bytes_in_use"]`` (null
on backends that do not report it). Median of ``--steps`` updates after a compile step.
Ends with one JSON line.

    python benchmarks/gpu_update.py                                   # the 1.24B shape
    python benchmarks/gpu_update.py --layers 2 --hidden 256 --rows 4 --len 64   # CPU smoke
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.models import ModelConfig, init_model
from jaxagent.perf.roofline import device_peaks
from jaxagent.rl.recipes import get_recipe
from jaxagent.rl.train_state import TrainState
from jaxagent.rl.update import make_update_step
from jaxagent.rl.model_fns import model_logprob_fn
from jaxagent.types import TokenBatch


def model_config(args) -> ModelConfig:
    heads = max(1, args.hidden // 64)
    return ModelConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=heads,
        num_kv_heads=max(1, heads // 4),
        head_dim=64,
        intermediate_size=4 * args.hidden,
        rope_theta=500000.0,
        tie_embeddings=True,
        max_seq_len=max(2048, args.len),
        param_dtype="float32",
        dtype=args.dtype,
    )


def make_batch(rows: int, t: int, vocab: int, seed: int = 0) -> TokenBatch:
    """Right-padded episodes of t/2..t tokens; the second half of each carries the loss."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(t // 2, t + 1, rows)
    ar = np.arange(t)[None]
    seg = (ar < lengths[:, None]).astype(np.int32)
    mask = ((ar >= lengths[:, None] // 2) & (seg > 0)).astype(np.float32)
    return TokenBatch(
        tokens=jnp.asarray(rng.integers(0, vocab, (rows, t)), jnp.int32),
        positions=jnp.asarray(np.broadcast_to(ar, (rows, t)) * seg, jnp.int32),
        segment_ids=jnp.asarray(seg),
        loss_mask=jnp.asarray(mask),
        old_logprobs=jnp.asarray(-np.log(vocab) * mask, jnp.float32),
        advantages=jnp.zeros((rows, t), jnp.float32),
        rewards=jnp.asarray(rng.random(rows), jnp.float32),
        group_ids=jnp.asarray(np.arange(rows) // 4, jnp.int32),
        turn_ids=jnp.asarray(np.where(mask > 0, 0, -1), jnp.int32),
    )


def peak_bytes() -> int | None:
    stats = jax.devices()[0].memory_stats()
    return None if not stats else stats.get("peak_bytes_in_use")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--len", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--dtype", default="bfloat16", help="activation / matmul dtype")
    args = ap.parse_args()
    cfg = model_config(args)
    graphdef, params = init_model(cfg, jax.random.key(0))
    n_params = sum(x.size for x in jax.tree.leaves(params))
    rl = get_recipe("loop", lora={"rank": 0}, update={"minibatch_size": args.rows})
    state = TrainState.create(params, rl, jax.random.key(1))
    del params  # the state owns them now (the update donates it)
    step = make_update_step(rl, logprob_fn=model_logprob_fn(graphdef, skip_unmasked_chunks=True))
    batch = make_batch(args.rows, args.len, args.vocab)
    tokens = int(np.asarray(batch.segment_ids != 0).sum())
    t0 = time.perf_counter()
    state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        state, metrics = step(state, batch)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - t0)
    step_s = statistics.median(times)
    peak, _, source = device_peaks(jax.devices()[:1])
    flops = 6 * n_params * tokens
    mem = peak_bytes()
    loss = float(metrics["loss/total"])
    out = {
        "check": "gpu_update",
        "backend": jax.default_backend(),
        "device": jax.devices()[0].device_kind,
        "params_b": round(n_params / 1e9, 3),
        "layers": args.layers,
        "hidden": args.hidden,
        "dtype": args.dtype,
        "rows": args.rows,
        "len": args.len,
        "unpadded_tokens": tokens,
        "compile_s": round(compile_s, 1),
        "step_s": round(step_s, 4),
        "tok_s": round(tokens / step_s, 1),
        "mfu": round(flops / step_s / peak, 4) if np.isfinite(peak) else None,
        "mfu_convention": "6*N*unpadded_tokens / step_s / peak",
        "peak_tflop_s": round(peak / 1e12, 2) if np.isfinite(peak) else None,
        "peak_source": source,
        "peak_mem_gib": None if mem is None else round(mem / 2**30, 2),
        "loss": round(loss, 4),
        "loss_finite": bool(np.isfinite(loss)),
    }
    print(
        f"{out['params_b']}B params, {args.rows} x {args.len} ({tokens} unpadded tokens), "
        f"{jax.default_backend()}: step {step_s:.3f} s, {out['tok_s']:.0f} tok/s, "
        f"MFU {out['mfu']}, peak memory {out['peak_mem_gib']} GiB, compile {compile_s:.1f} s"
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
