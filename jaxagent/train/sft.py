"""Supervised warm-start on scripted-expert demonstrations.

``expert_episodes`` runs a suite's scripted expert closed-loop through real environments with
the rollout driver (``jaxagent.agents.expert.ExpertTurnPolicy``), so each demonstration has
exactly the token layout of the policy's episodes (same chat chunks, the expert's actions
where the policy's samples would be, loss mask on those) and SFT and RL train on one format.
``run_sft`` packs them densely (``jaxagent.agents.batch.pack_episodes(dense=True)``) and fits
the policy through the one LM update step (``jaxagent.rl.update.make_update_step``) with the
``sft`` recipe: masked cross-entropy (token mean), AdamW from the one optimiser builder
(``jaxagent.rl.train_state.make_optimizer``) with a warm-up + stable + decay schedule. The step
(``make_sft_step``) runs the RL update's memory-lean learner pass (``model_fns.model_logprob_fn``:
rematerialised blocks, a chunked vocabulary head, no ``[B, T, V]`` logits), the run's LoRA
setting and its device layout, so a warm start fits wherever the update does.
``sft_demonstrations`` and ``warm_start`` are the trainer's SFT phase: the demonstrations
(collected once), then the fit with a progress bar and its metrics (once per attempt when
``sft.max_restarts`` restarts a fit that did not learn).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable, NamedTuple, Optional, Sequence

import jax
import numpy as np

from jaxagent.agents.batch import pack_episodes
from jaxagent.agents.episode import Episode
from jaxagent.agents.expert import ExpertTurnPolicy, MakeExpert
from jaxagent.agents.rollout import RolloutSpec, collect_episodes
from jaxagent.agents.runner import InlineRunner
from jaxagent.envs.base import Task
from jaxagent.parallel.layout import DeviceLayout, ShardedUpdate
from jaxagent.rl.config import LoraConfig, RLConfig
from jaxagent.rl.lora import VALUE_HEAD_LEAVES
from jaxagent.rl.model_fns import model_logprob_fn
from jaxagent.rl.recipes import sft_config
from jaxagent.rl.train_state import TrainState, begin_sampling, make_optimizer
from jaxagent.rl.update import make_update_step
from jaxagent.train import progress, sft_cache


def expert_episodes(
    make_expert: MakeExpert,
    tasks: Sequence[Task],
    spec: RolloutSpec,
    *,
    error_rate: float,
    seed: int,
    chunk: int = 256,
) -> list[Episode]:
    """One expert demonstration per task, collected by the rollout driver.

    The expert speaks through ``ExpertTurnPolicy``, so a demonstration has exactly the token
    layout, budgets and termination labels of the policy's own episodes.

    Args:
      make_expert: ``make_expert(task, error_rate, rng)`` -> object with ``act(obs) -> str``.
      tasks: the tasks (from the train split).
      spec: the run's rollout spec (chat, system prompt, budgets, runner).
      error_rate: the expert's error rate.
      seed: seeds the expert's mistakes (per task, see ``ExpertTurnPolicy``).
      chunk: tasks per driver call (bounds the environments alive at once).

    Returns:
      Episodes in task order with ``loss_mask`` 1 on the expert's action tokens (and their
      stop token); group ids are task indices.
    """
    policy = ExpertTurnPolicy(make_expert, spec.chat, error_rate=error_rate, seed=seed)
    out: list[Episode] = []
    for start in range(0, len(tasks), chunk):
        eps, _ = collect_episodes(
            policy,
            None,
            tasks[start : start + chunk],
            samples_per_task=1,
            spec=spec,
            key=jax.random.key(seed),
            group_offset=start,
        )
        out.extend(eps)
    return out


def sft_recipe(
    learning_rate: float,
    steps: int,
    batch_size: int,
    microbatch: int = 0,
    lora: Optional[LoraConfig] = None,
    remat: bool = True,
) -> RLConfig:
    """The ``sft`` recipe (``jaxagent.rl.recipes.sft_config``) over the run's LoRA setting
    (``rl.lora``: rank 0 fine-tunes the whole model, rank > 0 trains adapters over a frozen
    base, as the RL phase does) and its block rematerialisation (``rl.update.remat``)."""
    config = sft_config(learning_rate, steps, batch_size, microbatch)
    changes = {"update": {"remat": remat}}
    if lora is not None:
        changes["lora"] = lora
    return config.override(**changes)


def make_sft_step(
    graphdef,
    config: RLConfig,
    optimizer,
    *,
    activation_sharding: Any = None,
    **update_kwargs,
) -> Callable:
    """The SFT step ``step(state, batch) -> (state, metrics)``: the one LM update step
    (``make_update_step``, no advantages) over the memory-lean learner pass
    (``model_logprob_fn``: each block rematerialised when ``config.update.remat``, the
    vocabulary head chunked and run only over the positions that carry loss), so no
    ``[B, T, V]`` logits exist; under LoRA (``config.lora.rank``) the adapters merge inside
    each block. ``update_kwargs`` go to ``make_update_step`` (``mesh``, ``state_sharding``,
    ``batch_sharding``, ``rules``, ``jit``).

    To plan its memory without weights: build the state abstractly (``sft_state_like``),
    then ``make_sft_step(...).lower(state_like, TokenBatch.abstract(rows, length))
    .compile().memory_analysis()``."""
    lean = model_logprob_fn(
        graphdef,
        remat=config.update.remat,
        skip_unmasked_chunks=True,
        activation_sharding=activation_sharding,
    )
    return make_update_step(
        config, optimizer=optimizer, logprob_fn=lean, compute_advantages=False, **update_kwargs
    )


def sft_state_like(params_like: Any, config: RLConfig, optimizer, layout=None) -> TrainState:
    """The SFT train state's shapes, dtypes and (with a ``layout``) shardings from the
    params' (``jax.ShapeDtypeStruct``s), allocating nothing."""
    abstract = jax.eval_shape(
        lambda p: TrainState.create(p, config, jax.random.key(0), optimizer=optimizer),
        params_like,
    )
    return abstract if layout is None else layout.abstract_state(abstract, optimizer)


def run_sft(
    graphdef,
    params: Any,
    episodes: Sequence[Episode],
    *,
    steps: int,
    batch_size: int,
    learning_rate: float,
    seed: int,
    pad_id: int,
    max_len: int,
    on_step: Optional[Callable[[int, float], None]] = None,
    observation_weight: float = 0.0,
    microbatch: int = 0,
    lora: Optional[LoraConfig] = None,
    remat: bool = True,
    layout: Optional[DeviceLayout] = None,
    attempt: int = 0,
) -> tuple[Any, list[float]]:
    """Fit ``params`` to the demonstrations; returns (params, per-step losses).

    ``params`` are handed over: the first step donates them (no second copy of the model; on
    a mesh, ``layout``, the state is born in the update's shardings and the step runs
    sharded like the RL update). ``lora`` (the run's ``rl.lora``): rank > 0 trains adapters
    over the frozen base and returns the base with them merged.

    ``batch_size`` counts packed rows of ``max_len`` tokens (several episodes each);
    ``microbatch`` rows a forward/backward pass (0: the whole batch), gradients summed over
    the batch's microbatches: the same loss and gradient as one pass, in a smaller working
    set (on CPU the attention's [rows, heads, T, T] scores of 8 rows of 640 tokens overflow
    the caches; 2 rows at a time make the same step ~1.3x faster,
    ``benchmarks/learner_step.py``).

    ``attempt`` > 0 (an SFT restart) draws another data order and state key from the same
    ``seed``; attempt 0 is the seed's own.

    A value head (a critic's, ``model.value_head``) comes back as it went in: see
    ``_value_head``.
    """
    head = _value_head(params)
    packed = pack_episodes(
        episodes, pad_id=pad_id, max_len=max_len, dense=True, observation_weight=observation_weight
    )
    n = packed.tokens.shape[0]
    if n == 0 or steps == 0:
        return params, []
    config = sft_recipe(learning_rate, steps, batch_size, microbatch, lora, remat)
    tx = make_optimizer(config, "wsd", steps)
    layout = layout or DeviceLayout(mesh=None, logical_axes=None)
    step_fn = _sharded_step(
        layout, functools.partial(make_sft_step, graphdef, config, tx), batch_size
    )
    key = jax.random.key(seed)
    state = _new_state(
        params, config, tx, jax.random.fold_in(key, attempt) if attempt else key, layout
    )
    rng = np.random.default_rng([seed, 11, attempt] if attempt else [seed, 11])
    losses = []
    order = rng.permutation(n)
    cursor = 0
    for i in range(steps):
        if cursor + batch_size > n:
            order, cursor = rng.permutation(n), 0
        idx = order[cursor : cursor + batch_size]
        cursor += batch_size
        if len(idx) < batch_size:  # fewer demonstrations than a batch: sample with repeats
            idx = rng.choice(n, batch_size)
        state, metrics = step_fn(state, jax.tree.map(lambda x: x[idx], packed))
        if on_step is not None or i == steps - 1:
            losses.append(float(metrics["loss/total"]))
            if on_step is not None:
                on_step(i, losses[-1])
    if state.uses_lora:  # the SFT model: the base with the fitted adapters merged
        params, _ = begin_sampling(state)
        return {**params, **head}, losses
    return {**state.params, **head}, losses


def _value_head(params: Any) -> dict:
    """Copies of the value head's leaves (none without a head), taken before the fit donates
    ``params``. SFT has no value target: the head's gradient is zero and only AdamW's
    decoupled weight decay would move it, shrinking an untrained head by a few percent. Left
    as initialised, the language model's fit is the same with or without a head, so one
    cached fit (``warm_start``) serves a critic's recipe (PPO) and the others."""
    return {k: params[k].copy() for k in VALUE_HEAD_LEAVES if k in params}


def _sharded_step(layout: DeviceLayout, make: Callable, rows: int) -> Callable:
    """``step(state, batch)`` on the layout: the rows split over the mesh's batch axes as the
    RL update's (``ShardedUpdate``), or, when ``rows`` does not split evenly over them,
    the batch replicated and the state kept in its own shardings."""
    if layout.mesh is None or rows % layout.batch_devices == 0:
        return ShardedUpdate(
            layout, functools.partial(make, activation_sharding=layout.activation_sharding())
        )
    replicated, compiled = layout.replicated(), {}

    def step(state, batch):
        if "step" not in compiled:
            compiled["step"] = make(
                mesh=layout.mesh,
                state_sharding=jax.tree.map(lambda x: x.sharding, state),
                batch_sharding=jax.tree.map(lambda _: replicated, batch),
                rules=layout.rules,
            )
        return compiled["step"](state, jax.device_put(batch, replicated))

    return step


def _new_state(params, config: RLConfig, tx, key, layout: DeviceLayout) -> TrainState:
    """A fresh SFT state; on a mesh made under ``jit`` with the layout's state shardings as
    ``out_shardings`` and ``params`` donated, so the optimiser moments (or adapters) are
    born in their shards and the parameters become the state's own buffers."""
    create = lambda p: TrainState.create(p, config, key, optimizer=tx)
    if layout.mesh is None:
        return create(params)
    shardings = layout.state_shardings(jax.eval_shape(create, params), tx)
    return jax.jit(create, out_shardings=shardings, donate_argnums=0)(params)


class Demonstrations(NamedTuple):
    """The SFT phase's demonstrations (each fits a packed row) and the expert's success."""

    episodes: list
    expert_success: float


def sft_demonstrations(
    config,
    env,
    rollout: RolloutSpec,
    tasks: Sequence[Task],
    *,
    max_len: int,
    echo: Callable[[str], None] = print,
) -> Demonstrations:
    """``env``'s scripted expert on the first ``config.sft.num_demos`` of ``tasks``, with
    the run's chat layout (``expert_episodes``); demonstrations longer than a packed row are
    left out (counted in the log)."""
    c = config.sft
    tasks = tasks[: c.num_demos]
    # The demonstrations run in-process: a scripted expert needs no timeouts, and the
    # pool would grow one environment per demonstration.
    spec = dataclasses.replace(rollout, runner=InlineRunner(env.make_env))
    try:
        demos = expert_episodes(
            env.make_expert, tasks, spec, error_rate=c.expert_error_rate, seed=config.train.seed
        )
    finally:
        spec.runner.close()
    if c.only_successful:
        demos = [d for d in demos if d.success]
    # A demonstration longer than a packed row cannot be trained on whole; cutting it would
    # teach a truncated episode, so it is left out (and counted).
    fitting = [d for d in demos if len(d.tokens) <= max_len]
    if len(fitting) < len(demos):
        echo(
            f"[sft] {len(demos) - len(fitting)} demonstrations longer than the {max_len}-token "
            "rows left out (raise model.max_seq_len or rollout.max_total_tokens to keep them)"
        )
        demos = fitting
    demo_success = float(np.mean([d.success for d in demos])) if demos else 0.0
    echo(
        f"[sft] {len(demos)} expert demonstrations (error rate "
        f"{c.expert_error_rate}, expert success {demo_success:.2f}); {c.steps} steps"
    )
    return Demonstrations(demos, demo_success)


def warm_start(
    config,
    demos: Demonstrations,
    graphdef,
    params: Any,
    *,
    pad_id: int,
    max_len: int,
    echo: Callable[[str], None] = print,
    layout: Optional[DeviceLayout] = None,
    attempt: int = 0,
) -> tuple[Any, dict]:
    """The trainer's SFT phase (``config.sft``) on the demonstrations (``sft_demonstrations``);
    returns (params, ``sft/`` metrics). It trains as the run's update does: the run's LoRA
    setting (``rl.lora``) and rematerialisation (``rl.update.remat``), the chunked
    vocabulary head, and on the run's ``layout`` (its mesh) when given. ``attempt`` > 0 (a
    restart, ``sft.max_restarts``) draws another data order (``run_sft``)."""
    c = config.sft
    lora = config.rl_config.lora
    t0 = time.perf_counter()
    key = None
    # The cache holds the language model's fit: a value head is not fitted (``run_sft``), so
    # it is neither in the key nor in the entry, and a run with a head keeps its own.
    head = _value_head(params)
    body = {k: v for k, v in params.items() if k not in head}
    if c.cache_dir and sft_cache.usable():  # the same fit done before: its result
        settings = dataclasses.asdict(c) | {"seed": config.train.seed, "max_len": max_len}
        settings.update(pad_id=pad_id, cache_dir=None)
        if lora.rank:  # adapters fit another model (full fine-tuning keeps its old keys)
            settings["lora"] = dataclasses.asdict(lora)
        if attempt:  # a restart's data order (its initialisation is in the params' hash)
            settings["attempt"] = attempt
        key = sft_cache.sft_key(body, demos.episodes, settings)
        hit = sft_cache.load(c.cache_dir, key, body)
        if hit is not None:
            echo(f"[sft] the fit of these inputs is in sft.cache_dir ({key[:12]}); reused")
            return {**hit[0], **head}, {**hit[1], "sft/cached": 1.0}
    with progress.Progress(
        config.train.progress, "sft", c.steps, every_s=config.train.progress_every_s
    ) as bar:
        params, losses = run_sft(
            graphdef,
            params,
            demos.episodes,
            steps=c.steps,
            batch_size=c.batch_size,
            learning_rate=c.learning_rate,
            seed=config.train.seed,
            pad_id=pad_id,
            max_len=max_len,
            on_step=lambda i, loss: bar.update(1, loss=f"{loss:.3f}"),
            observation_weight=c.observation_weight,
            microbatch=c.microbatch_size,
            lora=lora,
            remat=config.rl_config.update.remat,
            layout=layout,
            attempt=attempt,
        )
    metrics = {
        "sft/loss": losses[-1] if losses else float("nan"),
        "sft/demos": len(demos.episodes),
        "sft/expert_success": demos.expert_success,
        "sft/time_s": time.perf_counter() - t0,
    }
    if key is not None:
        sft_cache.save(
            c.cache_dir, key, {k: v for k, v in params.items() if k not in head}, metrics
        )
    return params, metrics


# Below this held-out success at the start of RL, a group of samples rarely holds a success:
# group-relative advantages are then zero for almost every group and RL learns nothing (a new
# world at the default sft.steps started at 0.01 and stayed there).
LOW_START = 0.05


def low_start_note(config, success: float, has_expert: bool) -> str | None:
    """The console's note when RL starts from a success rate too low to learn from, with the
    fix: more SFT steps (or SFT at all, when the world has a scripted expert); None else."""
    if success >= LOW_START:
        return None
    start = f"[note] held-out success {success:.3f} before RL (< {LOW_START}): "
    why = "few groups will hold a success for RL to learn from; "
    if config.sft.enabled:
        return (
            start
            + why
            + (
                f"raise sft.steps (now {config.sft.steps}, e.g. sft.steps={config.sft.steps * 3}) "
                "or check the expert's success in the [sft] line"
            )
        )
    if has_expert:
        return start + why + "warm-start with sft.enabled=true (the world has a scripted expert)"
    return None
