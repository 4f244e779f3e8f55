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

``--phase rollout`` compiles the continuous-batching rollout engine's device programs instead
(``jaxagent.generate.slots.SlotSampler``'s own jitted ``_admit`` and ``_decode``) for a pool
of ``--episodes`` slots of ``--tokens`` capacity, in the layout a model samples in: weights
in bf16, tensor-parallel over 'tensor' (``--tensor``, default 4: one v5e host's chips) and
replicated over 'data' (``parallel.mesh.replica_rules``: ``mesh.rollout_layout=replicas``), the bf16 KV cache split by the
sampler itself (rows over 'data', KV heads over 'tensor'), the pool laid out by the
sampler's own ``init`` program. ``admit`` prefills ``--admit-rows`` slots on each data
shard (default: all of them, so every slot of the pool at once; ``SlotSampler.admit`` lays
the rows out by the shard that owns the slot) of ``--prompt-tokens`` (default two prefill
chunks); ``decode``
runs ``--decode-steps`` steps of every slot. Per program it prints the per-chip plan as
above, and the bytes a decode step reads per chip (the weights, plus the KV cache of every
slot's whole capacity, which attention reads today) with the step time that implies at the
chip's HBM bandwidth.

Usage:
  python benchmarks/pod_plan.py --model qwen2.5-7b --topology v5e:16x16 --recipe loop \\
      --episodes 512 --tokens 4096
  python benchmarks/pod_plan.py --model qwen2.5-32b --lora 16 --topology v5e:16x16
  python benchmarks/pod_plan.py --model qwen2.5-0.5b --cpu-devices 8 --episodes 16 --tokens 1024
  python benchmarks/pod_plan.py --model qwen2.5-7b --topology v5e:16x16 --phase rollout \\
      --episodes 256 --tokens 8192 --scan-layers
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
# HBM per chip (GiB), dense bf16 peak (FLOP/s) and HBM bandwidth (bytes/s), from the
# vendors' data sheets.
CHIPS = {
    "TPU v5 lite": (16, 197e12, 819e9),
    "TPU v5e": (16, 197e12, 819e9),
    "TPU v5": (95, 459e12, 2765e9),
    "TPU v5p": (95, 459e12, 2765e9),
    "TPU v4": (32, 275e12, 1200e9),
    "TPU v6 lite": (32, 918e12, 1640e9),
    "TPU v6e": (32, 918e12, 1640e9),
    "cpu": (None, None, None),
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
    ap.add_argument("--phase", default="update", choices=("update", "rollout"))
    ap.add_argument(
        "--mesh",
        default="",
        help="data,fsdp,tensor (default: update 1,chips/T,T; rollout chips/T,1,T)",
    )
    ap.add_argument(
        "--tensor",
        type=int,
        default=0,
        help="tensor-parallel size (no --mesh; 0: update 1, rollout 4)",
    )
    ap.add_argument("--new-tokens", type=int, default=1024, help="rollout: tokens a turn (N)")
    ap.add_argument("--decode-steps", type=int, default=16, help="rollout: steps a decode call")
    ap.add_argument("--prefill-chunk", type=int, default=512, help="rollout: prefill chunk")
    ap.add_argument(
        "--admit-rows",
        type=int,
        default=0,
        help="rollout: rows an admit prefills on each data shard, bucketed as "
        "SlotSampler.admit does (0: all of its slots, the whole pool admitted at once)",
    )
    ap.add_argument(
        "--prompt-tokens", type=int, default=0, help="rollout: admit width (0: 2 prefill chunks)"
    )
    ap.add_argument("--param-dtype", default="", help="default: float32, bfloat16 under LoRA")
    ap.add_argument("--dtype", default="bfloat16", help="compute dtype")
    ap.add_argument("--mfu", type=float, default=0.4, help="MFU for the projected step time")
    ap.add_argument("--scan-layers", action="store_true", help="model.scan_layers (no LoRA)")
    ap.add_argument(
        "--attention",
        default="blockwise",
        choices=("blockwise", "splash"),
        help="model.attention for long rows: pure-JAX tiles, or the Pallas splash kernel (TPU)",
    )
    args = ap.parse_args(argv)
    if args.cpu_devices:
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "")
            + f" --xla_force_host_platform_device_count={args.cpu_devices}"
        )
        os.environ["JAX_PLATFORMS"] = "cpu"
    return args


def _devices(args):
    """The target devices (a TPU topology's, or simulated CPUs) and their description."""
    import jax

    if args.cpu_devices:
        return jax.devices()[: args.cpu_devices], f"cpu x{args.cpu_devices}"
    from jax.experimental import topologies

    desc = topologies.get_topology_desc(platform="tpu", topology_name=args.topology)
    return desc.devices, args.topology


def _model_config(args, param_dtype: str):
    from jaxagent.models import ModelConfig

    v, d, layers, h, k, hd, f, bias, tie, theta = MODELS[args.model]
    return ModelConfig(
        vocab_size=v, hidden_size=d, num_layers=layers, num_heads=h, num_kv_heads=k,
        head_dim=hd, intermediate_size=f, qkv_bias=bias, tie_embeddings=tie, rope_theta=theta,
        param_dtype=param_dtype, dtype=args.dtype, max_seq_len=max(args.tokens, 4096),
        model_type="qwen2" if bias else "llama", scan_layers=args.scan_layers,
        attention=args.attention,
    )  # fmt: skip


def _placed(tree, shardings):
    """Abstract arrays of ``tree``'s shapes and dtypes laid out by ``shardings``."""
    import jax

    return jax.tree.map(
        lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), tree, shardings
    )


def plan(args) -> dict:
    import jax

    from jaxagent.models import abstract_graphdef, init_model, param_logical_axes
    from jaxagent.parallel.layout import DeviceLayout
    from jaxagent.parallel.mesh import MeshConfig, make_mesh
    from jaxagent.rl.model_fns import model_logprob_fn
    from jaxagent.rl.recipes import get_recipe
    from jaxagent.rl.train_state import TrainState, make_optimizer
    from jaxagent.rl.update import make_update_step
    from jaxagent.types import TokenBatch

    devices, where = _devices(args)
    n = len(devices)
    kind = devices[0].device_kind
    hbm_gib, peak_flops, _ = CHIPS.get(kind, (None, None, None))

    param_dtype = args.param_dtype or ("bfloat16" if args.lora else "float32")
    cfg = _model_config(args, param_dtype)
    if args.mesh:
        data, fsdp, tensor = (int(x) for x in args.mesh.split(","))
    else:
        tensor = args.tensor or 1
        data, fsdp = 1, n // tensor
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
        "attention": args.attention,
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


def _per_chip_bytes(tree) -> int:
    """Bytes one device holds of abstract arrays with shardings (the largest shard)."""
    import jax
    import numpy as np

    return sum(
        int(np.prod(x.sharding.shard_shape(x.shape))) * x.dtype.itemsize
        for x in jax.tree.leaves(tree)
    )


def _spec(x) -> str:
    return str(tuple(x.sharding.spec) + (None,) * (x.ndim - len(x.sharding.spec)))


def rollout_plan(args) -> dict:
    """Compile the continuous-batching engine's two device programs (``SlotSampler._admit``,
    ``._decode``) for ``episodes`` slots of ``tokens`` capacity, in the sampling layout: bf16
    weights tensor-parallel over 'tensor' and replicated over 'data' (``replica_rules``, the ``replicas`` rollout layout), the
    KV cache (bf16) split over rows and KV heads by the sampler itself."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    from jaxagent.generate import SamplingConfig
    from jaxagent.generate.sampler import _row_sharding
    from jaxagent.generate.slots import SlotSampler
    from jaxagent.models import abstract_graphdef, init_model, param_logical_axes
    from jaxagent.parallel.mesh import DEFAULT_RULES, replica_rules
    from jaxagent.parallel.mesh import MeshConfig, make_mesh, param_shardings

    devices, where = _devices(args)
    n = len(devices)
    kind = devices[0].device_kind
    hbm_gib, _, bandwidth = CHIPS.get(kind, (None, None, None))
    cfg = _model_config(args, args.param_dtype or "bfloat16")
    if args.mesh:
        data, fsdp, tensor = (int(x) for x in args.mesh.split(","))
    else:
        tensor = args.tensor or 4
        data, fsdp = n // tensor, 1
    mesh = make_mesh(MeshConfig(data=data, fsdp=fsdp, tensor=tensor), devices=devices)
    graphdef = abstract_graphdef(cfg)
    params = jax.eval_shape(lambda key: init_model(cfg, key)[1], jax.random.key(0))
    p_sh = param_shardings(
        params, param_logical_axes(graphdef, params), mesh, replica_rules(DEFAULT_RULES)
    )
    params = _placed(params, p_sh)
    s, cap = args.episodes, args.tokens
    sampling = SamplingConfig(
        max_new_tokens=args.new_tokens, prefill_chunk=args.prefill_chunk, stop_token_ids=(2,)
    )
    sampler = SlotSampler(
        graphdef, sampling, s, cap, decode_steps=args.decode_steps, cache_dtype=cfg.jnp_dtype
    )
    rows_sh = _row_sharding(params, s)
    t0 = time.perf_counter()
    # The pool as ``SlotSampler.init`` lays it out: its own program's output shardings.
    init = sampler._init.lower(params, rows_sharding=rows_sh).compile()
    state = _placed(
        jax.eval_shape(lambda p: sampler._init_state(p, rows_sharding=None), params),
        init.output_shardings,
    )
    # The decode kernels, built once a rollout (``SlotSampler.prepare``), laid out by their
    # own program too.
    prep = sampler._prepare.lower(params).compile()
    fused = _placed(jax.eval_shape(sampler._prepare, params), prep.output_shardings)
    init_s = time.perf_counter() - t0
    shards = sampler.shards(params)  # the rows' mesh axes (``batch_mesh_axes``)
    per = s // shards
    p_rows = SlotSampler._rows(args.admit_rows or per, per)  # its row buckets a shard
    width = args.prompt_tokens or 2 * args.prefill_chunk
    rep = NamedSharding(mesh, P())
    # The row inputs as SlotSampler.admit places them: [shards, rows a shard, ...], split
    # over the rows' axes.
    row_in = NamedSharding(mesh, P(rows_sh.spec[0])) if shards > 1 else rep

    def arg(shape, dtype):
        return jax.ShapeDtypeStruct((shards, *shape), dtype, sharding=row_in)

    key = jax.ShapeDtypeStruct((), jax.eval_shape(lambda: jax.random.key(0)).dtype, sharding=rep)
    # No prefix sharing (every admitted row prefilled: the worst case): as many prefill rows
    # as admitted slots.
    admit_args = (
        arg((p_rows,), "int32"),  # the slot each prefill row continues
        arg((p_rows, width), "int32"),  # tokens
        arg((p_rows, width), "int32"),  # segment ids
        arg((p_rows,), "bool"),  # fresh
        arg((p_rows,), "int32"),  # slot ids
        arg((p_rows,), "int32"),  # prefill row of each slot
        key,
        arg((p_rows,), "int32"),  # row ids
        arg((p_rows,), "int32"),  # turn ids
    )
    weights_b = _per_chip_bytes(params)
    kv_b = _per_chip_bytes((state.cache.keys, state.cache.values))
    fused_b = _per_chip_bytes(fused)
    # A decode step reads every kernel once, but of the input embedding only the rows looked
    # up (untied: the [V, D] table is not read; tied, it is the LM head and is read).
    embed_b = 0 if cfg.tie_embeddings else _per_chip_bytes(params["embed"])
    step_b = weights_b - embed_b + kv_b  # attention reads each slot's whole capacity
    gib = 2.0**30
    k0 = jax.tree.leaves(state.cache.keys)[0]
    out = {
        "phase": "rollout",
        "model": args.model,
        "topology": where,
        "chip": kind,
        "chips": n,
        "mesh": f"data={data},fsdp={fsdp},tensor={tensor}",
        "layout": {
            "weights": f"{cfg.param_dtype}, rules replica_rules (the replicas rollout layout: vocab/heads/kv_heads/mlp over "
            "tensor, embed unsharded): replicated over data",
            "q_proj": _spec(params["blocks" if cfg.scan_layers else "layer_0"]["attn"]["q_proj"]),
            "kv_cache": f"{k0.dtype}, keys {list(k0.shape)} spec {_spec(k0)}",
            "slot_state": f"tokens {_spec(state.tokens)}",
        },
        "scan_layers": cfg.scan_layers,
        "slots": s,
        "capacity": cap,
        "new_tokens": args.new_tokens,
        "decode_steps": args.decode_steps,
        "admit_rows": p_rows * shards,
        "admit_rows_per_shard": p_rows,
        "admit_width": width,
        "prefill_chunk": args.prefill_chunk,
        "hbm_gib": hbm_gib,
        "weights_gib_per_chip": round(weights_b / gib, 3),
        "kv_cache_gib_per_chip": round(kv_b / gib, 3),
        "decode_kernels_gib_per_chip": round(fused_b / gib, 3),
        "slots_per_data_shard": s // shards if s % shards == 0 else s,
        "decode_bytes_per_step": step_b,
        "decode_weight_bytes_per_step": weights_b - embed_b,
        "decode_kv_bytes_per_step": kv_b,
        "hbm_bytes_per_s": bandwidth,
        "decode_step_ms_at_hbm_bw": None if not bandwidth else round(step_b / bandwidth * 1e3, 3),
        "init_compile_s": round(init_s, 1),
        "programs": {},
    }
    programs = (
        ("admit", sampler._admit, admit_args),
        ("decode", sampler._decode, (None,)),
    )  # every slot
    for name, fn, extra in programs:
        t0 = time.perf_counter()
        lowered = fn.lower(params, fused, state, *extra)
        t1 = time.perf_counter()
        out["programs"][name] = _memory(lowered, hbm_gib) | {"lower_s": round(t1 - t0, 1)}
    out["peak_gib"] = {k: v["peak_gib_per_chip"] for k, v in out["programs"].items()}
    # A program's arguments count only the buffers it reads; the weights, the decode kernels
    # and the cache are all resident through the rollout, so a call's true peak is all of
    # them plus its temporaries.
    resident = (weights_b + fused_b + kv_b) / gib
    out["resident_gib_per_chip"] = round(resident, 3)
    out["peak_with_resident_gib"] = {
        k: round(resident + v["temp_gib"], 3) for k, v in out["programs"].items() if "temp_gib" in v
    }
    fits = [v["fits"] for v in out["programs"].values()]
    if hbm_gib:
        fits += [p <= hbm_gib for p in out["peak_with_resident_gib"].values()]
    out["fits"] = None if None in fits else all(fits)
    return out


def _memory(lowered, hbm_gib) -> dict:
    """Compile ``lowered`` and read XLA's per-chip plan (or the TPU compiler's refusal)."""
    import re

    import jax

    t0 = time.perf_counter()
    try:
        compiled = lowered.compile()
    except jax.errors.JaxRuntimeError as err:
        msg = str(err).splitlines()[0]
        need = re.search(r"temporaries \(([\d.]+)G\)", msg)
        return {
            "fits": False,
            "peak_gib_per_chip": None,
            "temp_gib": float(need.group(1)) * 1e9 / 2**30 if need else None,
            "compile_s": round(time.perf_counter() - t0, 1),
            "compile_error": msg[:300],
        }
    mem = compiled.memory_analysis()
    gib = 2.0**30
    peak = (
        mem.argument_size_in_bytes
        + mem.output_size_in_bytes
        + mem.temp_size_in_bytes
        - mem.alias_size_in_bytes
    )
    return {
        "argument_gib": round(mem.argument_size_in_bytes / gib, 3),
        "output_gib": round(mem.output_size_in_bytes / gib, 3),
        "temp_gib": round(mem.temp_size_in_bytes / gib, 3),
        "temp_bytes": mem.temp_size_in_bytes,
        "alias_gib": round(mem.alias_size_in_bytes / gib, 3),
        "peak_gib_per_chip": round(peak / gib, 3),
        "fits": None if hbm_gib is None else peak / gib <= hbm_gib,
        "compile_s": round(time.perf_counter() - t0, 1),
    }


def print_rollout(r: dict) -> None:
    print(
        f"setup: {r['model']} rollout (SlotSampler) on {r['topology']} ({r['chips']} x "
        f"{r['chip']}), mesh {r['mesh']}; {r['slots']} slots x {r['capacity']} tokens "
        f"({r['slots_per_data_shard']} a data shard), {r['new_tokens']} tokens a turn, "
        f"{r['decode_steps']} steps a decode call; admit {r['admit_rows']} rows "
        f"({r['admit_rows_per_shard']} a data shard) x {r['admit_width']} tokens in chunks "
        f"of {r['prefill_chunk']}; scan_layers {r['scan_layers']}"
    )
    lay = r["layout"]
    print(
        f"layout: weights {lay['weights']} (q_proj {lay['q_proj']}); KV cache {lay['kv_cache']}; "
        f"slot state {lay['slot_state']}"
    )
    print(
        f"per chip resident: weights {r['weights_gib_per_chip']} GiB, KV cache "
        f"{r['kv_cache_gib_per_chip']} GiB, decode kernels (fused q/k/v, gate/up; built once a "
        f"rollout) {r['decode_kernels_gib_per_chip']} GiB (pool init compiled in "
        f"{r['init_compile_s']} s)"
    )
    for name, m in r["programs"].items():
        if "compile_error" in m:
            print(f"{name}: DOES NOT FIT: {m['compile_error']} (compile {m['compile_s']} s)")
            continue
        print(
            f"{name}: arguments {m['argument_gib']} GiB, outputs {m['output_gib']} GiB, "
            f"temporaries {m['temp_gib']} GiB, aliased {m['alias_gib']} GiB -> peak "
            f"{m['peak_gib_per_chip']} GiB of {r['hbm_gib']} GiB HBM (fits: {m['fits']}); "
            f"lower {m['lower_s']} s, compile {m['compile_s']} s; with everything resident "
            f"(weights, decode kernels, cache) {r['peak_with_resident_gib'][name]} GiB"
        )
    bw = r["hbm_bytes_per_s"]
    print(
        f"decode step per chip: {r['decode_bytes_per_step'] / 1e9:.3f} GB read (weights "
        f"{r['decode_weight_bytes_per_step'] / 1e9:.3f} GB + KV {r['decode_kv_bytes_per_step'] / 1e9:.3f} GB"
        f", every slot's whole capacity) -> "
        + (
            f"{r['decode_step_ms_at_hbm_bw']} ms at {bw / 1e9:.0f} GB/s HBM, "
            f"{r['slots'] / (r['decode_step_ms_at_hbm_bw'] / 1e3):.0f} tokens/s over the pod "
            "if every slot decodes (bandwidth bound)"
            if bw
            else "(no bandwidth figure for this chip)"
        )
    )


def main(argv=None) -> None:
    args = _args(argv)
    if args.phase == "rollout":
        r = rollout_plan(args)
        print_rollout(r)
        print(json.dumps(r))
        return
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
        f"{r['dtype']} compute, {r['recipe']}, {r['attention']} attention) on {r['topology']} "
        f"({r['chips']} x {r['chip']}), mesh {r['mesh']}; batch {r['episodes']} x {r['tokens']} tokens, "
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
