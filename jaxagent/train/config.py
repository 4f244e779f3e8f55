"""Typed, frozen run configuration, loaded from YAML with ``key=value`` overrides.

A run config is a tree of frozen keyword-only dataclasses; ``configs/*.yaml`` are thin overlays
on their defaults. A section is a package's own config (``mesh``, ``distributed``) or derived
from them by the one rule of ``jaxagent.sections`` (``model`` from ``models.ModelConfig``,
``env.pool`` from ``pool.PoolConfig``, ``env.faults`` from ``envs.faults.FaultConfig``,
``rollout`` from ``agents.rollout.Budget`` and ``generate.SamplingConfig``, the ``rl`` sections
from ``rl.config``), and the run builds the package configs back from them. Loading is
``jaxagent.sections.load_typed`` (OmegaConf structured configs): an unknown key, a renamed one
or a value of the wrong type is refused naming the key, and the sections' and the package
configs' own checks name the YAML key, the value and what is allowed.

Every value is fixed when a run is built: model sizes, batch sizes, ``max_new_tokens`` and budgets
set array shapes, and the RL sections (learning rate and clip ranges included) are compile-time
constants of the jitted update step, so changing one means building a new step.

The ``rl`` section is a recipe name plus typed sections whose keys default to ``null`` = "the
recipe preset's value": the preset is applied first, then every key the YAML or an override
set, so ``rl.recipe=grpo rl.kl.beta=0.1`` and ``rl.kl.beta=0.1 rl.recipe=grpo`` agree. The
resulting ``RLConfig`` is built once, with the ``Config`` (``Config.rl_config``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Dict, Sequence

from omegaconf import OmegaConf

from jaxagent.agents.engine import EngineConfig
from jaxagent.agents.rollout import Budget
from jaxagent.envs.faults import FAULT_KINDS, FaultConfig
from jaxagent.errors import FROZEN, ConfigError, check_choice, check_positive, check_prob
from jaxagent.generate.sampling import SamplingConfig
from jaxagent.parallel.distributed import DistributedConfig
from jaxagent.parallel.mesh import MeshConfig
from jaxagent.pool.config import PoolConfig
from jaxagent.rl.config import RLConfig
from jaxagent.sections import derive, load_typed
from jaxagent.train.guards import GuardSection
from jaxagent.train.model_section import ModelSection, TokenizerSection
from jaxagent.serve.harness import HarnessConfig
from jaxagent.train.overlap import OverlapSection
from jaxagent.train.rl_section import RLSection


def _pool_backends() -> tuple:
    from jaxagent.pool.backends import BACKENDS  # read when checked: register_backend adds

    return ("inline", *BACKENDS)


def _check_pool(section) -> None:
    check_choice("env.pool.backend", section.backend, _pool_backends())


PoolSection = derive(
    PoolConfig,
    key="env.pool",
    name="PoolSection",
    module=__name__,
    doc="How the environments run: ``jaxagent.pool.PoolConfig`` (``backend`` one of its "
    "registered backends, or ``inline``: no pool, every call in the trainer's thread).",
    drop=("seed",),  # the run's train.seed
    # a run's envs answer in milliseconds: a call past 5 s is a hang, found quickly
    defaults=dict(num_envs=16, step_timeout_s=5.0, reset_timeout_s=5.0),
    check=_check_pool,
    probe=lambda s: {"PoolConfig": {"seed": 0, "backend": _pool_probe_backend(s.backend)}},
)


def _pool_probe_backend(backend: str) -> str:
    return "thread" if backend == "inline" else backend  # inline: the other fields still apply


FaultSection = derive(
    FaultConfig,
    key="env.faults",
    name="FaultSection",
    module=__name__,
    doc="Fault injection into every environment call (``jaxagent.envs.faults.FaultConfig``); "
    "all 0 = off.",
    # a hang lasts 4 step timeouts (``fault_config``): long enough that only the pool's
    # timeout ends it, short enough that a thread worker's hang does not outlive the run
    drop=("hang_s",),
    probe=lambda s: {"FaultConfig": {"hang_s": 1.0}},
)

# Keys a config of an earlier layout may still use: refused, naming the key that replaced it.
RENAMED = {
    "env.backend": "env.pool.backend",
    "env.num_workers": "env.pool.num_envs",
    "env.step_timeout_s": "env.pool.step_timeout_s",
    "env.fault_hang_prob": "env.faults.hang",
    "env.fault_crash_prob": "env.faults.crash",
    "env.fault_seed": "env.faults.seed",
    "rl.overrides.": "the typed sections that replaced rl.overrides: rl.optim.learning_rate, rl.loss.clip_eps_high, "
    "rl.update.minibatch_size, rl.lora.rank, ...",
}


@dataclasses.dataclass(**FROZEN)
class EnvSection:
    """The environment suite, its pool and the faults injected into it."""

    name: str = "quickstart"  # a registered env (jaxagent.envs.registry.env_names())
    train_split: str = "train"  # tasks for RL and SFT
    eval_split: str = "test"  # held-out tasks for evaluation
    # The suite's options (flat keys), validated into its typed options dataclass by
    # jaxagent.envs.registry.parse_options; kept raw here because their type depends on name.
    options: Dict[str, Any] = dataclasses.field(default_factory=dict)
    pool: PoolSection = dataclasses.field(default_factory=PoolSection)
    faults: FaultSection = dataclasses.field(default_factory=FaultSection)

    def __post_init__(self):
        from jaxagent.envs import registry  # local: keeps config import light

        if ":" not in self.name:  # "package.module:name" is checked when imported below
            check_choice("env.name", self.name, registry.env_names())
        try:  # the suite's typed options: errors name env.options.<key>, value, allowed keys
            registry.parse_options(self.name, self.options)
        except (KeyError, ValueError) as exc:
            raise ConfigError(str(exc.args[0]) if exc.args else str(exc)) from None
        if self.injects_faults and self.pool.backend == "inline":
            set_ = [f"env.faults.{k}={getattr(self.faults, k)}" for k in FAULT_KINDS]
            raise ConfigError(
                f"{', '.join(x for x in set_ if not x.endswith('=0.0'))} need a pool backend, "
                "e.g. env.pool.backend='thread' or 'process' (the inline backend has no "
                "timeouts to contain a hang or a crash)"
            )

    @property
    def injects_faults(self) -> bool:
        return any(getattr(self.faults, kind) for kind in FAULT_KINDS)

    def pool_config(self, seed: int) -> PoolConfig:
        """The pool's config (a pool backend, not inline); episode seeds from ``seed``."""
        from jaxagent.sections import build

        return build(self.pool, PoolConfig, seed=seed)

    def fault_config(self) -> FaultConfig:
        from jaxagent.sections import build

        return build(self.faults, FaultConfig, hang_s=4 * self.pool.step_timeout_s)


def _check_rollout(section) -> None:
    check_positive("rollout.tasks_per_iteration", section.tasks_per_iteration)
    if section.samples_per_task < 0:
        raise ConfigError(
            f"rollout.samples_per_task={section.samples_per_task!r} must be >= 1 "
            "(K samples per task), or 0 for the recipe's default group size"
        )
    check_positive("rollout.max_total_tokens", section.max_total_tokens, allow_zero=True)
    check_positive("rollout.temperature", section.temperature, allow_zero=True)


def sampling_fields(temperature: float) -> dict:
    """A run's temperature as ``SamplingConfig`` fields: 0 is greedy decoding."""
    return dict(temperature=temperature if temperature > 0 else 1.0, greedy=temperature == 0)


RolloutSection = derive(
    Budget,
    SamplingConfig,
    EngineConfig,
    key="rollout",
    name="RolloutSection",
    module=__name__,
    doc="The episode budgets (``jaxagent.agents.rollout.Budget``), sampling "
    "(``jaxagent.generate.SamplingConfig``; temperature 0 = greedy), the episode loop "
    "(``jaxagent.agents.engine.EngineConfig``) and how many episodes an iteration collects.",
    # Derived: the episode's token budget (from max_total_tokens below and the model's length),
    # the stop ids (the chat template's) and greedy (temperature 0)
    drop=("max_total_tokens", "stop_token_ids", "greedy"),
    defaults=dict(max_new_tokens=40),
    extra=[
        ("tasks_per_iteration", int, 16),  # distinct tasks per RL iteration
        ("samples_per_task", int, 0),  # K samples per task (GRPO / LOOP / RLOO); 0 = recipe's
        ("max_total_tokens", int, 0),  # whole-episode token budget; 0 = model.max_seq_len
    ],
    check=_check_rollout,
    probe=lambda s: {
        "Budget": {"max_total_tokens": 1},
        "SamplingConfig": sampling_fields(s.temperature),
        "EngineConfig": {},
    },
)


@dataclasses.dataclass(**FROZEN)
class SFTSection:
    """Optional warm-start by supervised fine-tuning on scripted-expert demonstrations."""

    enabled: bool = False  # run SFT before RL
    num_demos: int = 1000  # demonstrations (episodes) from the expert on the train split
    expert_error_rate: float = 0.3  # share of expert episodes with a mistake
    steps: int = 300  # optimizer steps
    batch_size: int = 32  # sequences per step
    # rows a forward/backward pass, gradients summed over the step's microbatches (0: the
    # whole batch): the same step in a smaller working set, faster on CPU for long rows
    microbatch_size: int = 0
    learning_rate: float = 3e-3  # AdamW peak learning rate (cosine decay)
    only_successful: bool = False  # keep only demonstrations that succeed (RFT-style filter)
    # Weight of the next-token loss on the demonstrations' other tokens (prompt and
    # observations) beside the actions' weight 1: 0 imitates actions only. Pages repeat
    # what the agent must copy (titles, typed queries), so predicting them is practice in
    # copying that a from-scratch model gets from no other source.
    observation_weight: float = 0.0
    # Write the SFT model as a Hugging Face directory and start RL from it via model.init_from
    # (two stages of one `jaxagent train`: jaxagent/train/staged.py)
    to_hf: bool = False
    # A directory of fitted SFT results keyed by a hash of everything the fit reads (initial
    # weights, demonstrations, these settings, seed): a run whose SFT inputs equal an earlier
    # run's reuses its result (jaxagent/train/sft_cache.py). "" = off.
    cache_dir: str = ""
    # Restarts of a fit that did not learn: while the SFT model's validation success
    # (eval.val_tasks) is below min_val_success, SFT runs again from a new initialisation
    # and data order, at most max_restarts times (counted in the metrics and summary). A
    # small model from scratch learns to copy values from results abruptly, and whether it
    # does within the steps depends on its initialisation and data order (Olsson et al.
    # 2022, induction heads; the phase change varies across seeds).
    min_val_success: float = 0.0
    max_restarts: int = 0

    def __post_init__(self):
        check_positive("sft.num_demos", self.num_demos)
        check_prob("sft.min_val_success", self.min_val_success)
        check_positive("sft.max_restarts", self.max_restarts, allow_zero=True)
        check_prob("sft.expert_error_rate", self.expert_error_rate)
        check_positive("sft.steps", self.steps, allow_zero=True)
        check_positive("sft.batch_size", self.batch_size)
        check_positive("sft.microbatch_size", self.microbatch_size, allow_zero=True)
        if self.microbatch_size and self.batch_size % self.microbatch_size:
            raise ConfigError(
                f"sft.microbatch_size={self.microbatch_size} must divide "
                f"sft.batch_size={self.batch_size} (or be 0: the whole batch)"
            )
        check_positive("sft.learning_rate", self.learning_rate)
        check_prob("sft.observation_weight", self.observation_weight)


@dataclasses.dataclass(**FROZEN)
class EvalSection:
    """Periodic evaluation on the held-out split."""

    every: int = 5  # evaluate every N iterations (and always at start and end); 0 = only ends
    num_tasks: int = 100  # held-out tasks per evaluation
    temperature: float = 1.0  # evaluation sampling temperature (0 = greedy)
    samples_per_task: int = 1  # samples per held-out task
    # Validation tasks carved from the train split (never trained on) for model selection: when
    # > 0 the periodic evaluations run on them, the test split is evaluated at the start, the
    # end and on the best-validation checkpoint, and the summary reports both.
    val_tasks: int = 0

    def __post_init__(self):
        check_positive("eval.every", self.every, allow_zero=True)
        check_positive("eval.val_tasks", self.val_tasks, allow_zero=True)
        check_positive("eval.num_tasks", self.num_tasks)
        check_positive("eval.temperature", self.temperature, allow_zero=True)
        check_positive("eval.samples_per_task", self.samples_per_task)


@dataclasses.dataclass(**FROZEN)
class TrainSection:
    """The outer loop, checkpoints and logging."""

    iterations: int = 30  # RL iterations (collect -> advantages -> update)
    seed: int = 0  # seeds the model init, sampling, task order and the expert
    out_dir: str = "runs/{name}/seed{seed}"  # run directory ({name}, {seed} filled in)
    checkpoint_every: int = 5  # save every N iterations (and at the end); 0 = only at the end
    keep_checkpoints: int = 3  # keep the newest N (plus the best by eval success)
    # where checkpoints go: "" = <out_dir>/checkpoints, or any path orbax writes (gs://...),
    # e.g. object storage every host of a pod sees while out_dir stays on local disk
    checkpoint_dir: str = ""
    resume: bool = True  # continue from the newest checkpoint in out_dir when there is one
    progress: str = "rich"  # live progress display: rich, tqdm or none
    # "rich" when stderr is not a terminal (a log file, a cluster job): a plain line this often
    progress_every_s: float = 30.0
    tensorboard: bool = True  # write TensorBoard event files next to metrics.jsonl
    wandb: bool = False  # also log to Weights & Biases (needs `pip install wandb`)
    plot: bool = True  # write learning_curve.png at the end
    # Drop compiled programs when their phase ends (sampling, update, evaluation) and reload
    # them from a persistent XLA cache: on CPU, compiled code shares the heap with the arrays.
    release_compiled: bool = False

    def __post_init__(self):
        check_positive("train.iterations", self.iterations, allow_zero=True)
        check_positive("train.checkpoint_every", self.checkpoint_every, allow_zero=True)
        check_positive("train.keep_checkpoints", self.keep_checkpoints)
        check_choice("train.progress", self.progress, ("rich", "tqdm", "none"))
        check_positive("train.progress_every_s", self.progress_every_s)


# Not slotted: the run's RLConfig is kept beside the fields (``rl_config``), built once.
@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """A whole run. ``name`` and ``paper`` say what the run reproduces."""

    name: str = "run"  # run name (used in out_dir)
    paper: str = ""  # the paper (and arXiv id) the recipe follows
    model: ModelSection = dataclasses.field(default_factory=ModelSection)
    tokenizer: TokenizerSection = dataclasses.field(default_factory=TokenizerSection)
    env: EnvSection = dataclasses.field(default_factory=EnvSection)
    rollout: RolloutSection = dataclasses.field(default_factory=RolloutSection)
    rl: RLSection = dataclasses.field(default_factory=RLSection)
    sft: SFTSection = dataclasses.field(default_factory=SFTSection)
    eval: EvalSection = dataclasses.field(default_factory=EvalSection)
    train: TrainSection = dataclasses.field(default_factory=TrainSection)
    guards: GuardSection = dataclasses.field(default_factory=GuardSection)
    overlap: OverlapSection = dataclasses.field(default_factory=OverlapSection)
    harness: HarnessConfig = dataclasses.field(default_factory=HarnessConfig)
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
    distributed: DistributedConfig = dataclasses.field(default_factory=DistributedConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.train.out_dir.format(name=self.name, seed=self.train.seed))

    def checkpoint_dir(self, run_dir: Path | None = None) -> str:
        """``train.checkpoint_dir`` ({name}, {seed} filled in), or ``<run_dir>/checkpoints``
        (``run_dir``: where the run directory is now; default ``train.out_dir``)."""
        own = self.train.checkpoint_dir.format(name=self.name, seed=self.train.seed)
        return own or str((run_dir or self.run_dir) / "checkpoints")

    def __post_init__(self):
        # The one place the recipe's preset and the rl keys become the run's RLConfig: every
        # consumer (trainer, optimiser, resume, batch layout) reads this object.
        object.__setattr__(self, "_rl", self.rl.build())
        self._check_rl_sampling()
        self._check_sft_restarts()
        self._check_param_dtype()
        self._check_overlap()

    @property
    def rl_config(self) -> RLConfig:
        """The typed ``jaxagent.rl.config.RLConfig`` of this run (built once, with the config)."""
        return self._rl

    def _check_rl_sampling(self) -> None:
        """Ratio-based and on-policy losses (PPO, REINFORCE, KL estimates) read the behaviour
        log-probs as the policy's own; the sampler records them before temperature and
        top-k / top-p, so any of these would bias every importance ratio and gradient."""
        r, rl = self.rollout, self.rl_config
        changed = [
            f"rollout.{k}={v!r}"
            for k, v, off in (
                ("temperature", r.temperature, 1.0),
                ("top_k", r.top_k, 0),
                ("top_p", r.top_p, 1.0),
            )
            if v != off
        ]
        if changed and rl.on_policy_sampling:
            raise ConfigError(
                f"{', '.join(changed)} with rl.recipe={self.rl.recipe!r}: its loss "
                f"(rl.loss.policy={rl.loss.policy!r}, rl.kl.mode={rl.kl.mode!r}) needs tokens "
                "sampled at temperature 1 without top-k / top-p (the behaviour log-probs are "
                "those of the unfiltered distribution); set rollout.temperature=1.0, "
                "rollout.top_k=0 and rollout.top_p=1.0, or use an SFT-loss recipe (rft) for "
                "filtered sampling"
            )

    def _check_sft_restarts(self) -> None:
        """An SFT restart is judged on the validation split and draws a new initialisation,
        so it needs both, and a threshold to judge by."""
        s = self.sft
        if not (s.enabled and s.max_restarts):
            return
        if not s.min_val_success:
            raise ConfigError(
                f"sft.max_restarts={s.max_restarts} with sft.min_val_success=0: no fit would "
                "ever be restarted; set the validation success a fit must reach, e.g. "
                "sft.min_val_success=0.1, or sft.max_restarts=0"
            )
        if not self.eval.val_tasks:
            raise ConfigError(
                f"sft.max_restarts={s.max_restarts} with eval.val_tasks=0: a fit is judged on "
                "the validation split; set eval.val_tasks (e.g. eval.val_tasks=50)"
            )
        if self.model.init_from:
            raise ConfigError(
                f"sft.max_restarts={s.max_restarts} with model.init_from="
                f"{self.model.init_from!r}: a restart draws a new initialisation of a model "
                "built from scratch; set sft.max_restarts=0"
            )

    def _check_param_dtype(self) -> None:
        """Full fine-tuning of bfloat16 weights barely trains: an Adam step moves a weight by
        about the learning rate, far below half a bfloat16 ulp of most weights (2^-8 of
        their size), so the rounded sum is the old weight (10 AdamW steps at 1e-5 move 14% of a
        tiny model's entries in bfloat16 against 89% in float32, ``tests/test_bf16_master.py``;
        at a 7B model's weight scales 1.3%).
        float32 weights with bfloat16 compute are the master copy that fixes it: the
        optimiser and weights in float32, every matmul in ``model.dtype``, and
        ``mesh.sampling_dtype=bfloat16`` samples from a bfloat16 copy."""
        trains = self.train.iterations > 0 or (self.sft.enabled and self.sft.steps > 0)
        if self.model.param_dtype == "bfloat16" and not self.rl_config.lora.rank and trains:
            raise ConfigError(
                "model.param_dtype=bfloat16 with full fine-tuning (rl.lora.rank=0): Adam's "
                "updates round away in bfloat16 weights; set model.param_dtype=float32 "
                "(a float32 master, computed in model.dtype=bfloat16) or rl.lora.rank>0"
            )

    def _check_overlap(self) -> None:
        """The overlapped rollout shares the devices with the update, so every program and
        buffer of both phases stays alive (``train.release_compiled`` frees them between
        phases), and the producer thread runs the rollout's cross-host collectives beside
        the update's (several processes would interleave them)."""
        if self.harness.entry and self.rl.data.dynamic_sampling:
            raise ConfigError(
                f"harness.entry={self.harness.entry!r} with rl.data.dynamic_sampling=true: "
                "refills draw from the built-in driver; set rl.data.dynamic_sampling=false"
            )
        o = self.overlap
        if o.lanes > 1 and self.harness.entry:
            raise ConfigError(
                f"overlap.lanes={o.lanes} with harness.entry: the harness talks to the run's "
                "one server, which samples one policy version at a time; set overlap.lanes=1"
            )
        if o.partial_rollouts and self.harness.entry:
            raise ConfigError(
                "overlap.partial_rollouts=true with harness.entry: the harness samples through "
                "the run's server, whose weights do not change within a collection; set "
                "overlap.partial_rollouts=false"
            )
        k = o.staleness
        if not k:
            return
        if self.train.release_compiled:
            raise ConfigError(
                f"overlap.staleness={k} with train.release_compiled=true: the rollout and the "
                "update run at the same time, so neither phase's programs can be freed; set "
                "train.release_compiled=false or overlap.staleness=0"
            )
        if self.distributed.num_processes > 1:
            raise ConfigError(
                f"overlap.staleness={k} with distributed.num_processes="
                f"{self.distributed.num_processes}: the overlapped rollout runs on one process "
                "for now; set overlap.staleness=0 for a multi-host run"
            )

    def check_processes(self, count: int) -> None:
        """The checks that need the process count JAX found at start-up (a pod's processes
        may be discovered rather than named in ``distributed.num_processes``)."""
        if self.overlap.staleness and count > 1:
            raise ConfigError(
                f"overlap.staleness={self.overlap.staleness} in a run of {count} processes: "
                "the overlapped rollout runs on one process for now; set overlap.staleness=0 "
                "for a multi-host run"
            )

    @property
    def group_size(self) -> int:
        """Samples per task K: ``rollout.samples_per_task``, or the recipe's K when that is 0."""
        from jaxagent.rl.recipes import default_samples_per_task

        return self.rollout.samples_per_task or default_samples_per_task(self.rl.recipe)

    @property
    def max_total_tokens(self) -> int:
        return self.rollout.max_total_tokens or self.model.max_seq_len


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """Load a YAML file onto the ``Config`` schema and apply ``key=value`` overrides.

    Args:
      path: a YAML file (thin overlay on the defaults); None uses the defaults.
      overrides: dotted ``key=value`` strings, e.g. ``["rl.optim.learning_rate=3e-4"]``.

    Returns:
      A validated, frozen ``Config``.

    Raises:
      ConfigError: unknown key (a renamed one names its new key), wrong type or invalid
        value, naming the key and the fix.
    """
    return load_typed(Config, path, overrides, renamed=RENAMED)


def config_to_dict(config: Config) -> dict:
    """A plain nested dict (for logging and for saving next to checkpoints)."""
    return OmegaConf.to_container(OmegaConf.structured(config), resolve=True)


def config_to_yaml(config: Config) -> str:
    """The resolved config as YAML (saved in the run directory; ``load_config`` reads it)."""
    return OmegaConf.to_yaml(OmegaConf.structured(config))


def replace(config: Config, overrides: Sequence[str]) -> Config:
    """A copy of ``config`` with dotted ``key=value`` overrides applied (validated)."""
    return load_typed(config, None, overrides, renamed=RENAMED)
