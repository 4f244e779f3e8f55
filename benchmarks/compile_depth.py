"""Compile time against depth: the trainer's update step with unrolled and scanned blocks.

``model.scan_layers`` runs the transformer's blocks as one ``jax.lax.scan`` over stacked
parameters, so the traced program holds one block whatever the depth; unrolled, it holds L
copies and XLA compiles each. This lowers and compiles the update step as the trainer builds
it (``jaxagent.rl.update.make_update_step`` with ``jaxagent.rl.model_fns.model_logprob_fn``:
block remat through ``checkpoint_in_backward``, the chunked vocabulary head; the LOOP recipe,
full fine-tuning) from ShapeDtypeStructs (nothing allocated) at two depths, both layouts,
and prints trace+lower, compile and their sum, and the deep / shallow ratio of the sums.
Optionally the sampler too. Last line: one JSON object.

    python benchmarks/compile_depth.py [--shallow 4] [--deep 28] [--hidden 64] [--sampler]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp

from jaxagent.models import ModelConfig, abstract_graphdef, abstract_params
from jaxagent.rl.model_fns import model_logprob_fn
from jaxagent.rl.recipes import get_recipe
from jaxagent.rl.train_state import TrainState
from jaxagent.rl.update import make_update_step
from jaxagent.types import TokenBatch


def depth_config(layers: int, hidden: int, scan_layers: bool) -> ModelConfig:
    """A Llama-shaped model of ``layers`` blocks and width ``hidden`` (4 heads, GQA 2)."""
    return ModelConfig(
        vocab_size=512,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=4,
        num_kv_heads=2,
        head_dim=hidden // 4,
        intermediate_size=3 * hidden,
        max_seq_len=1024,
        scan_layers=scan_layers,
    )


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def update_compile_seconds(config: ModelConfig, rows: int = 4, length: int = 64) -> dict:
    """{"lower_s", "compile_s", "total_s"}: trace+lower and XLA compile of the update step."""
    graphdef = abstract_graphdef(config)
    params = abstract_params(config)
    rl = get_recipe("loop", lora={"rank": 0}, update={"minibatch_size": rows})
    state = jax.eval_shape(lambda p: TrainState.create(p, rl, jax.random.key(0)), params)
    step = make_update_step(rl, logprob_fn=model_logprob_fn(graphdef), jit=False)
    batch = TokenBatch.abstract(rows, length)
    lowered, lower_s = _timed(lambda: jax.jit(step, donate_argnums=0).lower(state, batch))
    _, compile_s = _timed(lowered.compile)
    return {"lower_s": lower_s, "compile_s": compile_s, "total_s": lower_s + compile_s}


def sampler_compile_seconds(config: ModelConfig, rows: int = 4, new: int = 16) -> dict:
    """The same for the sampler's jitted prefill + decode loop (a 64-token chunk)."""
    from jaxagent.generate import Sampler, SamplingConfig

    sampler = Sampler(abstract_graphdef(config))
    i32 = jax.ShapeDtypeStruct((rows, 64), jnp.int32)
    sampling = SamplingConfig.create(max_new_tokens=new, temperature=1.0)
    lowered, lower_s = _timed(
        lambda: sampler._jit.lower(
            abstract_params(config),
            None,
            None,
            i32,
            i32,
            jax.random.key(0),
            None,
            sampling=sampling,
            capacity=256,
            rows_sharding=None,
        )
    )
    _, compile_s = _timed(lowered.compile)
    return {"lower_s": lower_s, "compile_s": compile_s, "total_s": lower_s + compile_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shallow", type=int, default=4)
    ap.add_argument("--deep", type=int, default=28)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--len", type=int, default=64)
    ap.add_argument("--sampler", action="store_true", help="also the sampler's program")
    args = ap.parse_args()
    print(
        f"update step (LOOP, full fine-tuning, block remat, chunked head) of a width-"
        f"{args.hidden} model, {args.rows} x {args.len} tokens, {jax.default_backend()} backend, "
        f"{os.cpu_count()} CPUs; depths {args.shallow} and {args.deep}"
    )
    out: dict = {"check": "compile_depth", "backend": jax.default_backend()}
    out.update(hidden=args.hidden, shallow=args.shallow, deep=args.deep)
    programs = [("update", lambda c: update_compile_seconds(c, args.rows, args.len))]
    if args.sampler:
        programs.append(("sampler", lambda c: sampler_compile_seconds(c, args.rows)))
    for program, measure in programs:
        for scan in (False, True):
            layout = "scan" if scan else "unrolled"
            times = {}
            for layers in (args.shallow, args.deep):
                t = measure(depth_config(layers, args.hidden, scan))
                times[layers] = t
                print(
                    f"  {program:7s} {layout:8s} {layers:3d} layers: trace+lower "
                    f"{t['lower_s']:6.2f} s, compile {t['compile_s']:6.2f} s, "
                    f"total {t['total_s']:6.2f} s"
                )
                for k, v in t.items():
                    out[f"{program}_{layout}_{layers}_{k}"] = round(v, 2)
            ratio = times[args.deep]["total_s"] / times[args.shallow]["total_s"]
            out[f"{program}_{layout}_ratio"] = round(ratio, 2)
            print(f"  {program:7s} {layout:8s} ratio {args.deep} / {args.shallow}: {ratio:.2f}")
    out["loadavg"] = os.getloadavg()[0]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
