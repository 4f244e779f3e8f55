"""Sampler throughput: jaxagent's jitted sampler vs ``transformers.generate`` (PyTorch).

Same random weights (a HF Llama saved with ``save_pretrained`` and loaded by jaxagent), same
batch, 64-token prompts, 128 new tokens, plain sampling at temperature 1 (no top-k / top-p,
no stop token), KV cache on for both. Reports tokens/s (median of repeats), the ratio, and the
achieved FLOP/s and bytes/s of the decode against this machine's fp32 matmul peak and copy
bandwidth measured in the same run. Ends with one JSON line.

JAX runs on its default backend; torch on CUDA when it has a GPU, else the CPU. The ratio is
reported only when both sides ran on the same kind of device in this run (JAX "gpu" with
torch "cuda", or both "cpu"); otherwise ``ratio_vs_hf`` is null with ``ratio_note`` saying why.

    python benchmarks/generate.py            # all configs
    python benchmarks/generate.py --quick    # fewer repeats
    python benchmarks/generate.py --cpu      # both sides on the CPU
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

if "--cpu" in sys.argv:  # before JAX picks its backend
    os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from jaxagent.generate import Sampler, SamplingConfig  # noqa: E402
from jaxagent.models import load_hf  # noqa: E402
from roofline import ceiling_s, decoder_shape, forward_flops, machine_peaks  # noqa: E402

PROMPT, NEW = 64, 128
CONFIGS = {
    "tiny_b8": dict(batch=8, vocab=8192, hidden=256, layers=4, heads=4, kv=2, mlp=688),
    "tiny_b32": dict(batch=32, vocab=8192, hidden=256, layers=4, heads=4, kv=2, mlp=688),
    "big_b8": dict(batch=8, vocab=32000, hidden=768, layers=12, heads=12, kv=12, mlp=2048),
}


def build(spec: dict, path: str):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=spec["vocab"],
        hidden_size=spec["hidden"],
        num_hidden_layers=spec["layers"],
        num_attention_heads=spec["heads"],
        num_key_value_heads=spec["kv"],
        intermediate_size=spec["mlp"],
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    )
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.save_pretrained(path, safe_serialization=True)
    return model


def torch_device(cpu_only: bool) -> str:
    return "cuda" if torch.cuda.is_available() and not cpu_only else "cpu"


def same_device(jax_backend: str, torch_dev: str) -> str:
    """ "" when a jaxagent / transformers ratio compares like with like, else the reason."""
    if {"gpu": "cuda", "cpu": "cpu"}.get(jax_backend) == torch_dev:
        return ""
    return f"not comparable: jax on {jax_backend}, torch on {torch_dev}"


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_hf(model, prompts: np.ndarray, reps: int) -> tuple[list[float], list[float]]:
    device = next(model.parameters()).device.type
    ids = torch.tensor(prompts, device=device)
    kwargs = dict(
        attention_mask=torch.ones_like(ids),
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=NEW,
        min_new_tokens=NEW,
        eos_token_id=None,
        pad_token_id=0,
        use_cache=True,
    )
    times, cpu = [], []
    with torch.inference_mode():
        model.generate(ids, **{**kwargs, "max_new_tokens": 4, "min_new_tokens": 4})  # warm-up
        for _ in range(reps):
            _sync(device)
            t0, c0 = time.perf_counter(), time.process_time()
            out = model.generate(ids, **kwargs)
            _sync(device)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    assert out.shape[1] == PROMPT + NEW
    return times, cpu


def time_jax(path: str, prompts: np.ndarray, reps: int):
    _, graphdef, params = load_hf(path)
    sampler = Sampler(graphdef)
    cfg = SamplingConfig(max_new_tokens=NEW, temperature=1.0)
    rows = [list(r) for r in prompts]
    t0 = time.perf_counter()
    jax.block_until_ready(sampler(params, rows, cfg, jax.random.key(0)).tokens)
    compile_s = time.perf_counter() - t0
    times, cpu = [], []
    for i in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        out = sampler(params, rows, cfg, jax.random.key(i + 1))
        jax.block_until_ready(out.tokens)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    assert int(np.asarray(out.lengths).min()) == NEW
    return times, cpu, compile_s, sampler


def _shape(spec: dict) -> dict:
    return decoder_shape(
        layers=spec["layers"],
        hidden=spec["hidden"],
        heads=spec["heads"],
        kv_heads=spec["kv"],
        mlp=spec["mlp"],
        head_dim=spec["hidden"] // spec["heads"],
        vocab=spec["vocab"],
    )


def decode_cost(spec: dict, batch: int) -> tuple[float, float]:
    """FLOPs and bytes of one decode step (weights streamed once a step, plus the KV cache)."""
    shape = _shape(spec)
    streamed = shape["layers"] * shape["layer_p"] + shape["hidden"] * shape["vocab"]  # + head
    context = PROMPT + NEW / 2
    flops = forward_flops(**shape, tokens=batch, mean_context=context, head_positions=batch)
    cache_bytes = 2 * shape["layers"] * spec["kv"] * shape["head_dim"] * context * batch * 4
    return flops, 4 * streamed + cache_bytes


def call_ceiling_s(spec: dict, peaks: dict) -> float:
    """Least time for one sampler call at this machine's peaks: the prompt's prefill (FLOPs)
    plus NEW - 1 decode steps (each the larger of its FLOP time and its weight + KV reads)."""
    b = spec["batch"]
    prefill = forward_flops(
        **_shape(spec), tokens=b * PROMPT, mean_context=PROMPT / 2, head_positions=b
    )
    step_flops, step_bytes = decode_cost(spec, b)
    return ceiling_s(prefill, 0, peaks) + (NEW - 1) * ceiling_s(step_flops, step_bytes, peaks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset")
    parser.add_argument("--cpu", action="store_true", help="JAX and torch both on the CPU")
    args = parser.parse_args()
    tdev = torch_device(args.cpu)
    backend = jax.default_backend()
    note = same_device(backend, tdev)
    print(
        f"setup: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"jax {jax.__version__}, torch {torch.__version__} ({torch.get_num_threads()} threads), "
        f"transformers {transformers.__version__}; jax on {backend} "
        f"({jax.devices()[0].device_kind}), torch on {tdev}; fp32, prompt {PROMPT}, new tokens {NEW}, "
        "sampling T=1 (no top-k/top-p), median of repeats"
    )
    peaks = machine_peaks()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"load average (1 min) before the run: {load:.1f} on {os.cpu_count()} CPUs"
        + ("  [machine busy: wall-clock figures are noisy]" if load > 0.5 * os.cpu_count() else "")
    )
    print(
        f"peaks: matmul {peaks['matmul_flop_s'] / 1e9:.1f} GFLOP/s, "
        f"copy {peaks['copy_bytes_s'] / 1e9:.1f} GB/s"
    )
    results = {}
    for name in args.configs.split(","):
        spec = CONFIGS[name]
        big = spec["hidden"] > 256
        reps = 2 if (args.quick or big) else 5
        prompts = np.random.RandomState(0).randint(3, spec["vocab"], (spec["batch"], PROMPT))
        with tempfile.TemporaryDirectory() as path:
            model = build(spec, path).to(tdev)
            hf_times, hf_cpu = time_hf(model, prompts, reps)
            del model
            jax_times, jax_cpu, compile_s, sampler = time_jax(path, prompts, reps)
        tokens = spec["batch"] * NEW
        hf_tok_s = tokens / statistics.median(hf_times)
        jax_s = statistics.median(jax_times)
        jax_tok_s = tokens / jax_s
        flops, step_bytes = decode_cost(spec, spec["batch"])
        steps_s = NEW / jax_s
        results[name] = {
            "jaxagent_tok_s": round(jax_tok_s, 1),
            "hf_tok_s": round(hf_tok_s, 1),
            "ratio_vs_hf": None if note else round(jax_tok_s / hf_tok_s, 2),
            "flop_s_frac_of_peak": round(flops * steps_s / peaks["matmul_flop_s"], 3),
            "bytes_s_frac_of_peak": round(step_bytes * steps_s / peaks["copy_bytes_s"], 3),
            # CPU time (all threads) is less sensitive than wall time to other processes
            # sharing the machine; spin-waiting thread pools inflate it for both.
            "jaxagent_tok_per_cpu_s": round(tokens / statistics.median(jax_cpu), 1),
            "hf_tok_per_cpu_s": round(tokens / statistics.median(hf_cpu), 1),
            "compile_s": round(compile_s, 1),
            "recompiles": sampler.num_compiles,
            # The best any sampler could do here: the same FLOPs at the matmul peak and the
            # same weight / cache reads at the copy bandwidth measured above.
            "ceiling_tok_s": round(tokens / call_ceiling_s(spec, peaks), 1),
        }
        results[name]["ceiling_ratio_vs_hf"] = (
            None if note else round(results[name]["ceiling_tok_s"] / hf_tok_s, 2)
        )
        ratio = f"ratio {jax_tok_s / hf_tok_s:.2f}x" if not note else f"no ratio ({note})"
        print(
            f"{name}: batch {spec['batch']}, D {spec['hidden']} x {spec['layers']} layers, "
            f"vocab {spec['vocab']}: transformers.generate {hf_tok_s:.0f} tok/s (anchor), "
            f"jaxagent {jax_tok_s:.0f} tok/s, {ratio}; "
            f"decode ~{flops * steps_s / 1e9:.1f} GFLOP/s "
            f"({100 * flops * steps_s / peaks['matmul_flop_s']:.0f}% of peak), "
            f"~{step_bytes * steps_s / 1e9:.1f} GB/s "
            f"({100 * step_bytes * steps_s / peaks['copy_bytes_s']:.0f}% of copy bandwidth); "
            f"compile {compile_s:.1f}s; per CPU-second: jaxagent "
            f"{results[name]['jaxagent_tok_per_cpu_s']:.0f}, transformers "
            f"{results[name]['hf_tok_per_cpu_s']:.0f} tok; ceiling at the measured peaks "
            f"{results[name]['ceiling_tok_s']:.0f} tok/s "
            f"(ratio {results[name]['ceiling_ratio_vs_hf']} to transformers)"
        )
    print(
        json.dumps(
            {
                "benchmark": "generate",
                "jax_backend": backend,
                "torch_device": tdev,
                "ratio_note": note or "same device, same run",
                "load_avg_1min": round(load, 2),
                "peaks": peaks,
                **results,
            }
        )
    )


if __name__ == "__main__":
    main()
