"""The trainer's rollout over several hosts: slices, row numbers, common shapes, gathered records.

Each process samples its own slice of an iteration's tasks (``task_shard``) with its own
environment pool and a host-local copy of the weights, then packs its episodes into its own
rows of the global batch. For the result to equal one process sampling everything:

- rows draw from per-row random streams keyed by the global row number (``Sampler``'s
  ``row_ids``), so a row samples the same tokens whichever host holds it;
- every host packs the same number of rows (no padding row between hosts: the row count
  must split evenly) and pads its columns to the longest host's length;
- the per-episode records that metrics are computed from are gathered, so every process
  reports (and process 0 writes) the figures of the whole batch.

With one process every function here is the identity, apart from ``rows_multiple``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from jaxagent.agents.evaluate import Evaluation, evaluate
from jaxagent.agents.rollout import RolloutSpec, RolloutStats
from jaxagent.eval.report import summarize
from jaxagent.parallel.distributed import allgather_objects, host_local, task_slice


def set_row_offset(sampler, first_row: int) -> None:
    """Number ``sampler``'s rows (a ``CachedTurnSampler``'s or a ``SlotEngine``'s) from
    ``first_row``, this host's first global episode: every episode's random stream is keyed
    by its global number, whichever host samples it."""
    if hasattr(sampler, "row_offset"):
        sampler.row_offset = first_row


def common_length(batch, pad_id: int):
    """``batch`` (numpy ``TokenBatch``) with its columns padded to the longest host's."""
    if jax.process_count() == 1:
        return batch
    t = batch.tokens.shape[1]
    masks = batch.constraint_masks
    k = 0 if masks is None else masks.shape[1]
    longest, most = (max(x) for x in zip(*allgather_objects((t, k))))
    if most > k and masks is not None:  # constrained decoding: every row's mask slots alike
        batch = batch.replace(constraint_masks=np.pad(masks, ((0, 0), (0, most - k), (0, 0))))
    if longest == t:
        return batch
    extra = longest - t
    fill = {"tokens": pad_id, "turn_ids": -1, "constraint_ids": -1}

    def pad(name, x):
        if x is None or np.ndim(x) != 2 or x.shape[1] != t:
            return x
        if name == "positions":
            return np.broadcast_to(np.arange(longest, dtype=x.dtype), (x.shape[0], longest)).copy()
        return np.pad(x, ((0, 0), (0, extra)), constant_values=fill.get(name, 0))

    fields = (f.name for f in dataclasses.fields(batch))
    return batch.replace(**{k: pad(k, getattr(batch, k)) for k in fields})


def gather_episodes(episodes: list) -> list:
    """Every host's episodes, in global row order (the identity with one process)."""
    if jax.process_count() == 1:
        return episodes
    return [ep for part in allgather_objects(episodes) for ep in part]


def total(x: float) -> float:
    """``x`` summed over the hosts."""
    return x if jax.process_count() == 1 else sum(allgather_objects(x))


def gather_stats(stats: RolloutStats) -> RolloutStats:
    """Rollout statistics of all hosts: tokens summed, times of the slowest host."""
    if jax.process_count() == 1:
        return stats
    parts = allgather_objects(stats)
    summed = ("policy_tokens", "row_steps", "busy_steps", "kv_bytes", "env_row_s", "device_row_s")
    return RolloutStats(
        **{
            f.name: (sum if f.name in summed else max)(getattr(p, f.name) for p in parts)
            for f in dataclasses.fields(RolloutStats)
        }
    )


def rollout_record(stats: RolloutStats, batch, valid, update_s: float, iteration_s: float) -> dict:
    """An iteration's rollout and batch metrics (stats already gathered over hosts); with the
    slot engine also its slot occupancy (the share of decoded rows generating a turn) and the
    episode-seconds spent waiting for environments and, with a chunk ready, for the device."""
    engine = {}
    if stats.row_steps:
        engine = {
            "rollout/slot_occupancy": stats.busy_steps / stats.row_steps,
            "rollout/decode_steps": stats.decode_steps,
            "rollout/env_wait_row_s": stats.env_row_s,
            "rollout/device_wait_row_s": stats.device_row_s,
        }
    return {
        **engine,
        "time/generate_s": stats.generate_s,
        "time/env_s": stats.env_s,
        "time/update_s": update_s,
        "time/iteration_s": iteration_s,
        "tokens/sampled": stats.policy_tokens,
        "tokens/per_s": stats.policy_tokens / max(stats.generate_s, 1e-9),
        "batch/rows": int(batch.tokens.shape[0]) * jax.process_count(),
        "batch/len": int(batch.tokens.shape[1]),
        "batch/valid_rows": total(float(valid.sum())),
    }


def evaluate_sharded(
    sampler,
    tasks,
    spec: RolloutSpec,
    key,
    params,
    *,
    samples_per_task: int,
    local_shardings: Any = None,
) -> Evaluation:
    """``evaluate`` with each process running its slice of ``tasks`` (as equal as they
    split) from host-local weights (split over its devices by ``local_shardings``); the
    report is of every host's episodes."""
    first, mine = task_slice(tasks)  # every task with one process
    set_row_offset(sampler, first * samples_per_task)
    local = host_local(params, local_shardings)
    result = evaluate(sampler, mine, spec, key, params=local, samples_per_task=samples_per_task)
    if jax.process_count() == 1:
        return result
    eps = gather_episodes(result.episodes)
    return dataclasses.replace(result, report=summarize(eps), episodes=eps)
