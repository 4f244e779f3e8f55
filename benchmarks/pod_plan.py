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
- ``--topology h100:8`` (also ``h100:1``, ``h200:8``, ``a100:8``; ``h100:16`` is two hosts
  of 8): XLA's GPU compiler on this machine, no GPU: the CUDA PJRT plugin
  (``jax[cuda12]``, installed beside the project in its own virtualenv by
  ``scripts/gpu_compiler_venv.sh``) compiles for deviceless GPUs described by a
  ``GpuTargetConfig`` (``GPU_TARGETS``), with ``JAX_PLATFORMS=cpu``. ``cost_analysis`` is
  empty for these programs; the projection counts FLOPs itself;
- ``--cpu-devices 8``: the same compile on simulated CPU devices (no libtpu needed).

A missing compiler (no libtpu for a TPU name, no CUDA plugin for a GPU one) is one line
naming the install, exit status 2.

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

``--phase sft`` compiles the warm start's step (``train.sft.make_sft_step`` over
``sft_recipe``: the sft loss through the update's lean learner pass, remat, the chunked
head, ``--lora``), in the update's layout. ``--phase all`` compiles, one after another, the SFT step, the
update, the rollout's admit and decode (a pool of ``--slots``, default every episode at
once), evaluation sampling (the rollout's programs at ``--eval-rows``; the same programs
when that is the pool's size) and ``save_hf``'s
device copy for export (host bytes estimated), and prints one table (arguments,
temporaries, peak, fits a chip; a refused program shows the temporaries it asked for),
then a projection, labelled as one: each phase's FLOPs (6 N T training, 2 N T sampling,
plus causal attention) and HBM bytes at the chip's peak and bandwidth (the roofline bound)
and at ``--mfu`` / ``--mbu``, and the tokens a chip trains a second in one LOOP iteration
(``--episodes`` x ``--tokens``: every episode sampled, then one update). Its last line is
``{"phases": {"sft": {"peak_gib_per_chip", "fits", "projected_s"}, "update", "admit",
"decode", "eval", "export"}, "projected_tokens_per_s_per_chip"}``; the line before it
(``details:``) is the whole record.

Usage:
  python benchmarks/pod_plan.py --model qwen2.5-7b --topology v5e:16x16 --recipe loop \\
      --episodes 512 --tokens 4096
  python benchmarks/pod_plan.py --model qwen2.5-32b --lora 16 --topology v5e:16x16
  python benchmarks/pod_plan.py --model qwen2.5-0.5b --cpu-devices 8 --episodes 16 --tokens 1024
  python benchmarks/pod_plan.py --model qwen2.5-7b --topology v5e:16x16 --phase rollout \\
      --episodes 256 --tokens 8192 --scan-layers
  /work/gpuvenv/bin/python benchmarks/pod_plan.py --model qwen2.5-7b --topology h100:8 \\
      --phase all --episodes 512 --tokens 4096 --scan-layers
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
    # ``ModelConfig.test``'s shapes: the planner's own tests
    "tiny": (128, 64, 2, 4, 2, 16, 96, False, True, 1e4),
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
    # NVIDIA: the deviceless targets below (device_memory_size), dense bf16 tensor-core
    # peak without sparsity, HBM bandwidth.
    "NVIDIA H100 80GB HBM3": (84978434048 / 2**30, 989e12, 3.35e12),
    "NVIDIA H200": (150754820096 / 2**30, 989e12, 4.8e12),
    "NVIDIA A100-SXM4-80GB": (85100068864 / 2**30, 312e12, 2.039e12),
    "cpu": (None, None, None),
}

# XLA's GpuTargetConfig (``stream_executor/device_description.proto``) as text: what XLA:GPU
# compiles for when no GPU is attached. Fields as in XLA's own specs
# (``xla/tools/hlo_opt/gpu_specs/h100_sxm.txtpb``, ``a100_sxm_80.txtpb``); the H200 is the
# H100's SM (GH100, 132 SMs) with 141 GB of HBM3e at 4.8 TB/s.
_GPU_SPEC = """gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: {smem_core}
  threads_per_core_limit: 2048
  core_count: {sms}
  fpus_per_core: {fpus}
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {bandwidth}
  l2_cache_size: {l2}
  clock_rate_ghz: {clock}
  device_memory_size: {memory}
  shared_memory_per_block_optin: {smem_optin}
  cuda_compute_capability {{
    major: {cc_major}
    minor: 0
  }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{
  major: 9
  minor: 8
}}
runtime_version {{
  major: 12
  minor: 8
}}
device_description_str: "{name}"
"""
_HOPPER = dict(smem_core=233472, sms=132, fpus=128, l2=52428800, clock=1.98, smem_optin=232448)
GPU_TARGETS = {
    "h100": _GPU_SPEC.format(
        **_HOPPER, bandwidth=3352320000000, memory=84978434048, cc_major=9,
        name="NVIDIA H100 80GB HBM3",
    ),
    "h200": _GPU_SPEC.format(
        **_HOPPER, bandwidth=4800000000000, memory=150754820096, cc_major=9, name="NVIDIA H200"
    ),
    "a100": _GPU_SPEC.format(
        smem_core=167936, sms=108, fpus=64, l2=41943040, clock=1.41, smem_optin=166912,
        bandwidth=2039040000000, memory=85100068864, cc_major=8, name="NVIDIA A100-SXM4-80GB",
    ),
}  # fmt: skip
GPU_VENV = "bash scripts/gpu_compiler_venv.sh (then run this with /work/gpuvenv/bin/python)"


class PlanError(Exception):
    """A set-up problem the user fixes (a missing compiler, a bad topology): one line."""


def gpu_topology(name: str) -> tuple[str, int] | None:
    """("h100", 8) for "h100:8"; None for a name that is not a GPU target."""
    kind, _, count = name.partition(":")
    if kind not in GPU_TARGETS:
        return None
    if not count.isdigit() or int(count) < 1:
        raise PlanError(f"--topology {name!r}: give the GPU count, e.g. {kind}:8")
    return kind, int(count)


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
    ap.add_argument(
        "--minibatch", type=int, default=0, help="rows an optimiser step (0: --episodes)"
    )
    ap.add_argument(
        "--fused-optimizer",
        action="store_true",
        help="rl.update.fused_optimizer (the optimiser step inside the backward pass; one "
        "microbatch an optimiser step, so --minibatch defaults to the gradient step's rows)",
    )
    ap.add_argument(
        "--phase",
        default="update",
        choices=("update", "sft", "rollout", "all"),
        help="all: sft, update, rollout admit and decode, eval sampling, export, one table",
    )
    ap.add_argument(
        "--eval-rows",
        type=int,
        default=0,
        help="all: rows evaluation samples at once (0: --episodes, the rollout's programs)",
    )
    ap.add_argument("--mbu", type=float, default=0.6, help="HBM bandwidth fraction assumed")
    ap.add_argument(
        "--slots",
        type=int,
        default=0,
        help="rollout: KV slots of the pool (0: --episodes, every episode at once; fewer: "
        "the episodes sampled in waves of this many)",
    )
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
        choices=("blockwise", "splash", "cudnn", "auto"),
        help="model.attention for long rows: pure-JAX tiles, the Pallas splash kernel (TPU), "
        "cuDNN flash attention (GPU), or auto (by the target's platform)",
    )
    args = ap.parse_args(argv)
    if not args.cpu_devices and gpu_topology(args.topology):
        # XLA:GPU compiles for the deviceless target; nothing may look for a real GPU.
        os.environ["JAX_PLATFORMS"] = "cpu"
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

    gpu = gpu_topology(args.topology)
    if gpu:
        kind, count = gpu
        try:
            import jax_plugins.xla_cuda12  # noqa: F401  (the CUDA PJRT plugin: XLA:GPU)
        except ImportError:
            raise PlanError(
                f"--topology {args.topology} needs XLA's GPU compiler (no GPU): {GPU_VENV}"
            ) from None
        hosts, per_host = (count // 8, 8) if count > 8 and count % 8 == 0 else (1, count)
        desc = topologies.get_topology_desc(
            platform="cuda", target_config=GPU_TARGETS[kind], topology=f"1x{hosts}x{per_host}"
        )
        return desc.devices, args.topology
    try:
        desc = topologies.get_topology_desc(platform="tpu", topology_name=args.topology)
    except Exception as err:  # no libtpu, or a name libtpu does not know
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise PlanError(
            f"--topology {args.topology}: XLA's TPU compiler could not describe it ({first}); "
            "it needs `pip install libtpu` (or TPU_LIBRARY_PATH=/path/to/libtpu.so), and a "
            f"name such as v5e:16x16; GPU targets: {', '.join(k + ':8' for k in GPU_TARGETS)}"
        ) from None
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


def plan(args, phase: str = "update") -> dict:
    """The trainer's update step (``phase`` "update"), or the warm start's SFT step ("sft":
    ``train.sft.make_sft_step`` over ``sft_recipe``, the run's LoRA and remat), born sharded
    in the same layout."""
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
    recipe = "sft" if phase == "sft" else args.recipe
    rl = get_recipe(
        recipe,
        lora={"rank": args.lora, "dtype": args.lora_dtype},
        optim={"moments_dtype": args.moments_dtype},
        update={
            "minibatch_size": args.minibatch
            or (rows_per_step if args.fused_optimizer else args.episodes),
            "microbatch_size": rows_per_step,
            "num_epochs": 1,
            "shuffle": False,
            "fused_optimizer": args.fused_optimizer,
        },
    )
    if phase == "sft":
        # The warm start's own recipe (``train.sft.sft_recipe``: the sft loss, the run's LoRA
        # and remat) with its optimiser schedule (warm-up, then decay over its steps).
        from jaxagent.rl.config import LoraConfig
        from jaxagent.train.sft import sft_recipe

        lora = LoraConfig(rank=args.lora, dtype=args.lora_dtype) if args.lora else None
        rl = sft_recipe(1e-5, 100, args.episodes, rows_per_step, lora, remat=True).override(
            optim={"moments_dtype": args.moments_dtype}
        )
        optimizer = make_optimizer(rl, "wsd", 100)
    else:
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
    placement = dict(
        mesh=mesh,
        state_sharding=jax.tree.map(lambda x: x.sharding, state),
        batch_sharding=b_sh,
        rules=layout.rules,
    )
    if phase == "sft":  # the trainer's SFT step itself (train/sft.py)
        from jaxagent.train.sft import make_sft_step

        step = make_sft_step(
            graphdef, rl, optimizer, activation_sharding=layout.activation_sharding(), **placement
        )
    else:
        step = make_update_step(rl, optimizer=optimizer, logprob_fn=logprob_fn, **placement)
    t0 = time.perf_counter()
    lowered = step.lower(state, batch)
    t1 = time.perf_counter()
    head = {
        "phase": phase,
        "model": args.model,
        "topology": where,
        "chip": kind,
        "chips": n,
        "mesh": f"data={data},fsdp={fsdp},tensor={tensor}",
        "recipe": recipe + (f"+lora{args.lora}" if args.lora else ""),
        "param_dtype": param_dtype,
        "dtype": args.dtype,
        "scan_layers": args.scan_layers,
        "attention": args.attention,
        "episodes": b,
        "tokens": t,
        "rows_per_gradient_step": rows_per_step,
        "rows_per_optimiser_step": rl.update.minibatch_size,
        "fused_optimizer": rl.update.fused_optimizer,
        "hbm_gib": None if hbm_gib is None else round(hbm_gib, 2),
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
    # Which attention kernel the program runs: cuDNN's fused attention is a custom call.
    cudnn_calls = compiled.as_text().count('custom_call_target="__cudnn$fmha')
    cost = compiled.cost_analysis()  # empty for XLA:GPU programs
    cost = (cost[0] if cost else {}) if isinstance(cost, (list, tuple)) else (cost or {})
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
        "cudnn_attention_calls": cudnn_calls,
        "argument_gib": round(mem.argument_size_in_bytes / gib, 3),
        "output_gib": round(mem.output_size_in_bytes / gib, 3),
        "temp_gib": round(mem.temp_size_in_bytes / gib, 3),
        "alias_gib": round(mem.alias_size_in_bytes / gib, 3),
        "peak_gib_per_chip": round(peak / gib, 3),
        "bytes": {
            "argument": mem.argument_size_in_bytes,
            "output": mem.output_size_in_bytes,
            "temp": mem.temp_size_in_bytes,
            "alias": mem.alias_size_in_bytes,
            "peak": peak,
        },
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
        tensor = args.tensor or min(4, n)
        data, fsdp = n // tensor, 1
    mesh = make_mesh(MeshConfig(data=data, fsdp=fsdp, tensor=tensor), devices=devices)
    graphdef = abstract_graphdef(cfg)
    params = jax.eval_shape(lambda key: init_model(cfg, key)[1], jax.random.key(0))
    p_sh = param_shardings(
        params, param_logical_axes(graphdef, params), mesh, replica_rules(DEFAULT_RULES)
    )
    params = _placed(params, p_sh)
    s, cap = args.slots or args.episodes, args.tokens
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
        "hbm_gib": None if hbm_gib is None else round(hbm_gib, 2),
        "weights_gib_per_chip": round(weights_b / gib, 3),
        "kv_cache_gib_per_chip": round(kv_b / gib, 3),
        "decode_kernels_gib_per_chip": round(fused_b / gib, 3),
        "slots_per_data_shard": s // shards if s % shards == 0 else s,
        "decode_bytes_per_step": step_b,
        "decode_weight_bytes_per_step": weights_b - embed_b,
        "decode_kv_bytes_per_step": kv_b,
        "hbm_bytes_per_s": bandwidth,
        "decode_step_ms_at_hbm_bw": None if not bandwidth else round(step_b / bandwidth * 1e3, 6),
        "init_compile_s": round(init_s, 1),
        "programs": {},
    }
    programs = (
        ("admit", sampler._admit, admit_args, sampler.admit_static(params)),
        ("decode", sampler._decode, (None,), {}),
    )  # every slot
    for name, fn, extra, static in programs:
        t0 = time.perf_counter()
        lowered = fn.lower(params, fused, state, *extra, **static)
        t1 = time.perf_counter()
        out["programs"][name] = _memory(lowered, hbm_gib) | {"lower_s": round(t1 - t0, 1)}
    out["peak_gib"] = {k: v["peak_gib_per_chip"] for k, v in out["programs"].items()}
    # A program's arguments count only the buffers it reads; the weights, the decode kernels
    # and the cache are all resident through the rollout, so a call's true peak is all of
    # them plus its temporaries.
    resident = (weights_b + fused_b + kv_b) / gib
    out["resident_gib_per_chip"] = round(resident, 3)
    out["peak_with_resident_gib"] = {
        k: round(resident + v["temp_gib"], 3)
        for k, v in out["programs"].items()
        if v.get("temp_gib") is not None
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
        "cudnn_attention_calls": compiled.as_text().count('custom_call_target="__cudnn$fmha'),
        "argument_gib": round(mem.argument_size_in_bytes / gib, 3),
        "output_gib": round(mem.output_size_in_bytes / gib, 3),
        "temp_gib": round(mem.temp_size_in_bytes / gib, 3),
        "temp_bytes": mem.temp_size_in_bytes,
        "alias_gib": round(mem.alias_size_in_bytes / gib, 3),
        "peak_gib_per_chip": round(peak / gib, 3),
        "fits": None if hbm_gib is None else peak / gib <= hbm_gib,
        "compile_s": round(time.perf_counter() - t0, 1),
    }


def _against(r: dict, fits=...) -> str:
    """ "of 79.1 GiB HBM (fits: True)", or "(no HBM limit: cpu devices)"."""
    if r["hbm_gib"] is None:
        return f"(no HBM limit: {r['chip']} devices)"
    return f"of {r['hbm_gib']:.1f} GiB HBM (fits: {r['fits'] if fits is ... else fits})"


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
            what = "DOES NOT FIT" if m["temp_gib"] is not None else "DID NOT COMPILE"
            print(f"{name}: {what}: {m['compile_error']} (compile {m['compile_s']} s)")
            continue
        print(
            f"{name}: arguments {m['argument_gib']} GiB, outputs {m['output_gib']} GiB, "
            f"temporaries {m['temp_gib']} GiB, aliased {m['alias_gib']} GiB -> peak "
            f"{m['peak_gib_per_chip']} GiB {_against(r, m['fits'])}; "
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


def export_plan(args) -> dict:
    """``jaxagent export`` (``models.hf.save_hf``) at this scale, from its own tensor layout
    (``_hf_layout``); nothing to compile: it streams, each HF tensor fetched from the
    (sharded) parameters with ``jax.device_get``, laid out and cast on the host and written
    before the next. Host: the largest tensor as fetched plus its stored-dtype copy. Device:
    nothing beside the state, except with ``scan_layers`` one layer sliced from a stacked
    parameter (split as the parameter is: its bytes over the chips, at most)."""
    import numpy as np

    from jaxagent.models.hf import _hf_layout

    param_dtype = args.param_dtype or ("bfloat16" if args.lora else "float32")
    cfg = _model_config(args, param_dtype)
    store = np.dtype(cfg.jnp_param_dtype)  # save_hf's default stored dtype
    fetched = np.dtype(cfg.jnp_param_dtype)
    sizes = [int(np.prod(shape, dtype=np.int64)) for _, shape, _, _ in _hf_layout(cfg).values()]
    layer_sizes = [
        int(np.prod(shape, dtype=np.int64))
        for _, shape, _, layer in _hf_layout(cfg).values()
        if layer is not None
    ]
    devices, where = _devices(args)
    gib = 2.0**30
    host = max(sizes) * (fetched.itemsize + store.itemsize)
    device = max(layer_sizes, default=0) * fetched.itemsize / len(devices)
    return {
        "phase": "export",
        "stored_dtype": cfg.param_dtype,
        "checkpoint_gib": round(sum(sizes) * store.itemsize / gib, 3),
        "host_gib": round(host / gib, 3),
        "device_extra_gib_per_chip": round(device / gib, 4),
        "topology": where,
        "how": "save_hf streams tensor by tensor (counted from its layout, not compiled)",
    }


def _n_params(args) -> int:
    """Parameters of ``args.model`` from its shapes (a refused compile reports none)."""
    v, d, layers, h, k, hd, f, bias, tie, _ = MODELS[args.model]
    block = d * h * hd * 2 + 2 * d * k * hd + 3 * d * f + 2 * d + (h + 2 * k) * hd * bias
    return v * d * (1 if tie else 2) + layers * block + d


def _dims(args):
    v, d, layers, h, k, hd, f, *_ = MODELS[args.model]
    return dict(v=v, d=d, layers=layers, h=h, k=k, hd=hd, f=f)


def project(args, phases: dict, chips: int, chip: str) -> dict:
    """Each phase's time (a projection, not a measurement): FLOPs by the 6 N T (training)
    and 2 N T (sampling) conventions plus causal attention's QK and PV products
    (4 L H hd per token per attended position, forward), and HBM bytes as counted below,
    at the chip's table peak and bandwidth (the roofline bound: max of the two) and at the
    assumed MFU / bandwidth fraction; then the tokens a chip trains a second in one LOOP
    iteration (every episode sampled, then one update; no overlap)."""
    _, peak, bw = CHIPS.get(chip, (None, None, None))
    if not peak:
        return {}
    m = _dims(args)
    n_params = _n_params(args)
    attn = 4 * m["layers"] * m["h"] * m["hd"]  # FLOPs a token a visible key, forward
    b, t = args.episodes, args.tokens
    prompt = args.prompt_tokens or 2 * args.prefill_chunk
    out = {}

    def phase(name, flops, hbm_bytes, what):
        roof = max(flops / peak, hbm_bytes / bw)
        proj = max(flops / (peak * args.mfu), hbm_bytes / (bw * args.mbu))
        out[name] = {
            "flops_per_chip": flops,
            "hbm_bytes_per_chip": hbm_bytes,
            "roofline_s": round(roof, 3),
            "projected_s": round(proj, 3),
            "bound": "compute" if flops / peak >= hbm_bytes / bw else "bandwidth",
            "counted": what,
        }

    for name in ("sft", "update"):
        r = phases.get(name, {})
        tokens = b * t
        flops = (6 * n_params + 3 * attn * t / 2) * tokens / chips
        micro = max(1, b // max(1, r.get("rows_per_gradient_step", chips)))
        # bf16 weights gathered and read 3x a microbatch (forward, remat, backward), then the
        # optimiser's fp32 state (params, grads, two moments) read and written once a chip.
        hbm = micro * 3 * 2 * n_params + 28 * n_params / chips
        phase(name, flops, hbm, "6NT + attention (causal, T/2 keys); bf16 weights 3x a "
              "microbatch + fp32 optimiser state once")  # fmt: skip
    ro = phases.get("rollout", {})
    tensor = int(ro.get("mesh", "tensor=1").split("tensor=")[-1]) if ro else 1
    weights_b = ro.get("decode_weight_bytes_per_step", 2 * n_params / tensor)
    # admit: the prompts, prefilled in chunks; each chunk reads this chip's weights.
    chunks = -(-prompt // args.prefill_chunk)
    per_shard = ro.get("slots_per_data_shard", b)
    waves = -(-b // ro.get("slots", b))  # the pool samples the episodes this many times over
    flops = (2 * n_params / tensor + attn / tensor * prompt / 2) * prompt * per_shard * waves
    phase("admit", flops, waves * chunks * weights_b, "2NT + attention over the prompt tokens")
    # decode: every generated token of every slot, one step at a time; a step reads the
    # weights and the KV cache of every slot's whole capacity (what attention reads today).
    steps = max(1, t - prompt)
    step_b = ro.get("decode_bytes_per_step", weights_b)
    flops = (2 * n_params / tensor + attn / tensor * t) * per_shard * steps * waves
    phase("decode", flops, step_b * steps * waves, f"{waves} wave(s) of {steps} steps x (2N "
          "+ attention over the capacity) a slot; weights + whole KV cache a step")  # fmt: skip
    rollout_s = out["admit"]["projected_s"] + out["decode"]["projected_s"]
    update_s = out["update"]["projected_s"]
    tokens = b * t
    roof_iter = (
        out["admit"]["roofline_s"] + out["decode"]["roofline_s"] + out["update"]["roofline_s"]
    )
    return {
        "label": "PROJECTION from FLOPs and bytes at table peaks, not a measurement",
        "mfu_assumed": args.mfu,
        "bandwidth_fraction_assumed": args.mbu,
        "phases_projection": out,
        "loop_iteration_s": round(rollout_s + update_s, 2),
        "loop_iteration_roofline_s": round(roof_iter, 2),
        "projected_tokens_per_s_per_chip": round(tokens / (rollout_s + update_s) / chips, 1),
        "roofline_tokens_per_s_per_chip": round(tokens / roof_iter / chips, 1),
        "overlapped_tokens_per_s_per_chip": round(tokens / max(rollout_s, update_s) / chips, 1),
        "published": "NeMo-RL Llama-3.1-8B GRPO on H100 at 4k: 1,581 tokens/s/GPU on-policy, "
        "2,478 one step off-policy",
    }


def all_phases(args) -> dict:
    """Every phase of an iteration, compiled for the target one at a time."""
    import copy

    phases = {}
    phases["sft"] = plan(args, "sft")
    phases["update"] = plan(args)
    phases["rollout"] = rollout_plan(args)
    rows = args.eval_rows or args.slots or args.episodes
    if rows == (args.slots or args.episodes):
        phases["eval"] = {
            "rows": rows,
            "same_programs_as": "rollout",
            "programs": phases["rollout"]["programs"],
            "peak_with_resident_gib": phases["rollout"]["peak_with_resident_gib"],
            "fits": phases["rollout"]["fits"],
        }
    else:
        ev = copy.copy(args)
        ev.episodes, ev.slots = rows, 0
        r = rollout_plan(ev)
        phases["eval"] = {"rows": rows} | {
            k: r[k] for k in ("programs", "peak_with_resident_gib", "fits")
        }
    phases["export"] = export_plan(args)
    u = phases["update"]
    return (
        {"phases": phases}
        | project(args, phases, u["chips"], u["chip"])
        | {
            "head": {
                k: u.get(k)
                for k in (
                    "model",
                    "topology",
                    "chip",
                    "chips",
                    "hbm_gib",
                    "param_dtype",
                    "dtype",
                    "scan_layers",
                    "attention",
                    "episodes",
                    "tokens",
                    "recipe",
                )
            }  # fmt: skip
        }
    )


def _row(name, m, hbm, resident=None):
    if m.get("compile_error"):
        need = m.get("temp_gib")
        asked = f"asked for {need:.2f} GiB temporaries" if need else m["compile_error"][:80]
        return f"| {name} | - | {asked} | - | no (refused) |"
    peak = m["peak_gib_per_chip"] if resident is None else resident
    fits = "-" if hbm is None else ("yes" if peak <= hbm else "no")
    extra = "" if resident is None else f" (with weights, kernels, cache resident: {resident})"
    return (
        f"| {name} | {m['argument_gib']} | {m['temp_gib']} | {m['peak_gib_per_chip']}{extra} "
        f"| {fits} |"
    )


def print_all(r: dict) -> dict:
    """The table, the projection, and the summary the last line carries."""
    h, ph = r["head"], r["phases"]
    hbm = h["hbm_gib"]
    print(
        f"setup: {h['model']} ({h['recipe']}, {h['param_dtype']} params, {h['dtype']} compute, "
        f"{h['attention']} attention, scan_layers {h['scan_layers']}) on {h['topology']} "
        f"({h['chips']} x {h['chip']}, "
        + (f"{hbm:.1f} GiB HBM" if hbm else "no HBM limit")
        + f"); {h['episodes']} episodes x {h['tokens']} tokens"
    )
    print("| phase | arguments GiB/chip | temporaries GiB/chip | peak GiB/chip | fits |")
    print("|---|---|---|---|---|")
    summary = {}
    for name in ("sft", "update"):
        print(_row(name, ph[name], hbm))
        summary[name] = {
            "peak_gib_per_chip": ph[name]["peak_gib_per_chip"],
            "fits": ph[name]["fits"],
        }
    for src in ("rollout", "eval"):
        for prog, m in ph[src]["programs"].items():
            res = ph[src]["peak_with_resident_gib"].get(prog)
            name = prog if src == "rollout" else f"eval {prog}"
            print(_row(name, m, hbm, res))
            key = prog if src == "rollout" else "eval"
            ok = None if hbm is None or res is None else bool(m["fits"] and res <= hbm)
            if m.get("compile_error"):
                ok = False
            if key == "eval" and "eval" in summary:  # eval: the larger of its two programs
                res = max(res or 0, summary["eval"]["peak_gib_per_chip"] or 0)
                ok = None if ok is None else ok and summary["eval"]["fits"]
            summary[key] = {"peak_gib_per_chip": res, "fits": ok}
    ex = ph["export"]
    print(
        f"| export (save_hf, {ex['stored_dtype']}, streamed) | - | "
        f"+{ex['device_extra_gib_per_chip']} beside the state | - | - |"
    )
    print(
        f"export: host {ex['host_gib']} GiB at most (the largest tensor fetched and cast) of "
        f"a {ex['checkpoint_gib']} GiB checkpoint; device +{ex['device_extra_gib_per_chip']} "
        "GiB a chip (counted from save_hf's layout)"
    )
    summary["export"] = {
        "host_gib": ex["host_gib"],
        "device_extra_gib_per_chip": ex["device_extra_gib_per_chip"],
    }
    if r.get("label"):
        print(
            f"{r['label']}: MFU {r['mfu_assumed']:.0%}, HBM bandwidth {r['bandwidth_fraction_assumed']:.0%}"
        )
        for name, p in r.get("phases_projection", {}).items():
            print(
                f"  {name}: {p['flops_per_chip']:.3e} FLOPs, {p['hbm_bytes_per_chip'] / 1e9:.1f} GB "
                f"a chip -> roofline {p['roofline_s']} s ({p['bound']} bound), projected {p['projected_s']} s"
            )
        print(
            f"  one LOOP iteration ({h['episodes']} x {h['tokens']}): {r['loop_iteration_s']} s "
            f"-> {r['projected_tokens_per_s_per_chip']} tokens/s a chip (roofline "
            f"{r['roofline_tokens_per_s_per_chip']}; rollout and update overlapped "
            f"{r['overlapped_tokens_per_s_per_chip']}); published: {r['published']}"
        )
    for name, p in r.get("phases_projection", {}).items():
        summary[name]["projected_s"] = p["projected_s"]
    return {
        "phases": summary,
        "projected_tokens_per_s_per_chip": r.get("projected_tokens_per_s_per_chip"),
    }


def main(argv=None) -> None:
    try:
        _main(argv)
    except PlanError as err:
        print(f"pod_plan: {err}", file=sys.stderr)
        sys.exit(2)


def _main(argv=None) -> None:
    args = _args(argv)
    if args.phase == "all":
        r = all_phases(args)
        summary = print_all(r)
        print("details: " + json.dumps(r, default=str))  # the full record, one line
        print(json.dumps(summary))
        return
    if args.phase == "rollout":
        r = rollout_plan(args)
        print_rollout(r)
        print(json.dumps(r))
        return
    r = plan(args, args.phase)
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
        f"{r['peak_gib_per_chip']} GiB {_against(r)}"
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
