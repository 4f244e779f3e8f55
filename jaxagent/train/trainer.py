"""The training loop: collect -> advantages -> update -> evaluate -> checkpoint.

``Trainer(config).run()`` wires the pieces: the env suite and its task splits
(``jaxagent.train.envs``), a tokenizer (saved in the run directory), the policy
(``jaxagent.models``), the rollout driver with the cached multi-turn sampler
(``jaxagent.agents``), the RL recipe's jitted update step (``jaxagent.rl``), orbax checkpoints,
JSONL/TensorBoard metrics and a live progress display.

Exact resume: everything random is derived from the config seed and the iteration number
(task order, sampling keys) or lives in the checkpoint (params, optimizer state, update RNG),
and the checkpoint's JSON meta holds the iteration, data position and evaluation history. A
run restarted after a kill reloads the newest checkpoint and produces the same metrics.
"""

from __future__ import annotations

import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.agents.batch import pack_episodes
from jaxagent.agents.rollout import Budget, collect_episodes
from jaxagent.agents.runner import InlineRunner
from jaxagent.agents.sampling import SamplingParams
from jaxagent.eval.report import summarize
from jaxagent.rl.train_state import TrainState
from jaxagent.rl.update import make_update_step, model_logprob_fn
from jaxagent.train import progress as P
from jaxagent.train.checkpoint import Checkpointer
from jaxagent.train.config import Config, config_to_dict, config_to_yaml
from jaxagent.train.envs import get_env_spec
from jaxagent.train.metrics_log import MetricsLogger
from jaxagent.train.policy import build_model, make_logprob_fn, make_turn_sampler, run_optimizer
from jaxagent.train.sft import expert_episodes, run_sft
from jaxagent.train.tokenizer import ChatFormat, build_tokenizer, build_word_tokenizer
from jaxagent.train.tokenizer import load_tokenizer_dir


def sample_keys(seed: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(model init key, train-state key, sampling key) of a run seed."""
    return tuple(jax.random.split(jax.random.key(seed), 3))


def eval_key(seed: int, iteration: int) -> jax.Array:
    """The sampling key of the held-out evaluation after ``iteration`` RL iterations, so
    ``jaxagent eval`` on a checkpoint reproduces the trainer's evaluation exactly."""
    return jax.random.fold_in(sample_keys(seed)[2], 10**6 + iteration)


class _MakeEnv:
    """Picklable ``env_fn(env_id)`` for the pool's process backend."""

    def __init__(self, name: str, options: dict):
        self.name, self.options = name, dict(options)

    def __call__(self, env_id: int = 0):
        return get_env_spec(self.name, self.options).make_env()


def make_runner(config: Config):
    """The env runner the config asks for (inline calls, or the EnvPool with faults)."""
    env = config.env
    make_env = _MakeEnv(env.name, env.options)
    if env.backend == "inline":
        return InlineRunner(make_env)
    from jaxagent.agents.pool_runner import PoolRunner
    from jaxagent.pool import PoolConfig

    env_fn: Callable = make_env
    if env.fault_hang_prob or env.fault_crash_prob:
        from jaxagent.envs.faults import FaultConfig, FaultyEnvFactory

        env_fn = FaultyEnvFactory(make_env, FaultConfig(
            hang=env.fault_hang_prob, crash=env.fault_crash_prob, seed=env.fault_seed,
            hang_s=4 * env.step_timeout_s))
    return PoolRunner(env_fn, PoolConfig(
        num_envs=env.num_workers, backend=env.backend, step_timeout_s=env.step_timeout_s,
        reset_timeout_s=env.step_timeout_s, seed=config.train.seed, start_method="fork"
        if env.backend == "process" else "forkserver"))


class Trainer:
    """One run of a config. ``run()`` returns the final summary dict.

    Args:
      config: the run config.
      echo: where human-readable lines go (the CLI prints them).
    """

    def __init__(self, config: Config, echo: Callable[[str], None] = print):
        self.config, self.echo = config, echo
        self._t_init = time.perf_counter()  # wall_s counts set-up (world, tokenizer, model) too
        self.run_dir = config.run_dir
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(config_to_yaml(config))
        self.spec = get_env_spec(config.env.name, config.env.options)
        source = self.spec.make_source()
        self.train_tasks = list(source.tasks(config.env.train_split))
        self.eval_tasks = list(source.tasks(config.env.eval_split))[: config.eval.num_tasks]
        # SFT draws its demonstrations in this seeded order of the train split; the validation
        # tasks (model selection) are the order's last ones, so SFT never sees them (and its
        # data is the same with or without them) and RL's tasks are the rest of the split.
        n_val = config.eval.val_tasks
        if n_val and n_val >= len(self.train_tasks):
            raise ValueError(f"eval.val_tasks={n_val} leaves no training tasks (split "
                             f"{config.env.train_split!r} has {len(self.train_tasks)}); use fewer")
        order = np.random.default_rng([config.train.seed, 5]).permutation(len(self.train_tasks))
        cut = len(order) - n_val
        held = set(order[cut:].tolist())
        self.val_tasks = [self.train_tasks[i] for i in order[cut:]]
        self.sft_tasks = [self.train_tasks[i] for i in order[:cut]]
        self.train_tasks = [t for i, t in enumerate(self.train_tasks) if i not in held]
        if not self.train_tasks or not self.eval_tasks:
            raise ValueError(f"env {config.env.name!r}: split {config.env.train_split!r} or "
                             f"{config.env.eval_split!r} is empty")
        self.tokenizer = self._tokenizer()
        self.chat = ChatFormat(self.tokenizer)
        self.rl = config.rl_config()
        self._model_key, self._state_key, self._sample_key = sample_keys(config.train.seed)
        self.graphdef, params, self.model_config = build_model(
            config.model, self.tokenizer, self._model_key)
        self._init_params = params
        # jaxagent.generate.Sampler checks every row's cached length + max_new_tokens against
        # the model's max_seq_len (finished rows included), so episodes stop that much earlier.
        self.max_len = min(config.max_total_tokens,
                           self.model_config.max_seq_len - config.rollout.max_new_tokens)
        self.budget = Budget(config.rollout.max_turns, config.rollout.max_new_tokens,
                             self.max_len, config.rollout.max_observation_chars)
        r = config.rollout
        self.sampler = self._sampler(r.temperature, r.top_k, r.top_p)
        same = (config.eval.temperature == r.temperature and r.top_k == 0 and r.top_p == 1.0)
        # One sampler for both when the settings agree: its compiled shapes are shared.
        self.eval_sampler = self.sampler if same else self._sampler(config.eval.temperature,
                                                                    0, 1.0)
        self.optimizer = run_optimizer(config)
        # The memory-lean learner pass (block remat; the vocabulary head only over positions
        # that carry loss): the function benchmarks/update_memory.py measures.
        self.update_step = make_update_step(
            self.rl, optimizer=self.optimizer,
            logprob_fn=model_logprob_fn(self.graphdef, skip_unmasked_chunks=True))
        self.logprob_fn = make_logprob_fn(self.graphdef)
        self.runner = make_runner(config)
        self.checkpointer = Checkpointer(self.run_dir / "checkpoints",
                                         keep=config.train.keep_checkpoints)
        self.logger = MetricsLogger(self.run_dir, config.train.tensorboard,
                                    config.name if config.train.wandb else "",
                                    config_to_dict(config))

    # ------------------------------------------------------------------ set-up helpers

    def _tokenizer(self):
        path = self.run_dir / "tokenizer"
        if (path / "tokenizer.json").exists():
            return load_tokenizer_dir(str(path))
        section = self.config.tokenizer
        if self.config.model.init_from:
            tok = load_tokenizer_dir(self.config.model.init_from)
        elif section.kind == "word":
            if self.spec.vocabulary is None:
                raise ValueError(f"tokenizer.kind='word' needs an env with a closed vocabulary; "
                                 f"env {self.spec.name!r} has none: use tokenizer.kind='bpe'")
            tok = build_word_tokenizer(self.spec.vocabulary())
        else:
            corpus = [self.spec.system_prompt] + [t.prompt for t in self.train_tasks]
            tok = build_tokenizer(corpus, section.vocab_size)
        tok.save_pretrained(str(path))
        return tok

    def _sampler(self, temperature: float, top_k: int, top_p: float):
        sampling = SamplingParams(
            max_new_tokens=self.config.rollout.max_new_tokens, temperature=temperature,
            top_k=top_k, top_p=top_p, stop_ids=self.chat.stop_ids, pad_id=self.chat.pad_id)
        return make_turn_sampler(self.graphdef, sampling, self.max_len,
                                 model_config=self.model_config)

    def _tasks_for(self, iteration: int) -> list:
        """Deterministic data order: an epoch-wise permutation of the train split."""
        n, per = len(self.train_tasks), self.config.rollout.tasks_per_iteration
        out = []
        for j in range(iteration * per, (iteration + 1) * per):
            epoch, pos = divmod(j, n)
            perm = np.random.default_rng([self.config.train.seed, 3, epoch]).permutation(n)
            out.append(self.train_tasks[perm[pos]])
        return out

    # ------------------------------------------------------------------ phases

    def evaluate(self, params, tag: str, key, split: str = "test") -> dict:
        """Held-out ("test": prefix ``eval/``) or validation ("val": prefix ``val/``)
        evaluation; returns flat metrics."""
        t0 = time.perf_counter()
        tasks, prefix = (self.eval_tasks, "eval") if split == "test" else (self.val_tasks, "val")
        eps, stats = collect_episodes(
            self.eval_sampler, params, tasks,
            samples_per_task=self.config.eval.samples_per_task, runner=self.runner,
            chat=self.chat, system_prompt=self.spec.system_prompt, budget=self.budget, key=key)
        report = summarize(eps)
        m = report.as_metrics(prefix)
        m[f"time/{prefix}_s"] = time.perf_counter() - t0
        what = "held-out" if split == "test" else "validation"
        self.echo(f"[{tag}] {what} success {report.success:.3f} over {report.episodes} "
                  f"episodes, avg steps {report.avg_steps:.2f}, env errors {report.env_errors}, "
                  f"failures {report.failure_modes}")
        return m

    def sft(self, params):
        c = self.config.sft
        tasks = self.sft_tasks[: c.num_demos]
        t0 = time.perf_counter()
        demos = expert_episodes(
            self.spec.make_env, self.spec.make_expert, tasks, error_rate=c.expert_error_rate,
            seed=self.config.train.seed, chat=self.chat, system_prompt=self.spec.system_prompt,
            max_turns=self.budget.max_turns, max_total_tokens=self.max_len)
        if c.only_successful:
            demos = [d for d in demos if d.success]
        demo_success = float(np.mean([d.success for d in demos])) if demos else 0.0
        self.echo(f"[sft] {len(demos)} expert demonstrations (error rate "
                  f"{c.expert_error_rate}, expert success {demo_success:.2f}); {c.steps} steps")
        with P.Progress(self.config.train.progress, "sft", c.steps) as bar:
            params, losses = run_sft(
                self.graphdef, params, demos, steps=c.steps, batch_size=c.batch_size,
                learning_rate=c.learning_rate, seed=self.config.train.seed,
                pad_id=self.chat.pad_id, max_len=self.max_len,
                on_step=lambda i, loss: bar.update(1, loss=f"{loss:.3f}"))
        return params, {"sft/loss": losses[-1] if losses else float("nan"),
                        "sft/demos": len(demos), "sft/expert_success": demo_success,
                        "sft/time_s": time.perf_counter() - t0}

    def iteration(self, state: TrainState, it: int) -> tuple[TrainState, dict]:
        """One RL iteration: collect -> advantages -> update (advantages inside the step)."""
        t0 = time.perf_counter()
        tasks = self._tasks_for(it)
        key = jax.random.fold_in(self._sample_key, it)
        params = state.model_params()
        eps, stats = collect_episodes(
            self.sampler, params, tasks, samples_per_task=self.rl.group_size,
            runner=self.runner, chat=self.chat, system_prompt=self.spec.system_prompt,
            budget=self.budget, key=key, group_offset=it * len(tasks))
        t1 = time.perf_counter()
        batch, valid = pack_episodes(eps, pad_id=self.chat.pad_id, max_len=self.max_len,
                                     length_multiple=32, rows_multiple=self.rl.minibatch_size)
        batch = jax.tree.map(jnp.asarray, batch)
        if self.rl.use_critic:
            _, values = self.logprob_fn(params, batch.tokens, batch.positions,
                                        batch.segment_ids)
            batch = batch.replace(values=values)
        state, m = self.update_step(state, batch)
        m = {k: float(v) for k, v in jax.device_get(m).items()}
        t2 = time.perf_counter()
        report = summarize(eps)
        m.update(report.as_metrics("train"))
        m.update({
            "time/generate_s": stats.generate_s, "time/env_s": stats.env_s,
            "time/update_s": t2 - t1, "time/iteration_s": time.perf_counter() - t0,
            "tokens/sampled": stats.policy_tokens,
            "tokens/per_s": stats.policy_tokens / max(stats.generate_s, 1e-9),
            "sampler/recompiles": getattr(self.sampler, "recompiles", 0),
            "batch/rows": int(batch.tokens.shape[0]), "batch/len": int(batch.tokens.shape[1]),
            "batch/valid_rows": float(valid.sum()),
        })
        for k, v in self.runner.health().items():
            m[f"env_health/{k}"] = v
        return state, m

    # ------------------------------------------------------------------ the loop

    def _wall_s(self) -> float:
        return self._wall_offset + time.perf_counter() - self._t_run

    def _meta(self, it: int, history: list, extra: dict) -> dict:
        return {"iteration": it, "data_position": it * self.config.rollout.tasks_per_iteration,
                "history": history, "seed": self.config.train.seed, "wall_s": self._wall_s(),
                **extra}

    def run(self) -> dict:
        cfg = self.config
        self._t_run, self._wall_offset = self._t_init, 0.0
        state, start, history, extra = self._start_or_resume()
        self.logger.truncate_after(start)
        every, ck_every = cfg.eval.every, cfg.train.checkpoint_every
        with P.Progress(cfg.train.progress, "rl", cfg.train.iterations, start) as bar:
            for it in range(start, cfg.train.iterations):
                state, m = self.iteration(state, it)
                done = it + 1
                last, periodic = done == cfg.train.iterations, every and done % every == 0
                val_m = eval_m = None
                if self.val_tasks and (last or periodic):
                    val_m = self._validate(state.model_params(), done, extra)
                    m.update(val_m)
                if last or (periodic and not self.val_tasks):
                    eval_m = self.evaluate(state.model_params(), f"iter {done}",
                                           eval_key(cfg.train.seed, done))
                    m.update(eval_m)
                    history.append({"iteration": done, **_hist(eval_m)})
                self.logger.log(done, m)
                bar.update(1, success=f"{m['train/success']:.2f}",
                           reward=f"{m['train/avg_reward']:.2f}")
                if last or val_m or (ck_every and done % ck_every == 0):
                    best = val_m["val/success"] if val_m else eval_m and eval_m["eval/success"]
                    self.checkpointer.save(done, state, self._meta(done, history, extra), best)
        self.checkpointer.wait()
        if self.val_tasks:
            self._test_best_val(history, extra)
        from jaxagent.train.summary import finish_run

        summary = finish_run(self, history, extra, self._wall_s())
        self.close()
        return summary

    def _validate(self, params, iteration: int, extra: dict) -> dict:
        """Validation evaluation; appends ``(iteration, success)`` to ``extra["val"]``."""
        key = jax.random.fold_in(self._sample_key, 2 * 10**6 + iteration)
        val_m = self.evaluate(params, f"iter {iteration}", key, split="val")
        extra.setdefault("val", []).append({"iteration": iteration,
                                            "success": val_m["val/success"]})
        return val_m

    def _test_best_val(self, history: list, extra: dict) -> None:
        """Test-split success of the checkpoint with the best validation success (ties: the
        later one), stored in ``extra["best_val"]``; reuses a test evaluation of that
        iteration when there is one (the start, or the end)."""
        best = max(extra["val"], key=lambda v: (v["success"], v["iteration"]))
        it = best["iteration"]
        done = [h for h in history if h["iteration"] == it]
        if done:
            test = done[0]
        else:
            state, _ = self.checkpointer.restore(it, self._new_state(self._init_params))
            m = self.evaluate(state.model_params(), f"best val iter {it}",
                              eval_key(self.config.train.seed, it))
            test = {"iteration": it, **_hist(m)}
        extra["best_val"] = {"iteration": it, "val_success": best["success"],
                             "test": {k: v for k, v in test.items() if k != "iteration"}}

    def _start_or_resume(self):
        cfg = self.config
        latest = self.checkpointer.latest_step() if cfg.train.resume else None
        if latest is not None:
            like = self._new_state(self._init_params)
            state, meta = self.checkpointer.restore(latest, like)
            self.echo(f"[resume] from checkpoint {latest} in {self.checkpointer.directory}")
            extra = {k: v for k, v in meta.items()
                     if k not in ("iteration", "data_position", "history", "seed", "wall_s")}
            self._wall_offset = float(meta.get("wall_s", 0.0))
            return state, int(meta["iteration"]), list(meta["history"]), extra
        params, extra = jax.tree.map(jnp.copy, self._init_params), {}
        if cfg.sft.enabled:
            if self.spec.make_expert is None:
                raise ValueError(f"sft.enabled=true but env {self.spec.name!r} has no scripted "
                                 "expert; set sft.enabled=false")
            params, sft_m = self.sft(params)
            self.logger.log(0, sft_m)
            extra["sft"] = sft_m
        m0 = self.evaluate(params, "before RL", eval_key(cfg.train.seed, 0))
        best = m0["eval/success"]
        if self.val_tasks:
            val_m = self._validate(params, 0, extra)
            m0.update(val_m)
            best = val_m["val/success"]
        self.logger.log(0, m0)
        history = [{"iteration": 0, **_hist(m0)}]
        state = self._new_state(params)
        self.checkpointer.save(0, state, self._meta(0, history, extra), best)
        return state, 0, history, extra

    def _new_state(self, params) -> TrainState:
        """A fresh TrainState; KL recipes keep a frozen copy of the start as the reference."""
        ref = jax.tree.map(jnp.copy, params) if self.rl.needs_reference else None
        return TrainState.create(params, self.rl, self._state_key, optimizer=self.optimizer,
                                 ref_params=ref)

    def close(self) -> None:
        self.checkpointer.close()
        self.logger.close()
        self.runner.close()


def _hist(eval_m: dict) -> dict:
    keep = {k.split("/", 1)[1]: v for k, v in eval_m.items()
            if k.startswith("eval/") and "/failure/" not in k}
    keep["failure_modes"] = {k.split("/failure/", 1)[1]: v for k, v in eval_m.items()
                             if k.startswith("eval/") and "/failure/" in k}
    return keep
