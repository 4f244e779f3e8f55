"""Supervised warm-start on scripted-expert demonstrations.

``expert_episodes`` runs a suite's scripted expert closed-loop through real environments with
the rollout driver (``jaxagent.agents.expert.ExpertTurnPolicy``), so each demonstration has
exactly the token layout of the policy's episodes (same chat chunks, the expert's actions
where the policy's samples would be, loss mask on those) and SFT and RL train on one format.
``run_sft`` packs them densely (``jaxagent.agents.batch.pack_episodes(dense=True)``) and fits
the policy through the one LM update step (``jaxagent.rl.update.make_update_step``) with the
``sft`` recipe: masked cross-entropy (token mean), AdamW from the one optimiser builder
(``jaxagent.rl.train_state.make_optimizer``) with a warm-up + stable + decay schedule.
``warm_start`` is the trainer's SFT phase: the demonstrations, the fit with a progress bar,
and its metrics.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Optional, Sequence

import jax
import numpy as np

from jaxagent.agents.batch import pack_episodes
from jaxagent.agents.episode import Episode
from jaxagent.agents.expert import ExpertTurnPolicy, MakeExpert
from jaxagent.agents.rollout import RolloutSpec, collect_episodes
from jaxagent.agents.runner import InlineRunner
from jaxagent.envs.base import Task
from jaxagent.rl.model_fns import model_apply_fn
from jaxagent.rl.recipes import sft_config
from jaxagent.rl.train_state import TrainState, make_optimizer
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
) -> tuple[Any, list[float]]:
    """Fit ``params`` to the demonstrations; returns (params, per-step losses).

    ``params`` are handed over: the first step donates them (no second copy of the model; on
    a mesh they keep their shardings and the step runs sharded).

    ``batch_size`` counts packed rows of ``max_len`` tokens (several episodes each);
    ``microbatch`` rows a forward/backward pass (0: the whole batch), gradients summed over
    the batch's microbatches: the same loss and gradient as one pass, in a smaller working
    set (on CPU the attention's [rows, heads, T, T] scores of 8 rows of 640 tokens overflow
    the caches; 2 rows at a time make the same step ~1.3x faster,
    ``benchmarks/learner_step.py``).
    """
    packed = pack_episodes(
        episodes, pad_id=pad_id, max_len=max_len, dense=True, observation_weight=observation_weight
    )
    n = packed.tokens.shape[0]
    if n == 0 or steps == 0:
        return params, []
    config = sft_config(learning_rate, steps, batch_size, microbatch)
    tx = make_optimizer(config, "wsd", steps)
    step_fn = make_update_step(config, model_apply_fn(graphdef), tx, compute_advantages=False)
    state = TrainState.create(params, config, jax.random.key(seed), optimizer=tx)
    rng = np.random.default_rng([seed, 11])
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
    return state.params, losses


def warm_start(
    config,
    env,
    rollout: RolloutSpec,
    tasks: Sequence[Task],
    graphdef,
    params: Any,
    *,
    pad_id: int,
    max_len: int,
    echo: Callable[[str], None] = print,
) -> tuple[Any, dict]:
    """The trainer's SFT phase (``config.sft``) on ``env``'s scripted expert over ``tasks``;
    returns (params, ``sft/`` metrics)."""
    c = config.sft
    tasks = tasks[: c.num_demos]
    t0 = time.perf_counter()
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
    key = None
    if c.cache_dir and sft_cache.usable():  # the same fit done before: its result
        settings = dataclasses.asdict(c) | {"seed": config.train.seed, "max_len": max_len}
        settings.update(pad_id=pad_id, cache_dir=None)
        key = sft_cache.sft_key(params, demos, settings)
        hit = sft_cache.load(c.cache_dir, key, params)
        if hit is not None:
            echo(f"[sft] the fit of these inputs is in sft.cache_dir ({key[:12]}); reused")
            return hit[0], {**hit[1], "sft/cached": 1.0}
    with progress.Progress(config.train.progress, "sft", c.steps) as bar:
        params, losses = run_sft(
            graphdef,
            params,
            demos,
            steps=c.steps,
            batch_size=c.batch_size,
            learning_rate=c.learning_rate,
            seed=config.train.seed,
            pad_id=pad_id,
            max_len=max_len,
            on_step=lambda i, loss: bar.update(1, loss=f"{loss:.3f}"),
            observation_weight=c.observation_weight,
            microbatch=c.microbatch_size,
        )
    metrics = {
        "sft/loss": losses[-1] if losses else float("nan"),
        "sft/demos": len(demos),
        "sft/expert_success": demo_success,
        "sft/time_s": time.perf_counter() - t0,
    }
    if key is not None:
        sft_cache.save(c.cache_dir, key, params, metrics)
    return params, metrics
