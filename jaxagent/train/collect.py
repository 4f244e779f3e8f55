"""Collection: the policy's weights in, one iteration's learner batch out.

``Collector.collect(it, version, params)`` samples iteration ``it``'s tasks with ``params``
(policy ``version``) on a collection lane (``overlap.lanes``: each its own sampler and
environment pool), through the built-in driver (``jaxagent.agents.rollout``, with DAPO's
dynamic-sampling refills: ``jaxagent.train.dapo``) or an agent harness against this run's
own server (``harness.entry``), packs the episodes into one host-side token batch (row drops
decided there), adds critic values for PPO, and returns a ``Collected``: the batch's arrays
and the figures the iteration's record needs of its episodes (train success, data shaping,
staleness, rollout statistics). No episode outlives its collection, so what an overlapped
run's checkpoint keeps of a batch sampled with older weights is arrays and numbers
(``pending_items`` / ``restored_items``), never pickled objects.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Callable

import jax
import numpy as np

from jaxagent.agents import hosts
from jaxagent.agents.batch import RowDrops, pack_episodes
from jaxagent.agents.rollout import RolloutSpec, RolloutStats, collect_episodes
from jaxagent.eval.report import summarize
from jaxagent.generate.sampler import release_decode_kernels
from jaxagent.parallel.distributed import host_local, task_shard
from jaxagent.parallel.layout import DeviceLayout, added_bytes
from jaxagent.perf.roofline import Roofline, iteration_metrics
from jaxagent.rl.prepare import with_critic_values
from jaxagent.rl.train_state import TrainState, on_sampling_params
from jaxagent.serve.harness import collect_harness_episodes, load_harness
from jaxagent.train import dapo
from jaxagent.train.config import Config
from jaxagent.train.overlap import Produced, staleness_metrics
from jaxagent.train.run import Run, iteration_tasks, rows_multiple
from jaxagent.types import TokenBatch

__all__ = ["Collected", "Collector", "pending_items", "restored_items"]


def _plain(v):
    """A metric as a JSON value that reads back equal (numpy scalars become Python's)."""
    return v.item() if isinstance(v, np.generic) else v


@dataclasses.dataclass
class Collected:
    """One iteration's learner batch and what its record needs of the episodes.

    Attributes:
      batch: the packed host batch (numpy ``TokenBatch``; critic values included).
      metrics: the episode-side figures (``train/*`` of the first round's episodes, DAPO's
        ``data/*``, ``async/staleness*``), plain numbers.
      stats: the rollout statistics, summed over sampling rounds and gathered over hosts.
      collect_s, pack_s: seconds collecting, and packing (critic values included).
    """

    batch: TokenBatch
    metrics: dict[str, Any]
    stats: RolloutStats
    collect_s: float = 0.0
    pack_s: float = 0.0

    def arrays(self) -> dict[str, np.ndarray]:
        """The batch's columns (those it has) as numpy arrays."""
        return {
            f.name: np.asarray(getattr(self.batch, f.name))
            for f in dataclasses.fields(self.batch)
            if getattr(self.batch, f.name) is not None
        }

    def record(self) -> dict:
        """Everything but the arrays, as JSON values."""
        return {
            "metrics": {k: _plain(v) for k, v in self.metrics.items()},
            "stats": {k: _plain(v) for k, v in dataclasses.asdict(self.stats).items()},
            "collect_s": float(self.collect_s),
            "pack_s": float(self.pack_s),
        }

    @classmethod
    def from_saved(cls, arrays: dict[str, np.ndarray], record: dict) -> "Collected":
        return cls(
            batch=TokenBatch(**{k: np.asarray(v) for k, v in arrays.items()}),
            metrics=dict(record["metrics"]),
            stats=RolloutStats(**record["stats"]),
            collect_s=float(record["collect_s"]),
            pack_s=float(record["pack_s"]),
        )


def pending_items(items: dict[int, Produced]) -> tuple[dict, dict]:
    """Produced batches as ``(arrays, record)`` for a checkpoint: the arrays (a pytree of
    numpy arrays, ``{str(index): {column: array}}``) go to its orbax item, the record (index,
    version, times, metrics: JSON) to its meta."""
    arrays = {str(j): item.payload.arrays() for j, item in items.items()}
    record = {
        str(j): {
            "version": item.version,
            "sampler_wait_s": float(item.sampler_wait_s),
            "producer_collect_s": float(item.collect_s),
            **item.payload.record(),
        }
        for j, item in items.items()
    }
    return arrays, record


def restored_items(arrays: dict, record: dict) -> dict[int, Produced]:
    """``pending_items``' output read back from a checkpoint."""
    if set(arrays) != set(record):
        raise ValueError(
            f"the checkpoint's pending batches {sorted(arrays)} do not match its meta's "
            f"{sorted(record)}"
        )
    return {
        int(j): Produced(
            int(j),
            int(r["version"]),
            Collected.from_saved(arrays[j], r),
            r["sampler_wait_s"],
            r["producer_collect_s"],
        )
        for j, r in record.items()
    }


class Collector:
    """The rollout side of a run: lanes, harness server, dynamic sampling, packing.

    Args:
      config: the run config.
      run: the built run (``jaxagent.train.run.build_run``); its parameters are only read
        for their shapes (the roofline), and not kept.
      layout: the run's device layout (sampling weights' placement, batch multiple).
      echo: where one-line notes go (the harness server's address).
    """

    def __init__(self, config: Config, run: Run, layout: DeviceLayout, echo: Callable):
        self.config, self.rl, self.layout, self.echo = config, config.rl_config, layout, echo
        self._run = dataclasses.replace(run, params=None)
        self.train_tasks = run.tasks.train
        self._sample_key = run.sample_key
        # Lane 0 is the run's sampler and pool (the evaluation's too); the others are made
        # on first use and closed here.
        self._lanes: list[tuple[Any, RolloutSpec]] = [(run.sampler, run.rollout)]
        self._lanes_lock = threading.Lock()
        # An agent harness instead of the built-in driver: it talks to this run's own server
        # (started at the first rollout, given each new policy version after).
        self._harness = load_harness(config.harness.entry) if config.harness.entry else None
        self._server = None
        self._rows_multiple = rows_multiple(config, layout.batch_devices)
        # Per host: each process's rollout and its share of the update over its devices.
        devices = layout.devices() if jax.process_count() == 1 else jax.local_devices()
        self.roofline = Roofline.create(run.model_config, run.params, devices)

    def tasks(self, it: int) -> list:
        """Iteration ``it``'s tasks (every host's)."""
        per, seed = self.config.rollout.tasks_per_iteration, self.config.train.seed
        return iteration_tasks(self.train_tasks, per, seed, it)

    def weights(self, state: TrainState, own_copy: bool) -> tuple[TrainState, Any, dict]:
        """``(state, the weights the rollout samples with, their placement metrics)``.

        LoRA samples from a merged copy (the base is never written: bit-identical);
        ``mesh.rollout_layout`` / ``sampling_dtype``: one on-device reshard; several
        processes: each samples on every one of its own devices; disaggregated: the
        sampler's own devices. ``own_copy``: never the state's own buffers (the update
        donates those while an overlapped rollout still samples)."""

        def place(merged):
            rollout = self.layout.rollout_params(merged)
            params = host_local(rollout, self.layout.host_shardings(rollout))
            if self.layout.sampler_mesh is not None:
                params = self.layout.to_sampler(params)
            elif own_copy and not added_bytes(params, merged):
                params = jax.tree.map(lambda x: x.copy(), params)
            placed = {
                "sampler/devices": len(jax.tree.leaves(params)[0].sharding.device_set),
                # per chip; 0: samples in place
                "mem/sampling_weights_gib": added_bytes(params, merged) / 2**30,
            }
            return params, placed

        state, (params, placed) = on_sampling_params(state, place)
        return state, params, placed

    def collect(self, it: int, version: int, params, refresh=None, lane: int = 0) -> Collected:
        """Iteration ``it``'s batch sampled with ``params`` (policy ``version``; with partial
        rollouts, ``refresh`` hands newer weights between turns) on lane ``lane``."""
        t0 = time.perf_counter()
        tasks = self.tasks(it)
        mine = task_shard(tasks)  # this host's slice (every task with one process)
        with self._lanes_lock:
            while len(self._lanes) <= lane:
                self._lanes.append(self._run.make_lane())
            sampler, spec = self._lanes[lane]
        drawn = self._episodes(params, it, tasks, mine, version, refresh, sampler, spec)
        t1 = time.perf_counter()
        batch, m = self._pack(drawn.episodes, rows=len(mine) * self.config.group_size)
        if self.rl.critic.enabled:  # values, and the bootstrap value of a truncated row
            batch = jax.tree.map(np.asarray, with_critic_values(self._run.graphdef, params, batch))
        # The rollout's extra buffers go before the update allocates gradients and moments.
        release_decode_kernels()
        pack_s = time.perf_counter() - t1
        if self.config.rl.data.dynamic_sampling:
            m.update(drawn.metrics())
        m.update(summarize(hosts.gather_episodes(drawn.first_round)).as_metrics("train"))
        if self.config.overlap.staleness:
            m.update(staleness_metrics(drawn.episodes, it, self.config.overlap.staleness))
        stats = hosts.gather_stats(drawn.total_stats())
        return Collected(batch, m, stats, collect_s=t1 - t0, pack_s=pack_s)

    def _episodes(
        self, params, it: int, tasks: list, mine: list, version: int, refresh, sampler, spec
    ) -> dapo.DynamicSample:
        """This host's episodes of iteration ``it`` (``mine``: its slice of ``tasks``; with
        dynamic sampling, refilled until the batch holds enough informative groups)."""
        first = jax.process_index() * len(mine)
        key = jax.random.fold_in(self._sample_key, it)
        per_task, data = self.config.group_size, self.config.rl.data
        hosts.set_row_offset(sampler, first * per_task)

        if self._harness is not None:
            t0 = time.perf_counter()
            eps = self._harness_episodes(params, mine, key, it * len(tasks) + first, version)
            stats = RolloutStats(
                policy_tokens=sum(ep.num_policy_tokens for ep in eps),
                wall_s=time.perf_counter() - t0,
                generate_s=time.perf_counter() - t0,  # the server's and the harness's time
            )
            return dapo.DynamicSample.one_round(eps, stats)

        def collect(round_):  # round 0: the iteration's tasks; later: dynamic-sampling refills
            todo = (
                mine
                if round_ == 0
                else dapo.refill_tasks(
                    self.train_tasks, len(tasks), self.config.train.seed, it, round_
                )
            )
            return collect_episodes(
                sampler,
                params,
                todo,
                samples_per_task=per_task,
                spec=spec,
                key=jax.random.fold_in(key, round_) if round_ else key,
                group_offset=(it + round_) * len(tasks) + first,  # unique within the batch
                version=version,
                refresh=refresh,
            )

        if data.dynamic_sampling:
            return dapo.dynamic_sample(collect, len(tasks), data.max_sampling_rounds)
        return dapo.DynamicSample.one_round(*collect(0))

    def _harness_episodes(self, params, tasks: list, key, group_offset: int, version: int):
        """The episodes of ``harness.entry`` run on every (task, sample) against this run's
        server, sampling with ``params`` as policy ``version`` (the driver's key and rows)."""
        h = self.config.harness
        if self._server is None:
            # starlette / uvicorn are the serve extra's: imported only by a harness run
            from jaxagent.serve.server import ServerThread, state_for_run

            state = state_for_run(
                self._run,
                model_id=self.config.name,
                params=params,
                policy_version=version,
                slots=h.slots,
                decode_steps=self.config.rollout.decode_steps,
                seed=self.config.train.seed,
                episodes=h.episodes_out,  # every harness episode as a JSON line
            )
            self._server = ServerThread(state)
            self.echo(
                f"[harness] {h.entry} runs every (task, sample) against this run's policy on "
                f"{self._server.base_url} ({h.concurrency} at once)"
                + (f"; episodes to {h.episodes_out}" if h.episodes_out else "")
            )
        else:
            self._server.state.update_policy(params, version)
        return collect_harness_episodes(
            self._server,
            self._harness,
            tasks,
            samples_per_task=self.config.group_size,
            key=key,
            group_offset=group_offset,
            concurrency=h.concurrency,
            timeout_s=h.timeout_s,
            reward_fn=h.reward_fn(),  # harness.reward: scores a harness returning None
        )

    def _pack(self, eps: list, rows: int) -> tuple[TokenBatch, dict]:
        """The episodes as one host-side token batch of ``rows`` rows (row drops decided here,
        as a row-weight column) and the data-shaping metrics; the update step places it on
        the mesh."""
        data, r, run = self.config.rl.data, self.config.rollout, self._run
        batch = pack_episodes(
            eps,
            pad_id=run.chat.pad_id,
            max_len=run.max_len,
            length_multiple=data.length_multiple,
            length_pow2=data.length_buckets == "pow2",
            rows=rows,
            rows_multiple=self._rows_multiple,
            drops=RowDrops(
                overlong=data.overlong_filter,
                truncated=self.rl.advantage.truncated == "drop",
                uninformative_groups=data.dynamic_sampling,
            ),
            max_turns=r.max_turns if self.rl.needs_turns else 0,  # step-level credit (GiGPO)
        )
        batch = hosts.common_length(batch, run.chat.pad_id)
        batch, data_m = dapo.shape_batch(batch, eps, data, r.max_turns * r.max_new_tokens)
        return jax.tree.map(np.asarray, batch), data_m

    def report(
        self, record: Collected, update_s: float, total_s: float, optimizer_steps: int
    ) -> dict:
        """The iteration's rollout record: the episode-side figures, throughput, each lane's
        environment health and the roofline (``optimizer_steps``: the update's own count)."""
        batch, stats = record.batch, record.stats
        m = dict(record.metrics)
        m.update(hosts.rollout_record(stats, batch, batch.row_weight, update_s, total_s))
        m["sampler/recompiles"] = sum(sampler.recompiles for sampler, _ in self._lanes)
        for i, (_, spec) in enumerate(self._lanes):  # each lane's own pool
            for k, v in spec.runner.health().items():
                m[f"env_health/{f'lane{i}/' if i else ''}{k}"] = v
        r = self.config.rollout
        m.update(
            iteration_metrics(
                self.roofline,
                batch,
                stats,
                m,
                max_new_tokens=r.max_new_tokens,
                update=self.rl.update,
                optimizer_steps=optimizer_steps,
            )
        )
        return m

    def close(self) -> None:
        """Stop the harness server and the extra lanes' pools (lane 0 is the run's)."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for _, spec in self._lanes[1:]:
            spec.runner.close()
        del self._lanes[1:]
