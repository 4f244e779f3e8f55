"""The training loop: collect -> advantages -> update -> evaluate -> checkpoint.

``Trainer(config).run()`` starts from ``jaxagent.train.run.build_run`` (task splits,
tokenizer saved in the run directory, chat format, policy, samplers, budget, env runner) and
adds the RL recipe's jitted update step (``jaxagent.rl``), SFT warm-start
(``jaxagent.train.sft``), evaluations (``jaxagent.agents.evaluate``), orbax checkpoints,
JSONL/TensorBoard metrics and a live progress display.

Exact resume: everything random is derived from the config seed and the iteration number
(task order, sampling keys) or lives in the checkpoint (params, optimizer state, update RNG),
and the checkpoint's JSON meta holds the iteration, data position and evaluation history. A
run restarted after a kill reloads the newest checkpoint and produces the same metrics.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import shutil
import threading
import time
from typing import Any, Callable

import jax
import numpy as np

from jaxagent.agents.batch import RowDrops, pack_episodes
from jaxagent.agents.rollout import RolloutSpec, collect_episodes
from jaxagent.eval.report import summarize
from jaxagent.models import abstract_graphdef, abstract_params
from jaxagent.rl.prepare import with_critic_values
from jaxagent.generate.sampler import release_decode_kernels
from jaxagent.rl.train_state import TrainState, begin_sampling, end_sampling, on_sampling_params
from jaxagent.rl.update import make_update_step
from jaxagent.rl.model_fns import model_logprob_fn
from jaxagent.train import dapo, progress
from jaxagent.train.checkpoint import CheckpointError, Checkpointer, complete_steps
from jaxagent.train.checkpoint import check_same_directory, refuse_overwrite
from jaxagent.train.coverage import check_coverage
from jaxagent.train.guards import UpdateGuard
from jaxagent.train.config import Config, config_to_dict, config_to_yaml
from jaxagent.perf import host_memory
from jaxagent.agents import hosts
from jaxagent.parallel.distributed import host_local, is_writer, start_distributed, task_shard
from jaxagent.parallel.layout import DeviceLayout, ShardedUpdate, added_bytes, place
from jaxagent.perf.roofline import Roofline, iteration_metrics, progress_fields
from jaxagent.train.metrics_log import MetricsLogger, NullLogger
from jaxagent.train.policy import run_optimizer
from jaxagent.train.evaluation import RunEvaluation
from jaxagent.train.run import build_run, iteration_tasks, rows_multiple
from jaxagent.train.run_dir import RunLock, check_resume, saved_config, write_atomic
from jaxagent.train.overlap import BUFFER_KEY, Pipeline, Produced, decode_buffer, encode_buffer
from jaxagent.train.overlap import staleness_metrics
from jaxagent.train.sft import low_start_note, warm_start
from jaxagent.serve.harness import collect_harness_episodes, load_harness
from jaxagent.agents.rollout import RolloutStats

__all__ = ["Trainer"]


class Trainer:
    """One run of a config. ``run()`` returns the final summary dict.

    Args:
      config: the run config.
      echo: where human-readable lines go (the CLI prints them).
    """

    def __init__(self, config: Config, echo: Callable[[str], None] = print):
        self._t_init = time.perf_counter()  # wall_s counts set-up (world, tokenizer, model) too
        host_memory.limit_arenas()  # before threads start: a long run's memory stays flat
        start_distributed(config.distributed)  # before anything touches a device
        # Several processes: each prints, logs and writes nothing; process 0 does it once.
        self.config, self.echo = config, echo if is_writer() else (lambda *_: None)
        self.run_dir = config.run_dir
        # One writer per run directory; every input is checked before anything is written,
        # so a command that fails here leaves an existing run byte for byte as it was.
        self._lock = RunLock.acquire(self.run_dir) if is_writer() else None
        try:
            self._check_and_build(config)
        except BaseException:
            if self._lock is not None:
                self._lock.abandon()
            raise
        self._write_run_files()

    def _check_and_build(self, config: Config) -> None:
        """Everything that can refuse the command, then the live pieces; writes nothing."""
        ckpt_dir = config.checkpoint_dir()
        check_same_directory(ckpt_dir)  # several processes: all see one checkpoint directory
        refuse_overwrite(ckpt_dir, config.train.resume, config.run_dir)
        self._resuming = config.train.resume and bool(complete_steps(ckpt_dir))
        self._resumed_buffer: dict = {}  # overlap: batches a checkpoint holds (resume)
        saved = saved_config(self.run_dir) if self._resuming else None
        if saved is not None:
            check_resume(config_to_dict(config), saved, self.run_dir)
        config.check_processes(jax.process_count())  # the rest: Config.__post_init__
        self._cache_settings = None  # train.release_compiled: set before the first compilation
        if config.train.release_compiled:
            self._cache_settings = host_memory.compile_cache(self.echo)
            host_memory.map_large_allocations()
        # A resumed run keeps its saved tokenizer; a new one builds it (saved once checked).
        # Other processes build the same tokenizer (deterministic) without reading it.
        tok_dir = self.run_dir / "tokenizer"
        # The weights are born in their shards (the layout is built from the model's shapes
        # first); a resumed run reads none: its checkpoint has them.
        self.layout: DeviceLayout | None = None
        run = build_run(
            config,
            tokenizer_dir=tok_dir if self._resuming and is_writer() else None,
            shardings=self._param_shardings,
            abstract_params=self._resuming,
        )
        # The loaded / initial parameters are handed to the first TrainState (donated), so
        # the run object keeps none.
        self._init_params = None if self._resuming else run.params
        self.built = dataclasses.replace(run, params=None)
        check_coverage(run, echo=self.echo)
        self.env, self.chat, self.graphdef = run.env, run.chat, run.graphdef
        self.train_tasks, self.val_tasks = run.tasks.train, run.tasks.val
        self.sft_tasks, self.eval_tasks = run.tasks.sft, run.tasks.eval
        self.tokenizer, self.model_config = run.tokenizer, run.model_config
        self.max_len, self.budget = run.max_len, run.budget
        # Collection lanes (overlap.lanes): lane 0 is the run's sampler and pool; the others'
        # runners are closed with the run.
        self._lanes: list[tuple[Any, RolloutSpec]] = [(run.sampler, run.rollout)]
        self._lanes_lock = threading.Lock()
        self._params_like = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), run.params
        )
        self._state_key, self._sample_key = run.state_key, run.sample_key
        self.rl = config.rl_config
        self.optimizer = run_optimizer(config)
        # An agent harness instead of the built-in driver: it talks to this run's own server
        # (started at the first rollout, given each new policy version after).
        self._harness = load_harness(config.harness.entry) if config.harness.entry else None
        self._server = None
        # The mesh (config.mesh), built once: train state, packed batches, update, rollout.
        assert self.layout is not None  # build_model asked for the params' shardings
        if self.layout.mesh is not None:
            self.echo(f"[mesh] {self.layout.describe()}")
        # Per host: each process's rollout and its share of the update over its devices.
        devices = self.layout.devices() if jax.process_count() == 1 else jax.local_devices()
        self.roofline = Roofline.create(run.model_config, run.params, devices)
        self._rows_multiple = rows_multiple(config, self.layout.batch_devices)
        # The memory-lean learner pass (block remat unless rl.update.remat is off; the
        # vocabulary head only over positions that carry loss): benchmarks/update_memory.py.
        lean = model_logprob_fn(
            self.graphdef,
            remat=self.rl.update.remat,
            skip_unmasked_chunks=True,
            activation_sharding=self.layout.activation_sharding(),
        )
        self.update_step = ShardedUpdate(
            self.layout,
            functools.partial(make_update_step, self.rl, optimizer=self.optimizer, logprob_fn=lean),
        )
        self._programs = (self.update_step,)  # what holds compiled programs besides jit caches
        self.evaluation = RunEvaluation(
            config,
            run,
            self.echo,
            self._release,
            self.layout.host_shardings,
            self.layout.rollout_params,
        )

    def _write_run_files(self) -> None:
        """The run's config, tokenizer, checkpoint manager and logs (after every check)."""
        config = self.config
        if is_writer():
            write_atomic(self.run_dir / "config.yaml", config_to_yaml(config))
            tok_dir = self.run_dir / "tokenizer"
            if not self._resuming:  # a new run (or one killed before its first checkpoint)
                shutil.rmtree(tok_dir, ignore_errors=True)
                self.tokenizer.save_pretrained(str(tok_dir))
        self.checkpointer = Checkpointer(
            config.checkpoint_dir(), keep=config.train.keep_checkpoints
        )
        self.guard = UpdateGuard(config.guards, config.run_dir / "metrics.jsonl", self.echo)
        self.logger = (MetricsLogger if is_writer() else NullLogger)(
            self.run_dir,
            config.train.tensorboard,
            config.name if config.train.wandb else "",
            config_to_dict(config),
        )

    def _param_shardings(self, model_config):
        """The device layout of ``config.mesh`` over the model's shapes (built before any
        weight is read or made) and the params' shardings in it (None on one device)."""
        params = abstract_params(model_config)
        self.layout = DeviceLayout.build(
            self.config.mesh,
            abstract_graphdef(model_config),
            params,
            sampler_devices=self.config.overlap.sampler_devices,
        )
        return None if self.layout.mesh is None else self.layout.param_shardings(params)

    def take_initial_params(self):
        """The loaded or initialised parameters, handed over once (the caller owns them)."""
        params, self._init_params = self._init_params, None
        if params is None:
            raise RuntimeError("the initial parameters were handed over already (or resumed)")
        return params

    def _tasks_for(self, iteration: int) -> list:
        per, seed = self.config.rollout.tasks_per_iteration, self.config.train.seed
        return iteration_tasks(self.train_tasks, per, seed, iteration)

    # ------------------------------------------------------------------ phases

    def sft(self, params):
        """SFT warm-start on the env's scripted expert (``jaxagent.train.sft.warm_start``)."""
        return warm_start(
            self.config,
            self.env,
            self.built.rollout,
            self.sft_tasks,
            self.graphdef,
            params,
            pad_id=self.chat.pad_id,
            max_len=self.max_len,
            echo=self.echo,
            layout=self.layout,
        )

    def iteration(self, state: TrainState, it: int) -> tuple[TrainState, dict]:
        """One synchronous RL iteration: collect -> pack -> update (advantages inside the
        step), sampling with the state's own weights (policy version ``it``)."""
        t0 = time.perf_counter()
        # LoRA samples from a merged copy (the base is never written: bit-identical).
        merged, state = begin_sampling(state)
        params, placed = self._sampling_params(merged, own_copy=False)
        produced = Produced(it, it, self._produce(it, it, params, None))
        params = None
        state, merged = end_sampling(state, merged), None
        return self._learn(state, it, produced, t0, placed)

    def _overlapped_iteration(
        self, state: TrainState, it: int, pipeline: Pipeline
    ) -> tuple[TrainState, dict]:
        """One iteration with the rollout overlapped (``overlap.staleness`` = k): the weights
        of version ``it`` go to the producer (when a batch still samples with them), then the
        update runs on batch ``it``, sampled by version ``max(0, it - k)``."""
        t0 = time.perf_counter()
        placed: dict = {}
        if pipeline.needs(it):
            merged, state = begin_sampling(state)
            params, placed = self._sampling_params(merged, own_copy=True)
            state, merged = end_sampling(state, merged), None
            pipeline.publish(it, params)
            params = None
        produced, waited, ready = pipeline.take(it)
        state, m = self._learn(state, it, produced, t0, placed)
        m["time/learner_wait_s"] = waited
        m["time/sampler_wait_s"] = produced.sampler_wait_s
        m["time/batches_ready"] = ready  # timing-dependent, like the waits
        m["async/version"] = produced.version
        return state, m

    def _sampling_params(self, merged, own_copy: bool) -> tuple[Any, dict]:
        """The weights the rollout samples with (``mesh.rollout_layout`` / ``sampling_dtype``:
        one on-device reshard; several processes: each samples on every one of its own
        devices) and their placement metrics. ``own_copy``: never the state's own buffers
        (the update donates those while an overlapped rollout still samples)."""
        rollout = self.layout.rollout_params(merged)
        params = host_local(rollout, self.layout.host_shardings(rollout))
        rollout = None
        if self.layout.sampler_mesh is not None:  # disaggregated: the rollout's own devices
            params = self.layout.to_sampler(params)
        elif own_copy and not added_bytes(params, merged):
            params = jax.tree.map(lambda x: x.copy(), params)
        placed = {
            "sampler/devices": len(jax.tree.leaves(params)[0].sharding.device_set),
            # per chip; 0: samples in place
            "mem/sampling_weights_gib": added_bytes(params, merged) / 2**30,
        }
        return params, placed

    def _lane(self, lane: int) -> tuple[Any, RolloutSpec]:
        """Collection lane ``lane``'s sampler and rollout spec (lane 0: the run's own, which
        the evaluation shares; the others built on first use, ``overlap.lanes``)."""
        while len(self._lanes) <= lane:
            self._lanes.append(self.built.make_lane())
        return self._lanes[lane]

    def _produce(self, it: int, version: int, params, refresh=None, lane: int = 0) -> dict:
        """Iteration ``it``'s batch sampled with ``params`` (policy ``version``; with partial
        rollouts, ``refresh`` hands newer weights between turns) on collection lane ``lane``:
        episodes, the packed host batch (critic values included) and the data-shaping
        metrics."""
        t0 = time.perf_counter()
        tasks = self._tasks_for(it)
        mine = task_shard(tasks)  # this host's slice (every task with one process)
        with self._lanes_lock:
            sampler, spec = self._lane(lane)
        drawn = self._collect(params, it, tasks, mine, version, refresh, sampler, spec)
        t1 = time.perf_counter()
        batch, data_m = self._pack(drawn.episodes, rows=len(mine) * self.config.group_size)
        if self.rl.critic.enabled:  # values, and the bootstrap value of a truncated row
            batch = jax.tree.map(np.asarray, with_critic_values(self.graphdef, params, batch))
        # The rollout's extra buffers go before the update allocates gradients and moments.
        release_decode_kernels()
        return {
            "drawn": drawn,
            "batch": batch,
            "data_m": data_m,
            "collect_s": t1 - t0,
            "pack_s": time.perf_counter() - t1,
        }

    def _learn(
        self, state: TrainState, it: int, produced: Produced, t0: float, placed: dict
    ) -> tuple[TrainState, dict]:
        """The update on a produced batch, and the iteration's metrics."""
        p = produced.payload
        drawn, batch = p["drawn"], p["batch"]
        self.checkpointer.before_mutation()  # the update donates the state
        # The rollout's freed buffers (and, release_compiled, its programs) go back before the
        # update's peak; the step's gradients, activations and program before the next rollout.
        self._release()
        t_update = time.perf_counter()
        state, m = self.update_step(state, batch)
        m = {k: float(v) for k, v in jax.device_get(m).items()}
        update_s = time.perf_counter() - t_update
        self._release()
        m.update(p["data_m"])
        m.update(
            self._rollout_metrics(drawn, batch, p["pack_s"] + update_s, time.perf_counter() - t0)
        )
        m.update(placed)
        if self.config.overlap.staleness:
            m.update(staleness_metrics(drawn.episodes, it, self.config.overlap.staleness))
        return state, m

    def _collect(
        self,
        params,
        it: int,
        tasks: list,
        mine: list,
        version: int,
        refresh,
        sampler,
        spec: RolloutSpec,
    ) -> dapo.DynamicSample:
        """This host's episodes of iteration ``it`` (``mine``: its slice of ``tasks``; with
        dynamic sampling, refilled until the batch holds enough informative groups), sampled
        by ``sampler`` in ``spec``'s environments."""
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
                self.built,
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

    def _pack(self, eps: list, rows: int):
        """The episodes as one host-side token batch of ``rows`` rows (row drops decided here,
        as a row-weight column) and the data-shaping metrics; ``update_step`` places it on
        the mesh."""
        data, r = self.config.rl.data, self.config.rollout
        batch = pack_episodes(
            eps,
            pad_id=self.chat.pad_id,
            max_len=self.max_len,
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
        batch = hosts.common_length(batch, self.chat.pad_id)
        batch, data_m = dapo.shape_batch(batch, eps, data, r.max_turns * r.max_new_tokens)
        return jax.tree.map(np.asarray, batch), data_m

    def _rollout_metrics(
        self, drawn: dapo.DynamicSample, batch, update_s: float, total_s: float
    ) -> dict:
        """Train-episode report (every host's first-round episodes), rollout throughput,
        environment health and the roofline of the iteration."""
        m = dict(drawn.metrics()) if self.config.rl.data.dynamic_sampling else {}
        report = summarize(hosts.gather_episodes(drawn.first_round))
        stats = hosts.gather_stats(drawn.total_stats())
        m.update(report.as_metrics("train"))
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
            )
        )
        return m

    # ------------------------------------------------------------------ the loop

    def _wall_s(self) -> float:
        return self._wall_offset + time.perf_counter() - self._t_run

    def _meta(self, it: int, history: list, extra: dict) -> dict:
        return {
            "iteration": it,
            "data_position": it * self.config.rollout.tasks_per_iteration,
            "history": history,
            "seed": self.config.train.seed,
            "wall_s": self._wall_s(),
            **extra,
        }

    def run(self) -> dict:
        cfg = self.config
        self._t_run, self._wall_offset = self._t_init, 0.0
        state, start, history, extra = self._start_or_resume()
        self.logger.truncate_after(start)
        ck_every = cfg.train.checkpoint_every
        pipeline = None
        if cfg.overlap.staleness and start < cfg.train.iterations:
            pipeline = Pipeline(
                self._produce,
                start,
                cfg.train.iterations,
                cfg.overlap.staleness,
                self._resumed_buffer,
                partial=cfg.overlap.partial_rollouts,
                lanes=cfg.overlap.lanes,
            )
            self.evaluation.env_lock = pipeline.env_lock
        self._resumed_buffer = {}
        try:
            with progress.Progress(
                cfg.train.progress if is_writer() else "none",
                "rl",
                cfg.train.iterations,
                start,
                every_s=cfg.train.progress_every_s,
            ) as bar:
                for it in range(start, cfg.train.iterations):
                    if pipeline is None:
                        state, m = self.iteration(state, it)
                    else:
                        state, m = self._overlapped_iteration(state, it, pipeline)
                    done = it + 1
                    self.guard.check(done, m)  # skipped-update count, grad-norm / KL spikes
                    state, val_m, eval_m = self.evaluation.after_iteration(
                        state, done, self._on_model, history, extra
                    )
                    m.update(val_m)
                    m.update(eval_m)
                    self.logger.log(done, m)
                    self.guard.stop_if_needed()  # past guards.max_skipped_updates: stop, clearly
                    bar.update(
                        1,
                        success=f"{m['train/success']:.2f}",
                        reward=f"{m['train/avg_reward']:.2f}",
                        **progress_fields(m),
                    )
                    if done == cfg.train.iterations or val_m or (ck_every and done % ck_every == 0):
                        best = val_m["val/success"] if val_m else eval_m.get("eval/success")
                        meta = self._meta(done, history, extra)
                        if pipeline is not None and done < cfg.train.iterations:
                            # the batches sampled with weights this checkpoint does not hold
                            meta[BUFFER_KEY] = encode_buffer(pipeline.pending(done))
                        self.checkpointer.save(done, state, meta, best)
        finally:
            if pipeline is not None:
                pipeline.close()
                self.evaluation.env_lock = contextlib.nullcontext()
        self.checkpointer.wait()
        state = None  # the best-validation test below restores its own
        self.evaluation.record_best_val(
            history, extra, lambda it: self._restore(it)[0], self._on_model
        )
        from jaxagent.train.summary import finish_run

        summary = finish_run(self, history, extra, self._wall_s())
        self.close()
        return summary

    def _on_model(self, state: TrainState, fn) -> tuple[TrainState, Any]:
        """``fn(params)`` on the state's model (LoRA: a merged copy, ``on_sampling_params``)."""
        return on_sampling_params(state, fn)

    def _start_or_resume(self):
        cfg = self.config
        latest = self.checkpointer.latest_step() if cfg.train.resume else None
        if latest is not None:
            state, meta = self._restore(latest)
            self.echo(f"[resume] from checkpoint {latest} in {self.checkpointer.directory}")
            extra = {
                k: v
                for k, v in meta.items()
                if k not in ("iteration", "data_position", "history", "seed", "wall_s", BUFFER_KEY)
            }
            if BUFFER_KEY in meta:
                self._resumed_buffer = decode_buffer(meta[BUFFER_KEY])
            self._wall_offset = float(meta.get("wall_s", 0.0))
            return state, int(meta["iteration"]), list(meta["history"]), extra
        # A new run (or one killed before its first checkpoint) starts its record afresh.
        self.logger.truncate_after(-1)
        # The loaded / initial parameters become the state's own (no second copy).
        params, extra = self.take_initial_params(), {}
        if cfg.sft.enabled:
            if self.env.make_expert is None:
                raise ValueError(
                    f"sft.enabled=true but env {self.env.name!r} has no scripted "
                    "expert; set sft.enabled=false"
                )
            params, sft_m = self.sft(params)
            self.logger.log(0, sft_m)
            extra["sft"] = sft_m
        m0, best, history = self.evaluation.at_start(params, extra)
        note = low_start_note(cfg, m0["eval/success"], self.env.make_expert is not None)
        if note is not None:
            self.echo(note)
        self.logger.log(0, m0)
        state = self._new_state(params)
        self.checkpointer.save(0, state, self._meta(0, history, extra), best)
        return state, 0, history, extra

    def _restore(self, step: int) -> tuple[TrainState, dict]:
        """Checkpoint ``step`` into this run's state layout; a checkpoint this config cannot
        read (another model shape or recipe) is a one-line ``CheckpointError``."""
        try:
            return self.checkpointer.restore(step, self._state_like())
        except Exception as err:  # orbax raises many types for a mismatched tree
            raise CheckpointError(
                f"train.out_dir={str(self.run_dir)!r}: checkpoint {step} cannot be restored "
                f"into this config's train state ({type(err).__name__}: "
                f"{(str(err).splitlines() or [''])[0][:160]}); train into another "
                "train.out_dir, or resume with the settings the run was trained with"
            ) from None

    def _state_like(self) -> TrainState:
        """An abstract TrainState (shapes, dtypes, shardings) to restore a checkpoint into."""
        key = self._state_key  # replicated over the mesh, as the live state's key is
        if self.layout.mesh is not None:
            key = place(key, self.layout.replicated())
        return self.layout.abstract_state(
            jax.eval_shape(self._new_state_unplaced, self._params_like), self.optimizer
        ).replace(rng=key)

    def _new_state_unplaced(self, params) -> TrainState:
        ref = params if self.rl.needs_reference else None  # create() copies it
        return TrainState.create(
            params, self.rl, self._state_key, optimizer=self.optimizer, ref_params=ref
        )

    def _new_state(self, params) -> TrainState:
        """A fresh TrainState; KL recipes keep a frozen copy of the start as the reference.

        Made under ``jit`` with the state's shardings as ``out_shardings`` and ``params``
        donated: the Adam moments are born in their shards (never whole on one device) and
        the parameters become the state's own buffers (no second copy)."""
        if self.layout.mesh is None:
            return self._new_state_unplaced(params)
        shardings = self.layout.state_shardings(
            jax.eval_shape(self._new_state_unplaced, params), self.optimizer
        )
        make = jax.jit(self._new_state_unplaced, out_shardings=shardings, donate_argnums=0)
        return make(params)

    def _release(self) -> None:
        """Freed buffers (with ``train.release_compiled`` also every compiled program) go back
        to the OS between phases."""
        host_memory.release(compiled=self._programs if self._cache_settings is not None else ())

    def close(self) -> None:
        """Finish pending saves, stop the pool, release the run directory (idempotent)."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        if self._cache_settings is not None:
            host_memory.restore(self._cache_settings)
        if self._server is not None:
            self._server.close()
        self.checkpointer.close()
        self.logger.close()
        for _, spec in self._lanes[1:]:
            spec.runner.close()
        self.built.close()
        if self._lock is not None:
            self._lock.release()
