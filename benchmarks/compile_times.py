"""Compile times of a deep model: the update step and the sampler of a 24-layer 0.5B shape.

By default the blocks are a Python loop (unrolled in the traced program), so compile time
grows with depth; ``--scan-layers`` builds the model with ``ModelConfig.scan_layers`` (one
scanned block over stacked parameters; benchmarks/compile_depth.py compares depths). This
measures it for Qwen2.5-0.5B's shapes (24 layers, hidden 896, vocab 151936). Nothing is
allocated: both functions are lowered and compiled from ShapeDtypeStructs. Last line: one
JSON object.

    python benchmarks/compile_times.py [--layers 24] [--rows 16] [--len 512] [--scan-layers]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp

from jaxagent.generate import Sampler, SamplingConfig
from jaxagent.models import ModelConfig, abstract_graphdef, abstract_params
from jaxagent.rl.recipes import get_recipe
from jaxagent.rl.train_state import TrainState
from jaxagent.types import TokenBatch
from jaxagent.rl.update import make_update_step
from jaxagent.rl.model_fns import model_logprob_fn


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--len", type=int, default=512)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--scan-layers", action="store_true")
    args = ap.parse_args()
    config = ModelConfig.qwen2_0_5b(
        num_layers=args.layers, max_seq_len=4096, scan_layers=args.scan_layers
    )
    graphdef = abstract_graphdef(config)
    params = abstract_params(config)
    rl = get_recipe("loop", lora={"rank": 0}, update={"minibatch_size": args.rows})
    state = jax.eval_shape(lambda p: TrainState.create(p, rl, jax.random.key(0)), params)
    b = args.rows
    batch = TokenBatch.abstract(b, args.len)
    i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)  # noqa: E731
    step = make_update_step(rl, logprob_fn=model_logprob_fn(graphdef), jit=False)
    lowered, lower_s = _timed(lambda: jax.jit(step, donate_argnums=0).lower(state, batch))
    _, update_s = _timed(lowered.compile)

    sampler = Sampler(graphdef)
    sampling = SamplingConfig.create(max_new_tokens=args.new, temperature=1.0)
    lowered_s, s_lower_s = _timed(
        lambda: sampler._jit.lower(
            params,
            None,
            None,
            i32(b, 64),
            i32(b, 64),
            jax.random.key(0),
            None,  # row_ids: no per-row sampling streams
            None,  # expand: no shared prompts
            None,  # turn_ids
            sampling=sampling,
            capacity=1024,
            rows_sharding=None,
        )
    )
    _, sampler_s = _timed(lowered_s.compile)
    load = os.getloadavg()[0]
    print(
        f"{args.layers}-layer 0.5B shape{' (scan_layers)' if args.scan_layers else ''}, "
        f"{jax.default_backend()}: update trace+lower "
        f"{lower_s:.1f} s, compile {update_s:.1f} s; sampler trace+lower {s_lower_s:.1f} s, "
        f"compile {sampler_s:.1f} s (load average {load:.1f})"
    )
    print(
        json.dumps(
            {
                "check": "compile_times",
                "layers": args.layers,
                "scan_layers": args.scan_layers,
                "backend": jax.default_backend(),
                "update_lower_s": round(lower_s, 1),
                "update_compile_s": round(update_s, 1),
                "sampler_lower_s": round(s_lower_s, 1),
                "sampler_compile_s": round(sampler_s, 1),
                "loadavg": load,
            }
        )
    )


if __name__ == "__main__":
    main()
