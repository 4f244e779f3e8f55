"""The roofline of every iteration: achieved FLOP/s and bytes/s as fractions of the peak.

``Roofline.create(model_config, params, devices)`` takes the machine's peaks once per
process: measured on CPU (a jitted 1024^3 fp32 matmul and a numpy copy, best of a few), and
on GPU / TPU from ``CHIP_PEAKS`` by ``device_kind`` (dense bf16 FLOP/s and HBM bytes/s per
chip, from the vendors' data sheets) times the devices in the mesh. ``iteration(...)`` turns
one iteration's token counts and timings into metrics (under ``time/``, with the other
wall-clock figures that exact-resume comparisons leave out):

- sampler: every token of an episode passes the model once (the KV cache never re-encodes),
  so FLOPs = 2 x matmul weights x context tokens + attention + the vocabulary head at each
  sampled token; bytes = the weights streamed once per decode step (``rounds x
  max_new_tokens`` steps at most: an upper estimate, decode is memory-bound).
- update: forward + backward (2 forward passes' worth) + the block-remat recompute = 4
  forward passes over the packed batch per epoch, 3 with ``rl.update.remat`` off; bytes =
  per optimiser step the weights read twice (forward, backward), gradients written, Adam's
  two moments read and written, parameters written.
- ``time/env_wait_frac``: the share of the iteration the policy waited for environments.

Fractions of peak are MFU (model FLOPs utilisation) and MBU (bandwidth utilisation).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

# device_kind substring -> (dense bf16 FLOP/s, HBM bytes/s) per chip.
CHIP_PEAKS: tuple[tuple[str, float, float], ...] = (
    ("H200", 989e12, 4.8e12),
    ("H100", 989e12, 3.35e12),
    ("A100", 312e12, 2.0e12),
    ("L4", 121e12, 0.3e12),
    ("A10", 125e12, 0.6e12),
    ("TPU v6", 918e12, 1.64e12),
    ("TPU v5p", 459e12, 2.76e12),
    ("TPU v5", 197e12, 0.82e12),  # v5e / v5 lite
    ("TPU v4", 275e12, 1.2e12),
)
_MEASURED: dict = {}


def measure_cpu_peaks(reps: int = 5) -> tuple[float, float]:
    """(fp32 matmul FLOP/s, copy bytes/s) of this process's CPU, measured once per ``reps``
    and kept: a jitted 1024^3 dot and a numpy copy of 64 MB (past the caches). The best of
    ``reps`` timings each, so that a moment of contention on a shared machine does not lower
    the peak (a lower peak would flatter every fraction-of-peak figure); the benchmarks ask
    for more repetitions than the trainer's once-a-run probe. The one peak probe in
    jaxagent (``benchmarks/`` read it too)."""
    if ("cpu", reps) not in _MEASURED:
        n = 1024
        a = jnp.asarray(np.random.default_rng(0).random((n, n)), jnp.float32)
        f = jax.jit(lambda x: x @ x)
        f(a).block_until_ready()
        best = min(_timed(lambda: f(a).block_until_ready()) for _ in range(reps))
        src = np.ones(16 * 2**20, np.float32)
        dst = np.empty_like(src)
        copy = min(_timed(lambda: np.copyto(dst, src)) for _ in range(reps))
        _MEASURED["cpu", reps] = (2 * n**3 / best, 2 * src.nbytes / copy)
    return _MEASURED["cpu", reps]


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def device_peaks(devices) -> tuple[float, float, str]:
    """(FLOP/s, bytes/s, source) for ``devices`` together."""
    kind = devices[0].device_kind
    if devices[0].platform == "cpu":
        flops, nbytes = measure_cpu_peaks()
        return flops, nbytes, "measured (cpu, all devices share it)"
    for name, flops, nbytes in CHIP_PEAKS:
        if name.lower() in kind.lower():
            return flops * len(devices), nbytes * len(devices), f"table ({kind})"
    return float("nan"), float("nan"), f"unknown chip {kind!r}"


@dataclasses.dataclass(frozen=True)
class Roofline:
    """Peaks and the model's arithmetic; ``iteration`` gives one iteration's metrics."""

    peak_flop_s: float
    peak_bytes_s: float
    source: str
    matmul_params: int  # weights of the blocks' matmuls (embedding gather excluded)
    head_params: int  # hidden x vocab
    param_bytes: int
    layers: int
    attn_width: int  # heads x head_dim
    devices: tuple = ()  # where per-device memory is read (``memory_stats``), if it reports

    @classmethod
    def create(cls, model_config, params, devices: Optional[list] = None) -> "Roofline":
        devices = devices or jax.local_devices()[:1]
        flops, nbytes, source = device_peaks(devices)
        c = model_config
        leaves = jax.tree.leaves(params)
        total = sum(int(x.size) for x in leaves)
        embed = c.vocab_size * c.hidden_size
        head = embed
        untied_head = 0 if c.tie_embeddings else head
        return cls(
            peak_flop_s=flops,
            peak_bytes_s=nbytes,
            source=source,
            matmul_params=total - embed - untied_head,
            head_params=head,
            param_bytes=sum(int(x.size) * x.dtype.itemsize for x in leaves),
            layers=c.num_layers,
            attn_width=c.num_heads * c.head_dim,
            devices=tuple(devices),
        )

    def forward_flops(self, tokens: float, mean_context: float, head_positions: float) -> float:
        attention = 4 * self.layers * self.attn_width * mean_context * tokens
        return 2 * self.matmul_params * tokens + attention + 2 * self.head_params * head_positions

    def iteration(
        self,
        *,
        context_tokens: float,
        sampled_tokens: float,
        decode_steps: float,
        generate_s: float,
        kv_bytes: float = 0.0,
        batch_tokens: float,
        loss_tokens: float,
        epochs: int,
        optimizer_steps: int,
        passes: int = 4,
        update_s: float,
        env_s: float,
        iteration_s: float,
        rows: int,
        real_tokens: float | None = None,
    ) -> dict[str, Any]:
        """One iteration's throughput figures.

        ``time/update_mfu`` counts model FLOPs: 6 N per real (unpadded) token plus attention
        (the convention of Chowdhery et al. 2022, PaLM, appendix B), once per epoch;
        ``time/update_hfu`` and ``time/update_flop_s`` count what the hardware ran: the
        padded batch, the recomputed forward of block remat (``passes``) and the vocabulary
        head only where loss is taken. ``mem/*``: the devices' own figures, where the
        backend reports them (GPU, TPU)."""
        ctx = context_tokens / max(rows, 1) / 2  # mean keys attended per token
        s_flops = self.forward_flops(context_tokens, ctx, sampled_tokens)
        s_bytes = decode_steps * self.param_bytes + kv_bytes
        width = batch_tokens / max(rows, 1)
        u_flops = passes * epochs * self.forward_flops(batch_tokens, width / 2, loss_tokens)
        u_bytes = optimizer_steps * 8 * self.param_bytes
        gs, us = max(generate_s, 1e-9), max(update_s, 1e-9)
        real = batch_tokens if real_tokens is None else real_tokens
        model_flops = 3 * epochs * self.forward_flops(real, real / max(rows, 1) / 2, real)
        return {
            "time/sample_flop_s": s_flops / gs,
            "time/sample_mfu": s_flops / gs / self.peak_flop_s,
            "time/sample_mbu": s_bytes / gs / self.peak_bytes_s,
            "time/update_flop_s": u_flops / us,
            "time/update_mfu": model_flops / us / self.peak_flop_s,
            "time/update_hfu": u_flops / us / self.peak_flop_s,
            "time/update_mbu": u_bytes / us / self.peak_bytes_s,
            "time/env_wait_frac": env_s / max(iteration_s, 1e-9),
            **device_memory(self.devices),
        }


def device_memory(devices) -> dict[str, float]:
    """The largest ``peak_bytes_in_use`` and ``bytes_in_use`` over ``devices`` in GiB
    (``mem/peak_gib``, ``mem/in_use_gib``; the peak since the process started), or nothing
    where the backend keeps no such figures (CPU)."""
    stats = [s for s in (d.memory_stats() for d in devices) if s]
    if not stats:
        return {}
    gib = float(1 << 30)
    return {
        "mem/peak_gib": max(s.get("peak_bytes_in_use", 0) for s in stats) / gib,
        "mem/in_use_gib": max(s.get("bytes_in_use", 0) for s in stats) / gib,
        "mem/limit_gib": min(s.get("bytes_limit", 0) for s in stats) / gib,
    }


def iteration_metrics(
    roof: Roofline,
    batch,
    stats,
    metrics: dict,
    *,
    max_new_tokens: int,
    update,
    optimizer_steps: int,
) -> dict:
    """``Roofline.iteration`` from what the trainer has after an iteration: the packed
    ``batch`` (numpy), the rollout ``stats``, the iteration's ``metrics`` (times), the
    recipe's ``update`` section (epochs, remat) and the optimiser steps the update took (its
    ``optim/steps``: epochs x minibatches, which the epochs alone undercount)."""
    rows, width = batch.tokens.shape
    real = float(np.sum(np.asarray(batch.segment_ids) != 0))
    return roof.iteration(
        context_tokens=real,
        real_tokens=real,
        sampled_tokens=float(stats.policy_tokens),
        # The engine counts its decode steps and the KV bytes they read; the lock-step
        # driver's rounds run at most max_new_tokens steps each (an upper bound).
        decode_steps=float(stats.decode_steps or stats.rounds * max_new_tokens),
        kv_bytes=float(stats.kv_bytes),
        generate_s=float(stats.generate_s),
        batch_tokens=float(rows * width),
        loss_tokens=float(np.sum(np.asarray(batch.loss_mask))),
        epochs=update.num_epochs,
        optimizer_steps=optimizer_steps,
        passes=4 if update.remat else 3,
        update_s=float(metrics["time/update_s"]),
        env_s=float(stats.env_s),
        iteration_s=float(metrics["time/iteration_s"]),
        rows=rows,
    )


def progress_fields(metrics: dict) -> dict:
    """The roofline's part of the progress line: MFU of sampler and update, env wait."""
    if "time/update_mfu" not in metrics:
        return {}
    return {
        "mfu_sample": f"{metrics['time/sample_mfu']:.1%}",
        "mfu_update": f"{metrics['time/update_mfu']:.1%}",
        "env_wait": f"{metrics['time/env_wait_frac']:.0%}",
        **(
            {"slots": f"{metrics['rollout/slot_occupancy']:.0%}"}
            if "rollout/slot_occupancy" in metrics
            else {}
        ),
    }
