"""The training loop: collect -> update (advantages inside the step) -> evaluate -> checkpoint.

``Trainer(config).run()`` is the loop; its parts are named modules of this package:

- ``run.build_run``: task splits, tokenizer (saved in the run directory), chat format, the
  model born in the shards of its device layout, samplers, budget, environment runner;
- ``collect.Collector``: the rollout (lanes, harness server, dynamic sampling, packing, critic
  values), one ``Collected`` record (arrays and numbers) an iteration;
- ``state.RunState`` / ``state.update_step``: the train state made, restored and updated in
  the layout;
- ``overlap.Pipeline``: the rollout overlapped with the update (``overlap.staleness``);
- ``evaluation.RunEvaluation``, ``sft.warm_start``, ``checkpoint.Checkpointer``,
  ``guards.UpdateGuard``, ``metrics_log``, ``progress``, ``summary.finish_run``.

Exact resume: everything random is derived from the config seed and the iteration number
(task order, sampling keys) or lives in the checkpoint (params, optimizer state, update RNG),
and the checkpoint's JSON meta holds the iteration, data position and evaluation history; an
overlapped run's batches sampled with weights older than the checkpoint are saved beside the
state as arrays. A run restarted after a kill reloads the newest checkpoint and produces the
same metrics.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import time
from typing import Any, Callable

import jax

from jaxagent.models import abstract_params as abstract_model_params
from jaxagent.models import init_model
from jaxagent.parallel.distributed import is_writer, start_distributed
from jaxagent.perf import host_memory
from jaxagent.perf.roofline import progress_fields
from jaxagent.rl.train_state import TrainState, on_sampling_params
from jaxagent.train import progress
from jaxagent.train.checkpoint import Checkpointer, check_same_directory, complete_steps
from jaxagent.train.checkpoint import refuse_overwrite
from jaxagent.train.collect import Collected, Collector, pending_items, restored_items
from jaxagent.train.config import Config, config_to_dict, config_to_yaml
from jaxagent.train.coverage import check_coverage
from jaxagent.train.evaluation import RunEvaluation
from jaxagent.train.guards import UpdateGuard
from jaxagent.train.metrics_log import MetricsLogger, NullLogger
from jaxagent.train.overlap import Pipeline
from jaxagent.train.policy import run_optimizer
from jaxagent.train.run import build_run
from jaxagent.train.run_dir import RunLock, check_resume, saved_config, write_atomic
from jaxagent.train.sft import low_start_note, sft_demonstrations, warm_start
from jaxagent.train.state import RunState, update_step

__all__ = ["Trainer"]

PENDING_KEY = "pending"  # meta: the pending batches' versions and numbers (arrays: orbax)
_OWN_KEYS = ("iteration", "data_position", "history", "seed", "wall_s", PENDING_KEY)


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
        self._closed = False
        try:
            self._build(config)
        except BaseException:
            if self._lock is not None:
                self._lock.abandon()
            raise
        self._write_run_files()

    def _build(self, config: Config) -> None:
        """Everything that can refuse the command, then the live pieces; writes nothing."""
        ckpt_dir = config.checkpoint_dir()
        check_same_directory(ckpt_dir)  # several processes: all see one checkpoint directory
        refuse_overwrite(ckpt_dir, config.train.resume, config.run_dir)
        config.check_processes(jax.process_count())  # the rest: Config.__post_init__
        self._resuming = config.train.resume and bool(complete_steps(ckpt_dir))
        if self._resuming and (saved := saved_config(self.run_dir)) is not None:
            check_resume(config_to_dict(config), saved, self.run_dir)
        self._cache_settings = None  # train.release_compiled: set before the first compilation
        if config.train.release_compiled:
            self._cache_settings = host_memory.compile_cache(self.echo)
            host_memory.map_large_allocations()
        # A resumed run keeps its saved tokenizer and reads no weights (its checkpoint has
        # them); other processes build the same tokenizer (deterministic) without reading it.
        run = build_run(
            config,
            tokenizer_dir=self.run_dir / "tokenizer" if self._resuming and is_writer() else None,
            layout=True,  # the weights are born in the shards of config.mesh's layout
            abstract_params=self._resuming,
        )
        check_coverage(run, echo=self.echo)
        self.layout = run.layout
        if self.layout.mesh is not None:
            self.echo(f"[mesh] {self.layout.describe()}")
        optimizer = run_optimizer(config)
        params_like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), run.params)
        self.states = RunState(self.layout, config.rl_config, optimizer, run.state_key, params_like)
        self.update_step = update_step(config.rl_config, self.layout, run.graphdef, optimizer)
        self.collector = Collector(config, run, self.layout, self.echo)
        self._demos = None  # the SFT demonstrations, collected by the first SFT attempt
        # The loaded / initial parameters go to the first TrainState (donated): nothing else
        # keeps them.
        self._init_params = None if self._resuming else run.params
        self.built = dataclasses.replace(run, params=None)
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
                self.built.tokenizer.save_pretrained(str(tok_dir))
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

    def take_initial_params(self):
        """The loaded or initialised parameters, handed over once (the caller owns them)."""
        params, self._init_params = self._init_params, None
        if params is None:
            raise RuntimeError("the initial parameters were handed over already (or resumed)")
        return params

    # ------------------------------------------------------------------ one iteration

    def sft(self, params, attempt: int = 0):
        """SFT warm-start on the env's scripted expert (``jaxagent.train.sft.warm_start``);
        the demonstrations are collected once, whatever the number of attempts."""
        b = self.built
        if self._demos is None:
            self._demos = sft_demonstrations(
                self.config, b.env, b.rollout, b.tasks.sft, max_len=b.max_len, echo=self.echo
            )
        return warm_start(
            self.config,
            self._demos,
            b.graphdef,
            params,
            pad_id=b.chat.pad_id,
            max_len=b.max_len,
            echo=self.echo,
            layout=self.layout,
            attempt=attempt,
        )

    def sft_until_learned(self, params) -> tuple[Any, dict, dict]:
        """SFT, restarted from a new initialisation while the fit's validation success is
        below ``sft.min_val_success`` (at most ``sft.max_restarts`` times). Returns (params,
        ``sft/`` metrics with ``sft/restarts`` and every attempt's ``sft/val_success``, the
        kept fit's validation metrics or {} when no restart was asked for); the scalar
        metrics are logged at step 0."""
        c = self.config.sft
        params, m = self.sft(params)
        if not c.max_restarts:
            self.logger.log(0, m)
            return params, m, {}
        tried, attempt, spent = [], 0, m["sft/time_s"]
        while True:
            val_m = self.evaluation.validate(params, 0, {})
            tried.append(round(float(val_m["val/success"]), 4))
            if tried[-1] >= c.min_val_success or attempt == c.max_restarts:
                break
            attempt += 1
            self.echo(
                f"[sft] validation success {tried[-1]:.3f} < sft.min_val_success "
                f"{c.min_val_success}: restart {attempt} of {c.max_restarts} from a new "
                "initialisation and data order"
            )
            params = None  # the fit that did not learn is dropped before the next is made
            params, m = self.sft(self._fresh_params(attempt), attempt)
            spent += m["sft/time_s"]
        if tried[-1] < c.min_val_success:
            self.echo(
                f"[sft] no fit reached sft.min_val_success {c.min_val_success} in "
                f"{attempt + 1} attempts (validation {tried}); RL starts from the last"
            )
        # sft/time_s: every attempt's fit, the time the run spent in SFT
        m = {**m, "sft/time_s": spent, "sft/restarts": attempt}
        self.logger.log(0, m)  # scalars; every fit's validation goes to the summary
        return params, {**m, "sft/val_success": tried}, val_m

    def _fresh_params(self, attempt: int):
        """A new initialisation of the from-scratch model (the run's model key folded with
        ``attempt``), born in the layout's shards."""
        b = self.built
        placement = None
        if self.layout.mesh is not None:
            placement = self.layout.param_shardings(abstract_model_params(b.model_config))
        key = jax.random.fold_in(b.model_key, attempt)
        return init_model(b.model_config, key, shardings=placement)[1]

    def iteration(self, state: TrainState, it: int) -> tuple[TrainState, dict]:
        """One synchronous RL iteration: collect with the state's own weights (policy version
        ``it``), then update on that batch."""
        t0 = time.perf_counter()
        state, params, placed = self.collector.weights(state, own_copy=False)
        record = self.collector.collect(it, it, params)
        params = None
        return self._learn(state, record, t0, placed)

    def _overlapped_iteration(
        self, state: TrainState, it: int, pipeline: Pipeline
    ) -> tuple[TrainState, dict]:
        """One iteration with the rollout overlapped (``overlap.staleness`` = k): the weights
        of version ``it`` go to the producer (when a batch still samples with them), then the
        update runs on batch ``it``, sampled by version ``max(0, it - k)``."""
        t0 = time.perf_counter()
        placed: dict = {}
        if pipeline.needs(it):
            state, params, placed = self.collector.weights(state, own_copy=True)
            pipeline.publish(it, params)
            params = None
        produced, waited, ready = pipeline.take(it)
        state, m = self._learn(state, produced.payload, t0, placed)
        m["time/learner_wait_s"] = waited
        m["time/sampler_wait_s"] = produced.sampler_wait_s
        m["time/batches_ready"] = ready  # timing-dependent, like the waits
        m["async/version"] = produced.version
        return state, m

    def _learn(
        self, state: TrainState, record: Collected, t0: float, placed: dict
    ) -> tuple[TrainState, dict]:
        """The update on a collected batch, and the iteration's metrics."""
        self.checkpointer.before_mutation()  # the update donates the state
        # The rollout's freed buffers (and, release_compiled, its programs) go back before the
        # update's peak; the step's gradients, activations and program before the next rollout.
        self._release()
        t_update = time.perf_counter()
        state, m = self.update_step(state, record.batch)
        m = {k: float(v) for k, v in jax.device_get(m).items()}
        update_s = time.perf_counter() - t_update
        self._release()
        total_s = time.perf_counter() - t0
        steps = int(m["optim/steps"])
        m.update(self.collector.report(record, record.pack_s + update_s, total_s, steps))
        m.update(placed)
        return state, m

    # ------------------------------------------------------------------ the loop

    def run(self) -> dict:
        cfg = self.config
        self._t_run, self._wall_offset = self._t_init, 0.0
        state, start, history, extra, pending = self._start_or_resume()
        self.logger.truncate_after(start)
        ck_every, stop = cfg.train.checkpoint_every, cfg.train.iterations
        pipeline = None
        if cfg.overlap.staleness and start < stop:
            pipeline = Pipeline(
                self.collector.collect,
                start,
                stop,
                cfg.overlap.staleness,
                pending,
                partial=cfg.overlap.partial_rollouts,
                lanes=cfg.overlap.lanes,
            )
            self.evaluation.env_lock = pipeline.env_lock
        pending = None
        try:
            with progress.Progress(
                cfg.train.progress if is_writer() else "none",
                "rl",
                stop,
                start,
                every_s=cfg.train.progress_every_s,
            ) as bar:
                for it in range(start, stop):
                    if pipeline is None:
                        state, m = self.iteration(state, it)
                    else:
                        state, m = self._overlapped_iteration(state, it, pipeline)
                    done = it + 1
                    self.guard.check(done, m)  # skipped-update count, grad-norm / KL spikes
                    state, val_m, eval_m = self.evaluation.after_iteration(
                        state, done, on_sampling_params, history, extra
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
                    if done == stop or val_m or (ck_every and done % ck_every == 0):
                        best = val_m["val/success"] if val_m else eval_m.get("eval/success")
                        # the batches sampled with weights this checkpoint does not hold
                        held = pipeline.pending(done) if pipeline and done < stop else {}
                        self._save(done, state, history, extra, best, held)
        finally:
            if pipeline is not None:
                pipeline.close()
                self.evaluation.env_lock = contextlib.nullcontext()
        self.checkpointer.wait()
        state = None  # the best-validation test below restores its own
        self.evaluation.record_best_val(
            history,
            extra,
            lambda it: self.states.restore(self.checkpointer, it, self.run_dir)[0],
            on_sampling_params,
        )
        from jaxagent.train.summary import finish_run

        summary = finish_run(self, history, extra, self._wall_s())
        self.close()
        return summary

    def _wall_s(self) -> float:
        return self._wall_offset + time.perf_counter() - self._t_run

    def _save(self, it: int, state, history: list, extra: dict, best, held: dict) -> None:
        """Checkpoint ``it``: the state, its meta, and the overlapped rollout's batches
        ``held`` (arrays beside the state; their versions and numbers in the meta)."""
        arrays, record = pending_items(held)
        meta = {
            "iteration": it,
            "data_position": it * self.config.rollout.tasks_per_iteration,
            "history": history,
            "seed": self.config.train.seed,
            "wall_s": self._wall_s(),
            **extra,
        }
        if record:
            meta[PENDING_KEY] = record
        self.checkpointer.save(it, state, meta, best, pending=arrays)

    def _start_or_resume(self):
        """``(state, first iteration, history, extra, pending batches)``: the newest
        checkpoint's, or a new run's after SFT and the first evaluation."""
        cfg = self.config
        latest = self.checkpointer.latest_step() if cfg.train.resume else None
        if latest is not None:
            state, meta = self.states.restore(self.checkpointer, latest, self.run_dir)
            self.echo(f"[resume] from checkpoint {latest} in {self.checkpointer.directory}")
            extra = {k: v for k, v in meta.items() if k not in _OWN_KEYS}
            pending = {}
            if PENDING_KEY in meta:
                arrays = self.checkpointer.restore_pending(latest)
                pending = restored_items(arrays, meta[PENDING_KEY])
            self._wall_offset = float(meta.get("wall_s", 0.0))
            return state, int(meta["iteration"]), list(meta["history"]), extra, pending
        # A new run (or one killed before its first checkpoint) starts its record afresh.
        self.logger.truncate_after(-1)
        # The loaded / initial parameters become the state's own (no second copy).
        params, extra, val_m = self.take_initial_params(), {}, {}
        env = self.built.env
        if cfg.sft.enabled:
            if env.make_expert is None:
                raise ValueError(
                    f"sft.enabled=true but env {env.name!r} has no scripted expert; set "
                    "sft.enabled=false"
                )
            params, sft_m, val_m = self.sft_until_learned(params)
            extra["sft"] = sft_m
        m0, best, history = self.evaluation.at_start(params, extra, val_m)
        note = low_start_note(cfg, m0["eval/success"], env.make_expert is not None)
        if note is not None:
            self.echo(note)
        self.logger.log(0, m0)
        state = self.states.new(params)
        self._save(0, state, history, extra, best, {})
        return state, 0, history, extra, {}

    def _release(self) -> None:
        """Freed buffers (with ``train.release_compiled`` also every compiled program) go back
        to the OS between phases."""
        programs = (self.update_step,) if self._cache_settings is not None else ()
        host_memory.release(compiled=programs)

    def close(self) -> None:
        """Finish pending saves, stop the pools, release the run directory (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._cache_settings is not None:
            host_memory.restore(self._cache_settings)
        self.collector.close()
        self.checkpointer.close()
        self.logger.close()
        self.built.close()
        if self._lock is not None:
            self._lock.release()
