"""Typed, frozen run configuration, loaded from YAML with ``key=value`` overrides.

A run config is a tree of frozen keyword-only dataclasses; ``configs/*.yaml`` are thin overlays
on their defaults. Loading goes through OmegaConf structured configs (a maintained library, not
a hand-written parser): the YAML and the overrides are merged onto the dataclass schema, so an
unknown key or a value of the wrong type is rejected, and ``__post_init__`` validates choices and
ranges. Every error is re-raised as ``ConfigError`` naming the key, the value and what is allowed.

Every value is fixed when a run is built: model sizes, batch sizes, ``max_new_tokens`` and budgets
set array shapes, and the RL sections (learning rate and clip ranges included) are compile-time
constants of the jitted update step, so changing one means building a new step.

The ``rl`` section is a recipe name plus typed sections whose keys default to ``null`` = "the
recipe preset's value": the preset is applied first, then every key the YAML or an override
set, so ``rl.recipe=grpo rl.kl.beta=0.1`` and ``rl.kl.beta=0.1 rl.recipe=grpo`` agree.
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import Any, Dict, List, Sequence

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from jaxagent.errors import FROZEN, ConfigError, check_choice, check_positive, check_prob  # noqa: F401
from jaxagent.train.guards import GuardSection  # noqa: F401  (resolved by name, like the rest)
from jaxagent.parallel.distributed import DistributedConfig
from jaxagent.parallel.mesh import MeshConfig
from jaxagent.train.model_section import ModelSection, TokenizerSection  # noqa: F401
from jaxagent.train.rl_section import (  # noqa: F401  (names _section_type resolves)
    AdvantageFields,
    CriticFields,
    KLFields,
    LoraFields,
    LossFields,
    OptimFields,
    RLDataSection,
    RLSection,
    UpdateFields,
)


@dataclasses.dataclass(**FROZEN)
class EnvSection:
    """The environment suite and its pool."""

    name: str = "quickstart"  # a registered env (jaxagent.envs.registry.env_names())
    train_split: str = "train"  # tasks for RL and SFT
    eval_split: str = "test"  # held-out tasks for evaluation
    # The suite's options (flat keys), validated into its typed options dataclass by
    # jaxagent.envs.registry.parse_options; kept raw here because their type depends on name.
    options: Dict[str, Any] = dataclasses.field(default_factory=dict)
    backend: str = "thread"  # EnvPool backend: "inline" (no pool), "thread" or "process"
    num_workers: int = 16  # concurrent environment instances
    step_timeout_s: float = 5.0  # per-call timeout; a hang past it is an env_error
    fault_hang_prob: float = 0.0  # fault injection: probability a call hangs
    fault_crash_prob: float = 0.0  # fault injection: probability a call crashes the env
    fault_seed: int = 0  # fault injection seed

    def __post_init__(self):
        from jaxagent.envs import registry  # local: keeps config import light

        if ":" not in self.name:  # "package.module:name" is checked when imported below
            check_choice("env.name", self.name, registry.env_names())
        try:  # the suite's typed options: errors name env.options.<key>, value, allowed keys
            registry.parse_options(self.name, self.options)
        except (KeyError, ValueError) as exc:
            raise ConfigError(str(exc.args[0]) if exc.args else str(exc)) from exc
        check_choice("env.backend", self.backend, ("inline", "thread", "process"))
        check_positive("env.num_workers", self.num_workers)
        check_positive("env.step_timeout_s", self.step_timeout_s)
        check_prob("env.fault_hang_prob", self.fault_hang_prob)
        check_prob("env.fault_crash_prob", self.fault_crash_prob)
        if (self.fault_hang_prob or self.fault_crash_prob) and self.backend == "inline":
            raise ConfigError(
                "env.fault_hang_prob / env.fault_crash_prob need env.backend='thread' or "
                "'process' (the inline backend has no timeouts to contain a hang)"
            )


@dataclasses.dataclass(**FROZEN)
class RolloutSection:
    """Sampling and the episode budgets (turns, tokens per turn, total tokens)."""

    tasks_per_iteration: int = 16  # distinct tasks per RL iteration
    samples_per_task: int = 0  # K samples per task (GRPO / LOOP / RLOO group); 0 = recipe's
    max_turns: int = 6  # policy turns per episode before truncation
    max_new_tokens: int = 40  # tokens per policy turn
    max_total_tokens: int = 0  # whole-episode token budget; 0 = model.max_seq_len
    max_observation_chars: int = 0  # cut longer observations (visible marker); 0 = no limit
    temperature: float = 1.0  # sampling temperature (RL needs 1.0 for exact ratios)
    top_k: int = 0  # 0 disables top-k
    top_p: float = 1.0  # 1.0 disables nucleus sampling
    # One random stream per episode row (global row number): what is sampled does not depend
    # on how rows are split over hosts. Always on with several processes; on in one process,
    # it reproduces a multi-host run exactly. Off: one stream per batch (the older runs').
    row_keys: bool = False

    def __post_init__(self):
        for name in ("tasks_per_iteration", "max_turns", "max_new_tokens"):
            check_positive(f"rollout.{name}", getattr(self, name))
        if self.samples_per_task < 0:
            raise ConfigError(
                f"rollout.samples_per_task={self.samples_per_task!r} must be >= 1 "
                "(K samples per task), or 0 for the recipe's default group size"
            )
        check_positive("rollout.max_total_tokens", self.max_total_tokens, allow_zero=True)
        if 0 < self.max_observation_chars < 64:
            raise ConfigError(
                f"rollout.max_observation_chars={self.max_observation_chars} "
                "must be 0 (off) or >= 64 (room for the truncation marker)"
            )
        check_positive("rollout.temperature", self.temperature, allow_zero=True)
        check_positive("rollout.top_k", self.top_k, allow_zero=True)
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"rollout.top_p={self.top_p!r} must be in (0, 1]")


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

    def __post_init__(self):
        check_positive("sft.num_demos", self.num_demos)
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
    resume: bool = True  # continue from the newest checkpoint in out_dir when there is one
    progress: str = "rich"  # live progress display: rich, tqdm or none
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


@dataclasses.dataclass(**FROZEN)
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
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
    distributed: DistributedConfig = dataclasses.field(default_factory=DistributedConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.train.out_dir.format(name=self.name, seed=self.train.seed))

    def __post_init__(self):
        self._check_rl_sampling()

    def _check_rl_sampling(self) -> None:
        """Ratio-based and on-policy losses (PPO, REINFORCE, KL estimates) read the behaviour
        log-probs as the policy's own; the sampler records them before temperature and
        top-k / top-p, so any of these would bias every importance ratio and gradient."""
        r = self.rollout
        changed = [
            f"rollout.{k}={v!r}"
            for k, v, off in (
                ("temperature", r.temperature, 1.0),
                ("top_k", r.top_k, 0),
                ("top_p", r.top_p, 1.0),
            )
            if v != off
        ]
        if changed and self.rl_config().on_policy_sampling:
            raise ConfigError(
                f"{', '.join(changed)} with rl.recipe={self.rl.recipe!r}: its loss "
                f"(rl.loss.policy={self.rl_config().loss.policy!r}, rl.kl.mode="
                f"{self.rl_config().kl.mode!r}) needs tokens sampled at temperature 1 without "
                "top-k / top-p (the behaviour log-probs are those of the unfiltered "
                "distribution); set rollout.temperature=1.0, rollout.top_k=0 and "
                "rollout.top_p=1.0, or use an SFT-loss recipe (rft) for filtered sampling"
            )

    def rl_config(self):
        """The typed ``jaxagent.rl.config.RLConfig`` of this run."""
        return self.rl.build()

    @property
    def group_size(self) -> int:
        """Samples per task K: ``rollout.samples_per_task``, or the recipe's K when that is 0."""
        from jaxagent.rl.recipes import default_samples_per_task

        return self.rollout.samples_per_task or default_samples_per_task(self.rl.recipe)

    @property
    def max_total_tokens(self) -> int:
        return self.rollout.max_total_tokens or self.model.max_seq_len


def _fields_of(node_type: Any) -> List[str]:
    if dataclasses.is_dataclass(node_type):
        return [f.name for f in dataclasses.fields(node_type)]
    return []


def _section_type(full_key: str) -> Any:
    node: Any = Config
    for part in [p for p in full_key.split(".")[:-1] if p]:
        types = (
            {f.name: f.type for f in dataclasses.fields(node)}
            if dataclasses.is_dataclass(node)
            else {}
        )
        hint = types.get(part)
        node = globals().get(hint, None) if isinstance(hint, str) else hint
        if node is None:
            return None
    return node


def _explain(err: OmegaConfBaseException, origin: str) -> ConfigError:
    full_key = getattr(err, "full_key", None) or getattr(err, "key", None) or "?"
    if isinstance(err, ConfigKeyError):
        section = _section_type(str(full_key))
        allowed = _fields_of(section)
        leaf = str(full_key).split(".")[-1]
        close = difflib.get_close_matches(leaf, allowed, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        if str(full_key).startswith("rl.overrides"):
            hint = (
                " (rl.overrides was replaced by typed sections: rl.optim.learning_rate, "
                "rl.loss.clip_eps_high, rl.update.minibatch_size, rl.lora.rank, ...)"
            )
        return ConfigError(
            f"{origin}: unknown config key {full_key!r}{hint}; allowed keys here: {allowed}"
        )
    if isinstance(err, ValidationError):
        msg = str(err).splitlines()[0]
        return ConfigError(f"{origin}: bad value for {full_key!r}: {msg}")
    return ConfigError(f"{origin}: {str(err).splitlines()[0]} (key {full_key!r})")


def _yaml_problem(err: Exception) -> str:
    mark = getattr(err, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return where + (getattr(err, "problem", None) or str(err).splitlines()[0])


def _load_yaml(path: Path) -> DictConfig:
    """A config file's top level, which must be a YAML mapping of sections."""
    try:
        layer = OmegaConf.load(path)
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ConfigError(
            f"config file {str(path)!r} is not valid YAML ({_yaml_problem(err)}); fix the "
            "syntax there (configs/quickstart.yaml is a working example)"
        ) from None
    if not isinstance(layer, DictConfig):
        raise ConfigError(
            f"config file {str(path)!r} holds a YAML {type(layer).__name__.replace('Config', '').lower()}, "
            "not a mapping of sections; write it as `model:`, `env:`, `rl:` ... blocks "
            "(configs/quickstart.yaml is a working example)"
        )
    return layer


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """Load a YAML file onto the ``Config`` schema and apply ``key=value`` overrides.

    Args:
      path: a YAML file (thin overlay on the defaults); None uses the defaults.
      overrides: dotted ``key=value`` strings, e.g. ``["rl.optim.learning_rate=3e-4"]``.

    Returns:
      A validated, frozen ``Config``.

    Raises:
      ConfigError: unknown key, wrong type or invalid value, naming the key and the fix.
    """
    schema = OmegaConf.structured(Config)
    layers = []
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(
                f"config file {str(path)!r} does not exist; pass a YAML file "
                "such as configs/quickstart.yaml"
            )
        layers.append((str(path), _load_yaml(path)))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key=value (e.g. train.seed=1)")
        try:
            layers.append((f"override {item!r}", OmegaConf.from_dotlist([item])))
        except (yaml.YAMLError, OmegaConfBaseException) as err:
            raise ConfigError(
                f"override {item!r}: its value is not valid YAML ({_yaml_problem(err)}); quote "
                "it, e.g. key='value'"
            ) from None
    merged = schema
    for origin, layer in layers:
        try:
            merged = OmegaConf.merge(merged, layer)
        except OmegaConfBaseException as err:
            raise _explain(err, origin) from None
    try:
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        raise _explain(err, str(path or "config")) from None


def config_to_dict(config: Config) -> dict:
    """A plain nested dict (for logging and for saving next to checkpoints)."""
    return OmegaConf.to_container(OmegaConf.structured(config), resolve=True)


def config_to_yaml(config: Config) -> str:
    """The resolved config as YAML (saved in the run directory; ``load_config`` reads it)."""
    return OmegaConf.to_yaml(OmegaConf.structured(config))


def replace(config: Config, overrides: Sequence[str]) -> Config:
    """A copy of ``config`` with dotted ``key=value`` overrides applied (validated)."""
    merged = OmegaConf.structured(config)
    for item in overrides:
        try:
            merged = OmegaConf.merge(merged, OmegaConf.from_dotlist([item]))
        except OmegaConfBaseException as err:
            raise _explain(err, f"override {item!r}") from None
    return OmegaConf.to_object(merged)
