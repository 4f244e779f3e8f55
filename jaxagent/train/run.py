"""Build a run from its config: task splits, tokenizer, chat, model, samplers, budget, runner.

``build_run(config)`` is the one place a config becomes live objects; the trainer and every
CLI command start from it, so ``jaxagent eval`` evaluates with exactly the tasks, chat chunks,
budgets, sampler settings and keys the trainer used.

Keys: everything random derives from ``train.seed`` (``sample_keys``: model init, train
state, sampling). The sampling key of iteration ``it`` is ``fold_in(sampling, it)``; the
held-out evaluation after ``it`` iterations uses ``eval_key(seed, it)`` and the validation
one ``val_key(seed, it)``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Callable, Optional

import jax
import numpy as np

from jaxagent.agents.chat import Chat, make_chat
from jaxagent.agents.engine import EngineConfig
from jaxagent.agents.rollout import Budget, RolloutSpec
from jaxagent.agents.task_tools import tools_of_env
from jaxagent.agents.runner import EnvRunner, InlineRunner
from jaxagent.agents.turn_policy import TurnPolicy
from jaxagent.envs.base import Task
from jaxagent.envs.registry import EnvFactory, EnvSpec, get_env_spec
from jaxagent.generate import SamplingConfig
from jaxagent.models import ModelConfig, load_tokenizer
from jaxagent.models import abstract_params as abstract_model_params
from jaxagent.parallel.layout import DeviceLayout
from jaxagent.sections import build
from jaxagent.train.config import Config, sampling_fields
from jaxagent.errors import ConfigError
from jaxagent.train.policy import build_model, hf_input, make_turn_sampler, state_reserve_bytes
from jaxagent.train.state import device_layout
from jaxagent.train.tokenizer import build_chatml_tokenizer, build_tokenizer, build_word_tokenizer


def sample_keys(seed: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(model init key, train-state key, sampling key) of a run seed."""
    return tuple(jax.random.split(jax.random.key(seed), 3))


def eval_key(seed: int, iteration: int) -> jax.Array:
    """The sampling key of the held-out evaluation after ``iteration`` RL iterations, so
    ``jaxagent eval`` on a checkpoint reproduces the trainer's evaluation exactly."""
    return jax.random.fold_in(sample_keys(seed)[2], 10**6 + iteration)


def iteration_tasks(tasks: list, per_iteration: int, seed: int, iteration: int) -> list:
    """Deterministic data order: an epoch-wise permutation of the train split, so a resumed
    run draws the same tasks for the same iteration."""
    out, perms = [], {}  # one permutation per epoch the iteration touches, not per task
    for j in range(iteration * per_iteration, (iteration + 1) * per_iteration):
        epoch, pos = divmod(j, len(tasks))
        if epoch not in perms:
            perms[epoch] = np.random.default_rng([seed, 3, epoch]).permutation(len(tasks))
        out.append(tasks[perms[epoch][pos]])
    return out


def val_key(seed: int, iteration: int) -> jax.Array:
    """The sampling key of the validation evaluation after ``iteration`` RL iterations."""
    return jax.random.fold_in(sample_keys(seed)[2], 2 * 10**6 + iteration)


@dataclasses.dataclass(frozen=True)
class TaskSplits:
    """The run's tasks. ``val`` is carved from the train split (never trained on)."""

    train: list[Task]  # RL's tasks: the train split minus ``val``
    val: list[Task]  # model-selection tasks ([] when eval.val_tasks = 0)
    sft: list[Task]  # SFT's demonstration tasks, in their seeded order (``val`` excluded)
    eval: list[Task]  # held-out tasks (the first eval.num_tasks of the eval split)


def split_tasks(config: Config, env: EnvSpec) -> TaskSplits:
    """The task splits of a run (see ``TaskSplits``).

    SFT draws its demonstrations in a seeded order of the train split; the validation tasks
    are that order's last ones, so SFT never sees them (and its data is the same with or
    without them) and RL's tasks are the rest of the split.
    """
    source = env.make_source()
    train = list(source.tasks(config.env.train_split))
    test = list(source.tasks(config.env.eval_split))[: config.eval.num_tasks]
    n_val = config.eval.val_tasks
    if n_val and n_val >= len(train):
        raise ConfigError(
            f"eval.val_tasks={n_val} leaves no training tasks (split "
            f"{config.env.train_split!r} has {len(train)}); use fewer"
        )
    order = np.random.default_rng([config.train.seed, 5]).permutation(len(train))
    cut = len(order) - n_val
    held = set(order[cut:].tolist())
    splits = TaskSplits(
        train=[t for i, t in enumerate(train) if i not in held],
        val=[train[i] for i in order[cut:]],
        sft=[train[i] for i in order[:cut]],
        eval=test,
    )
    if not splits.train or not splits.eval:
        raise ConfigError(
            f"env.train_split={config.env.train_split!r} or env.eval_split="
            f"{config.env.eval_split!r} of env {config.env.name!r} is empty; "
            "choose splits with tasks"
        )
    return splits


def run_tokenizer(
    config: Config, env: EnvSpec, train_tasks: list[Task], directory: Optional[Path] = None
):
    """The run's tokenizer: the one saved in ``directory`` when there is one, else the
    model's (``model.init_from``), else built from scratch (``tokenizer.kind``). Nothing is
    written: the trainer saves it once every input has been checked."""
    if directory is not None and (directory / "tokenizer.json").exists():
        return load_tokenizer(str(directory))
    section = config.tokenizer
    if config.model.init_from:
        if not Path(config.model.init_from).is_dir():
            raise ConfigError(
                f"model.init_from={config.model.init_from!r} is not a directory; pass a local "
                "Hugging Face model directory (config.json, safetensors, tokenizer files)"
            )
        tok = hf_input(load_tokenizer)(config.model.init_from)  # bad directory: ConfigError
    elif section.kind == "word":
        if env.vocabulary is None:
            raise ConfigError(
                f"tokenizer.kind='word' needs an env with a closed vocabulary; "
                f"env {env.name!r} has none: use tokenizer.kind='bpe'"
            )
        tok = build_word_tokenizer(env.vocabulary())
    elif section.kind == "chatml":  # a real model's layout: ChatML, tools, <tool_call>
        from jaxagent.train.chatml_corpus import chatml_corpus

        tok = build_chatml_tokenizer(chatml_corpus(config, env, train_tasks), section.vocab_size)
    else:
        corpus = [env.system_prompt] + [t.prompt for t in train_tasks]
        tok = build_tokenizer(corpus, section.vocab_size)
    return tok


def generation_eos_ids(init_from: str) -> tuple[int, ...]:
    """The eos ids of a Hugging Face model directory's ``generation_config.json`` (an int or
    a list: Llama 3.1 Instruct lists <|end_of_text|>, <|eom_id|> and <|eot_id|>), which
    ``generate`` stops on; () without a directory or file."""
    path = Path(init_from) / "generation_config.json" if init_from else None
    if path is None or not path.is_file():
        return ()
    try:
        eos = json.loads(path.read_text()).get("eos_token_id")
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"model.init_from={init_from!r}: generation_config.json is unreadable ({exc}); "
            "fix or remove the file"
        ) from exc
    eos = [eos] if isinstance(eos, int) else eos or []
    return tuple(int(t) for t in eos if isinstance(t, int))


def make_runner(config: Config, *, render_dir: Optional[str] = None) -> EnvRunner:
    """The env runner the config asks for (inline calls, or the EnvPool with faults).

    With ``render_dir`` the episodes run inline in this process and every frame is saved
    there (``envs/render.py``): a picture of each step, for ``jaxagent rollout --render``.
    """
    env = config.env
    make_env = EnvFactory(env.name, dict(env.options))
    if render_dir is not None:
        from jaxagent.envs.render import RenderingEnvFactory

        return InlineRunner(RenderingEnvFactory(make_env, render_dir))
    if env.pool.backend == "inline":
        return InlineRunner(make_env)
    from jaxagent.agents.pool_runner import PoolRunner
    from jaxagent.pool.shipping import WorkerEnvFn

    # Process workers start from a fork server, not as forks of this process (JAX's threads
    # are running: a fork can deadlock), so they inherit no registration made at run time
    # (a suite registered in a test or a script's main()): they get the suite's own make_env,
    # pickled by reference, rather than its name (jaxagent.pool.shipping).
    env_fn: Callable = WorkerEnvFn(get_env_spec(env.name, env.options).make_env)
    if env.injects_faults:
        from jaxagent.envs.faults import FaultyEnvFactory

        env_fn = FaultyEnvFactory(env_fn, env.fault_config())
    return PoolRunner(env_fn, env.pool_config(seed=config.train.seed))


@dataclasses.dataclass(frozen=True)
class Run:
    """The live pieces of one run (``build_run``)."""

    config: Config
    env: EnvSpec  # the env suite: task source, environments, system prompt, expert
    tasks: TaskSplits
    tokenizer: Any
    chat: Chat
    graphdef: Any
    params: Any  # the initial (or loaded) model parameters
    model_config: ModelConfig
    max_len: int  # the longest episode in tokens (budget and batch width)
    budget: Budget
    sampler: TurnPolicy  # RL's sampler (rollout.temperature / top_k / top_p)
    eval_sampler: TurnPolicy  # the evaluations' sampler (eval.temperature); may be ``sampler``
    rollout: RolloutSpec  # chat, system prompt, budget and the environment runner
    model_key: jax.Array
    state_key: jax.Array
    sample_key: jax.Array
    # Another RL sampler and environment runner, built as ``sampler`` / ``rollout`` were (they
    # are its first call): a further collection lane (``overlap.lanes``); the caller closes
    # the runner.
    make_lane: Optional[Callable[[], tuple[TurnPolicy, RolloutSpec]]] = None
    # The device layout of ``config.mesh`` over the model's shapes (``build_run(layout=True)``;
    # the parameters were born in its shards), else None.
    layout: Optional[DeviceLayout] = None

    def close(self) -> None:
        self.rollout.runner.close()


def build_run(
    config: Config,
    *,
    policy: Any = None,
    tokenizer_dir: Optional[Path] = None,
    render_dir: Optional[str] = None,
    layout: bool = False,
    abstract_params: bool = False,
) -> Run:
    """Build a run's pieces from its config.

    Args:
      config: the run config.
      policy: a ``jaxagent.train.session.LoadedPolicy``: use its tokenizer and model instead
        of building them (``jaxagent eval`` / ``rollout`` on a checkpoint).
      tokenizer_dir: where a resumed run keeps its tokenizer (``<run_dir>/tokenizer``),
        loaded from there; None builds it (nothing is saved here).
      layout: build the device layout of ``config.mesh`` (``Run.layout``) once the model's
        shapes are known, and make the parameters born in its shards
        (``jaxagent.train.policy.build_model``).
      abstract_params: the parameters' shapes and dtypes only (a resumed run reads its
        weights from its checkpoint).

    Returns:
      The ``Run``.
    """
    env = get_env_spec(config.env.name, config.env.options)
    tasks = split_tasks(config, env)
    model_key, state_key, sample_key = sample_keys(config.train.seed)
    layouts: list[DeviceLayout] = []

    def shardings(model_config: ModelConfig):  # asked before any weight is read or made
        layouts.append(device_layout(config.mesh, model_config, config.overlap.sampler_devices))
        if layouts[-1].mesh is None:
            return None
        return layouts[-1].param_shardings(abstract_model_params(model_config))

    if policy is None:
        tokenizer = run_tokenizer(config, env, tasks.train, tokenizer_dir)
        graphdef, params, model_config = build_model(
            config.model,
            tokenizer,
            model_key,
            shardings=shardings if layout else None,
            abstract=abstract_params,
        )
    else:
        tokenizer, graphdef, params, model_config = (
            policy.tokenizer,
            policy.graphdef,
            policy.params,
            policy.model_config,
        )
    chat = make_chat(
        tokenizer,
        tools_of=tools_of_env(env.name),
        extra_stop_ids=generation_eos_ids(config.model.init_from),
    )
    r = config.rollout
    # jaxagent.generate.Sampler checks every row's cached length + max_new_tokens against
    # the model's max_seq_len (finished rows included), so episodes stop that much earlier.
    max_len = min(config.max_total_tokens, model_config.max_seq_len - r.max_new_tokens)
    budget = build(r, Budget, max_total_tokens=max_len)

    grammar = None
    if r.constrained_tool_calls:
        grammar = run_grammar(config, env, chat, model_config.vocab_size)

    # what a training run's state adds once the sampler has measured the chip's free memory
    reserve = 0
    if policy is None:
        reserve = state_reserve_bytes(params, config.rl_config, loaded=not abstract_params)

    def sampler(temperature: float, **changes) -> TurnPolicy:
        sampling = build(
            r,
            SamplingConfig,
            **changes,
            **sampling_fields(temperature),
            stop_token_ids=chat.stop_ids,
        )
        made = make_turn_sampler(
            graphdef,
            sampling,
            max_len,
            pad_id=chat.pad_id,
            engine=build(r, EngineConfig),
            # make_runner's pool streams its answers; inline (and rendering) runners do not
            streamed=render_dir is None and config.env.pool.backend != "inline",
            # the KV cache is fitted to the chip for the largest call: rollout or evaluation
            rows=max(
                r.tasks_per_iteration * config.group_size,
                config.eval.num_tasks * config.eval.samples_per_task,
            ),
            reserve_bytes=reserve,
        )
        if grammar is not None:
            made.grammar = grammar
        return made

    def make_lane() -> tuple[TurnPolicy, RolloutSpec]:
        runner = make_runner(config, render_dir=render_dir)
        return sampler(r.temperature), RolloutSpec(chat, env.system_prompt, budget, runner)

    rl_sampler, rollout = make_lane()
    same = config.eval.temperature == r.temperature and r.top_k == 0 and r.top_p == 1.0
    # One sampler for both when the settings agree: its compiled shapes are shared.
    eval_sampler = rl_sampler if same else sampler(config.eval.temperature, top_k=0, top_p=1.0)

    return Run(
        config=config,
        env=env,
        tasks=tasks,
        tokenizer=tokenizer,
        chat=chat,
        graphdef=graphdef,
        params=params,
        model_config=model_config,
        max_len=max_len,
        budget=budget,
        sampler=rl_sampler,
        eval_sampler=eval_sampler,
        rollout=rollout,
        make_lane=make_lane,
        layout=layouts[-1] if layouts else None,
        model_key=model_key,
        state_key=state_key,
        sample_key=sample_key,
    )


def run_grammar(config: Config, env: EnvSpec, chat: Chat, vocab_size: int):
    """The grammar of ``rollout.constrained_tool_calls``: each task's schema-valid tool calls
    (``jaxagent.agents.task_tools``) in the chat's call syntax (a template's native one, else
    the worlds' ReAct text), or an answer."""
    from jaxagent.agents.constrained import tool_call_grammar
    from jaxagent.envs.call_grammar import CONSTRAINED_SYNTAXES

    syntax = chat.syntax
    if syntax not in CONSTRAINED_SYNTAXES:
        raise ConfigError(
            f"rollout.constrained_tool_calls=true: the chat's tool-call syntax {syntax!r} has "
            f"no constrained form (supported: {list(CONSTRAINED_SYNTAXES)}); set it to false"
        )
    return tool_call_grammar(
        chat.tokenizer, vocab_size, chat.stop_ids, syntax, tools_of_env(env.name)
    )


def rows_multiple(config: Config, batch_devices: int) -> int:
    """The packed-row multiple of this process's learner batch, refusing a layout or a
    multi-host split the update cannot take: the minibatch (and its microbatch) must split
    over the batch devices, and with several processes every host samples an equal slice."""
    hosts, r, update = jax.process_count(), config.rollout, config.rl_config.update
    if update.minibatch_size % batch_devices or update.microbatch % batch_devices:
        raise ConfigError(
            f"rl.update.minibatch_size={update.minibatch_size} and its microbatch "
            f"({update.microbatch}) must be multiples of the {batch_devices} devices the batch "
            "is split over (mesh data x fsdp); change them or the mesh"
        )
    multiple = math.lcm(update.minibatch_size, batch_devices)
    if hosts == 1:
        return multiple
    if config.rl.data.dynamic_sampling:
        raise ConfigError(
            "rl.data.dynamic_sampling=true is single-process for now (each host would refill "
            "its own groups and the hosts' row counts would differ); set it false or run one "
            "process"
        )
    if r.tasks_per_iteration % hosts:
        raise ConfigError(
            f"rollout.tasks_per_iteration={r.tasks_per_iteration} must be a multiple of the "
            f"{hosts} processes (each samples an equal slice of the tasks)"
        )
    rows = r.tasks_per_iteration // hosts * config.group_size
    if multiple % hosts or rows % (multiple // hosts):
        raise ConfigError(
            f"each of the {hosts} processes packs {rows} rows, which must be a multiple of "
            f"{multiple} (lcm of rl.update.minibatch_size and the batch devices) / {hosts}; "
            "change rollout.tasks_per_iteration or rl.update.minibatch_size"
        )
    return multiple // hosts
