"""Will a run fit the chips? Compile the trainer's own update step for a real model on a real
topology, ahead of time, and read XLA's per-chip plan.

The step is the one ``jaxagent.train.Trainer`` runs, built by the same calls: the recipe's
``RLConfig`` (``rl.recipes.get_recipe``), the learner pass ``model_logprob_fn(graphdef,
remat=..., skip_unmasked_chunks=True, activation_sharding=layout.activation_sharding())``, ``rl.update.make_update_step`` with the mesh, and
the state and batch shardings of ``parallel.layout.DeviceLayout`` (``state_shardings`` over
the model's logical axes). Nothing is allocated: parameters, optimiser state and batch are
abstract arrays with their ``NamedSharding``s, lowered with ``jax.jit(...).lower`` and
compiled for the target devices:

- ``--topology v5e:16x16`` (any name ``jax.experimental.topologies`` knows; needs
  ``pip install libtpu``, no TPU): XLA's TPU compiler on this machine;
- ``--cpu-devices 8``: the same compile on simulated CPU devices (no libtpu needed).

Per chip it prints argument, output, temporary and aliased bytes and the peak (arguments +
outputs + temporaries - aliased, the state being donated), against the chip's HBM; the
compile time; FLOPs per step from ``cost_analysis`` (per chip, including remat
recomputation; XLA counts a loop body once, so with microbatch scans and blockwise loops it
undercounts) beside the model FLOPs of the 6 N T convention; and the step time at a stated
MFU. A program the TPU compiler refuses for memory is reported as not fitting, with the
temporaries it asked for. ``TPU_LIBRARY_PATH=/path/to/libtpu.so`` points JAX at a libtpu
installed outside site-packages (so other JAX processes on the machine do not load it).
The last line is one JSON object.

Usage:
  python benchmarks/pod_plan.py --model qwen2.5-7b --topology v5e:16x16 --recipe loop \\
      --episodes 512 --tokens 4096
  python benchmarks/pod_plan.py --model qwen2.5-32b --lora 16 --topology v5e:16x16
  python benchmarks/pod_plan.py --model qwen2.5-0.5b --cpu-devices 8 --episodes 16 --tokens 1024
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

# HF config.json figures of the named checkpoints (vocab, width, depth, heads, KV heads,
# head_dim, SwiGLU width, q/k/v biases, tied embeddings, RoPE base).
MODELS = {
    "qwen2.5-0.5b": (151936, 896, 24, 14, 2, 64, 4864, True, True, 1e6),
    "qwen2.5-1.5b": (151936, 1536, 28, 12, 2, 128, 8960, True, True, 1e6),
    "qwen2.5-7b": (152064, 3584, 28, 28, 4, 128, 18944, True, False, 1e6),
    "qwen2.5-32b": (152064, 5120, 64, 40, 8, 128, 27648, True, False, 1e6),
    "llama-3.1-8b": (128256, 4096, 32, 32, 8, 128, 14336, False, False, 5e5),
}
# HBM per chip (GiB) and dense bf16 peak (FLOP/s), from the vendors' data sheets.
CHIPS = {
    "TPU v5 lite": (16, 197e12),
    "TPU v5e": (16, 197e12),
    "TPU v5": (95, 459e12),
    "TPU v5p": (95, 459e12),
    "TPU v4": (32, 275e12),
    "TPU v6 lite": (32, 918e12),
    "TPU v6e": (32, 918e12),
    "cpu": (None, None),
}


def _args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-7b", choices=sorted(MODELS))
    ap.add_argument("--topology", default="v5e:16x16")
    ap.add_argument("--cpu-devices", type=int, default=0, help="compile for N simulated CPUs")
    ap.add_argument("--recipe", default="loop")
    ap.add_argument("--lora", type=int, default=0, help="LoRA rank (0: full fine-tuning)")
    ap.add_argument("--lora-dtype", default="float32", help="rl.lora.dtype: float32 | param")
    ap.add_argument("--moments-dtype", default="param", help="rl.optim.moments_dtype")
    ap.add_argument("--episodes", type=int, default=512, help="rows of one update batch")
    ap.add_argument("--tokens", type=int, default=4096, help="tokens a row")
    ap.add_argument("--microbatch", type=int, default=0, help="rows a gradient step (0: 1/chip)")
    ap.add_argument("--mesh", default="", help="data,fsdp,tensor (default: 1,chips/T,T)")
    ap.add_argument("--tensor", type=int, default=1, help="tensor-parallel size (no --mesh)")
    ap.add_argument("--param-dtype", default="", help="default: float32, bfloat16 under LoRA")
    ap.add_argument("--dtype", default="bfloat16", help="compute dtype")
    ap.add_argument("--mfu", type=float, default=0.4, help="MFU for the projected step time")
    ap.add_argument("--scan-layers", action="store_true", help="model.scan_layers (no LoRA)")
    args = ap.parse_args(argv)
    if args.cpu_devices:
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "")
            + f" --xla_force_host_platform_device_count={args.cpu_devices}"
        )
        os.environ["JAX_PLATFORMS"] = "cpu"
    return args


def plan(args) -> dict:
    import jax

    from jaxagent.models import ModelConfig, abstract_graphdef, init_model, param_logical_axes
    from jaxagent.parallel.layout import DeviceLayout
    from jaxagent.parallel.mesh import MeshConfig, make_mesh
    from jaxagent.rl.model_fns import model_logprob_fn
    from jaxagent.rl.recipes import get_recipe
    from jaxagent.rl.train_state import TrainState, make_optimizer
    from jaxagent.rl.update import make_update_step
    from jaxagent.types import TokenBatch

    if args.cpu_devices:
        devices, where = jax.devices()[: args.cpu_devices], f"cpu x{args.cpu_devices}"
    else:
        from jax.experimental import topologies

        devices = topologies.get_topology_desc(platform="tpu", topology_name=args.topology).devices
        where = args.topology
    n = len(devices)
    kind = devices[0].device_kind
    hbm_gib, peak_flops = CHIPS.get(kind, (None, None))

    v, d, layers, h, k, hd, f, bias, tie, theta = MODELS[args.model]
    param_dtype = args.param_dtype or ("bfloat16" if args.lora else "float32")
    cfg = ModelConfig(
        vocab_size=v, hidden_size=d, num_layers=layers, num_heads=h, num_kv_heads=k,
        head_dim=hd, intermediate_size=f, qkv_bias=bias, tie_embeddings=tie, rope_theta=theta,
        param_dtype=param_dtype, dtype=args.dtype, max_seq_len=max(args.tokens, 4096),
        model_type="qwen2" if bias else "llama", scan_layers=args.scan_layers,
    )  # fmt: skip
    if args.mesh:
        data, fsdp, tensor = (int(x) for x in args.mesh.split(","))
    else:
        data, fsdp, tensor = 1, n // args.tensor, args.tensor
    mesh_cfg = MeshConfig(data=data, fsdp=fsdp, tensor=tensor)
    mesh = make_mesh(mesh_cfg, devices=devices)
    rows_per_step = args.microbatch or data * fsdp  # one row per chip per gradient step
    rl = get_recipe(
        args.recipe,
        lora={"rank": args.lora, "dtype": args.lora_dtype},
        optim={"moments_dtype": args.moments_dtype},
        update={
            "minibatch_size": args.episodes,
            "microbatch_size": rows_per_step,
            "num_epochs": 1,
            "shuffle": False,
        },
    )
    optimizer = make_optimizer(rl)
    graphdef = abstract_graphdef(cfg)
    params = jax.eval_shape(lambda key: init_model(cfg, key)[1], jax.random.key(0))
    layout = DeviceLayout(mesh, param_logical_axes(graphdef, params), "train", mesh_cfg.rules)
    state = layout.abstract_state(
        jax.eval_shape(
            lambda p: TrainState.create(p, rl, jax.random.key(0), optimizer=optimizer), params
        ),
        optimizer,
    )
    b, t = args.episodes, args.tokens
    batch = TokenBatch.abstract(b, t)
    b_sh = layout.batch_sharding(batch)
    batch = jax.tree.map(
        lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), batch, b_sh
    )
    logprob_fn = model_logprob_fn(
        graphdef,
        remat=rl.update.remat,
        skip_unmasked_chunks=True,
        activation_sharding=layout.activation_sharding(),
    )
    step = make_update_step(
        rl,
        optimizer=optimizer,
        logprob_fn=logprob_fn,
        mesh=mesh,
        state_sharding=jax.tree.map(lambda x: x.sharding, state),
        batch_sharding=b_sh,
        rules=layout.rules,
    )
    t0 = time.perf_counter()
    lowered = step.lower(state, batch)
    t1 = time.perf_counter()
    head = {
        "model": args.model,
        "topology": where,
        "chip": kind,
        "chips": n,
        "mesh": f"data={data},fsdp={fsdp},tensor={tensor}",
        "recipe": args.recipe + (f"+lora{args.lora}" if args.lora else ""),
        "param_dtype": param_dtype,
        "dtype": args.dtype,
        "scan_layers": args.scan_layers,
        "episodes": b,
        "tokens": t,
        "rows_per_gradient_step": rows_per_step,
        "hbm_gib": hbm_gib,
        "lower_s": round(t1 - t0, 1),
    }
    try:
        compiled = lowered.compile()
    except jax.errors.JaxRuntimeError as err:
        # The TPU compiler refuses a program whose temporaries exceed HBM; that is the answer.
        import re

        msg = str(err).splitlines()[0]
        need = re.search(r"temporaries \(([\d.]+)G\)", msg)
        return head | {
            "fits": False,
            "peak_gib_per_chip": None,
            "temp_gib": float(need.group(1)) * 1e9 / 2**30 if need else None,
            "compile_s": round(time.perf_counter() - t1, 1),
            "flops_per_step": None,
            "compile_error": msg[:300],
        }
    t2 = time.perf_counter()
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    gib = 2.0**30
    peak = (
        mem.argument_size_in_bytes
        + mem.output_size_in_bytes
        + mem.temp_size_in_bytes
        - mem.alias_size_in_bytes
    )
    n_params = sum(x.size for x in jax.tree.leaves(params))
    model_flops = 6 * n_params * b * t  # the 6 N T convention, whole step, all chips
    hw_flops = float(cost.get("flops", 0.0))  # per chip, as compiled (remat included)
    step_s = None if peak_flops is None else model_flops / n / (peak_flops * args.mfu)
    return head | {
        "adam_moments_dtype": str(
            jax.tree.leaves(state.opt_state)[-1].dtype if jax.tree.leaves(state.opt_state) else ""
        ),
        "params_b": round(n_params / 1e9, 3),
        "argument_gib": round(mem.argument_size_in_bytes / gib, 3),
        "output_gib": round(mem.output_size_in_bytes / gib, 3),
        "temp_gib": round(mem.temp_size_in_bytes / gib, 3),
        "alias_gib": round(mem.alias_size_in_bytes / gib, 3),
        "peak_gib_per_chip": round(peak / gib, 3),
        "fits": None if hbm_gib is None else peak / gib <= hbm_gib,
        "compile_s": round(t2 - t1, 1),
        "flops_per_step": hw_flops,
        "model_flops_per_chip": model_flops / n,
        "recompute_ratio": round(hw_flops / (model_flops / n), 3) if hw_flops else None,
        "mfu_assumed": args.mfu,
        "projected_step_s": None if step_s is None else round(step_s, 2),
    }


def main(argv=None) -> None:
    args = _args(argv)
    r = plan(args)
    if "compile_error" in r:
        print(
            f"setup: {r['model']} ({r['recipe']}, {r['param_dtype']} params) on {r['topology']} "
            f"({r['chips']} x {r['chip']}), mesh {r['mesh']}; batch {r['episodes']} x "
            f"{r['tokens']} tokens\nDOES NOT FIT: {r['compile_error']}"
        )
        print(json.dumps(r))
        return
    print(
        f"setup: {r['model']} ({r['params_b']}B params, {r['param_dtype']} params, "
        f"{r['dtype']} compute, {r['recipe']}) on {r['topology']} ({r['chips']} x {r['chip']}), "
        f"mesh {r['mesh']}; batch {r['episodes']} x {r['tokens']} tokens, "
        f"{r['rows_per_gradient_step']} rows a gradient step"
    )
    print(
        f"per chip: arguments {r['argument_gib']} GiB, outputs {r['output_gib']} GiB, "
        f"temporaries {r['temp_gib']} GiB, aliased {r['alias_gib']} GiB -> peak "
        f"{r['peak_gib_per_chip']} GiB of {r['hbm_gib']} GiB HBM (fits: {r['fits']})"
    )
    print(
        f"compile: lower {r['lower_s']} s, compile {r['compile_s']} s; FLOPs a step per chip "
        f"{r['flops_per_step']:.3e} as compiled vs {r['model_flops_per_chip']:.3e} by 6NT "
        f"(ratio {r['recompute_ratio']}); projected step {r['projected_step_s']} s at "
        f"{r['mfu_assumed']:.0%} MFU"
    )
    print(json.dumps(r))


if __name__ == "__main__":
    main()
