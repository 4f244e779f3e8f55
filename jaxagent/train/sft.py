"""Supervised warm-start on scripted-expert demonstrations.

``expert_episodes`` runs a suite's scripted expert closed-loop through real environments with
the rollout driver (``jaxagent.agents.expert.ExpertTurnPolicy``), so each demonstration has
exactly the token layout of the policy's episodes (same chat chunks, the expert's actions
where the policy's samples would be, loss mask on those) and SFT and RL train on one format.
``run_sft`` fits the policy with the masked cross-entropy of ``jaxagent.rl.losses`` (token
mean), AdamW and a warm-up + stable + decay schedule. ``warm_start`` is the trainer's SFT
phase: the demonstrations, the fit with a progress bar, and its metrics.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxagent.agents.episode import Episode
from jaxagent.agents.expert import ExpertTurnPolicy, MakeExpert
from jaxagent.agents.rollout import RolloutSpec, collect_episodes
from jaxagent.agents.runner import InlineRunner
from jaxagent.envs.base import Task
from jaxagent.models import apply_model, token_logprobs
from jaxagent.rl import losses as L
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


def pack_dense(
    episodes: Sequence[Episode], *, row_len: int, pad_id: int, observation_weight: float = 0.0
) -> dict[str, np.ndarray]:
    """Pack several episodes per row (first-fit by decreasing length) for SFT.

    Each episode keeps its own segment id and positions restarting at 0, so attention never
    crosses episodes (``jaxagent.models.apply_model`` masks by segment). Fewer padding tokens
    than one episode a row: the quickstart's episodes are ~75 tokens in rows of 128+.

    ``observation_weight`` w: the loss mask is 1 on action tokens and w on every other token
    of an episode but its first (nothing in the episode predicts it).

    Returns:
      dict of [R, row_len] arrays: tokens, positions, segment_ids, loss_mask.
    """
    order = sorted(range(len(episodes)), key=lambda i: -len(episodes[i].tokens))
    rows: list[list[int]] = []
    room: list[int] = []
    for i in order:
        n = len(episodes[i].tokens)
        if n > row_len:
            raise ValueError(f"an episode of {n} tokens does not fit rows of {row_len}")
        for r, free in enumerate(room):
            if free >= n:
                rows[r].append(i)
                room[r] -= n
                break
        else:
            rows.append([i])
            room.append(row_len - n)
    shape = (len(rows), row_len)
    out = {
        "tokens": np.full(shape, pad_id, np.int32),
        "positions": np.zeros(shape, np.int32),
        "segment_ids": np.zeros(shape, np.int32),
        "loss_mask": np.zeros(shape, np.float32),
    }
    for r, members in enumerate(rows):
        at = 0
        for seg, i in enumerate(members, start=1):
            ep = episodes[i]
            n = len(ep.tokens)
            out["tokens"][r, at : at + n] = ep.tokens
            out["positions"][r, at : at + n] = np.arange(n)
            out["segment_ids"][r, at : at + n] = seg
            mask = np.asarray(ep.loss_mask, np.float32)
            if observation_weight:
                mask = mask + observation_weight * (1.0 - mask)
                mask[0] = 0.0
            out["loss_mask"][r, at : at + n] = mask
            at += n
    return out


def make_sft_step(
    graphdef, optimizer: optax.GradientTransformation, microbatch: int = 0
) -> Callable:
    """Jitted ``(params, opt_state, tokens, positions, segment_ids, loss_mask) -> (params,
    opt_state, loss)``; params and optimizer state are donated.

    ``microbatch`` rows a forward/backward pass (0: the whole batch), gradients summed over
    the batch's microbatches: the same loss and gradient as one pass, in a smaller working
    set. On CPU the attention's [rows, heads, T, T] scores of 8 rows of 640 tokens overflow
    the caches; 2 rows at a time make the same step ~1.3x faster
    (``benchmarks/learner_step.py``).
    """

    def loss_fn(params, tokens, positions, segment_ids, loss_mask, num_tokens):
        logits = apply_model(graphdef, params, tokens, positions, segment_ids).logits
        logp = token_logprobs(logits, tokens)
        return L.aggregate(L.sft_loss(logp), loss_mask, "token_mean", num_tokens=num_tokens)

    grad_fn = jax.value_and_grad(loss_fn)

    def step(params, opt_state, tokens, positions, segment_ids, loss_mask):
        # token_mean over the whole batch: every microbatch divides by the batch's mask sum,
        # so the microbatch losses (and gradients) add up to the batch's.
        num_tokens = jnp.sum(loss_mask)
        rows = tokens.shape[0]
        size = microbatch if microbatch and rows % microbatch == 0 else rows  # a short batch
        if size == rows:
            loss, grads = grad_fn(params, tokens, positions, segment_ids, loss_mask, num_tokens)
        else:
            split = lambda x: x.reshape(rows // size, size, *x.shape[1:])  # noqa: E731
            chunks = tuple(map(split, (tokens, positions, segment_ids, loss_mask)))
            first = jax.tree.map(lambda x: x[0], chunks)
            loss, grads = grad_fn(params, *first, num_tokens)

            def body(carry, chunk):
                loss, grads = carry
                l_i, g_i = grad_fn(params, *chunk, num_tokens)
                return (loss + l_i, jax.tree.map(jnp.add, grads, g_i)), None

            rest = jax.tree.map(lambda x: x[1:], chunks)
            (loss, grads), _ = jax.lax.scan(body, (loss, grads), rest)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return jax.jit(step, donate_argnums=(0, 1))


def sft_optimizer(learning_rate: float, steps: int) -> optax.GradientTransformation:
    """AdamW with a warmup-stable-decay schedule, clipped at global norm 1.

    Linear warm-up over 5% of the steps, constant for the next 70%, then linear decay to 10%.
    A long constant phase matters for tiny models learning to copy arguments from the prompt:
    that ability appears abruptly after a few hundred steps, and an early decay delays it.
    """
    warmup = max(1, steps // 20)
    stable = max(1, int(steps * 0.75)) - warmup
    decay = max(1, steps - warmup - stable)
    schedule = optax.join_schedules(
        [
            optax.linear_schedule(0.0, learning_rate, warmup),
            optax.constant_schedule(learning_rate),
            optax.linear_schedule(learning_rate, learning_rate * 0.1, decay),
        ],
        [warmup, warmup + stable],
    )
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.01))


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

    ``batch_size`` counts packed rows of ``max_len`` tokens (several episodes each).
    """
    packed = pack_dense(
        episodes, row_len=max_len, pad_id=pad_id, observation_weight=observation_weight
    )
    n = packed["tokens"].shape[0]
    if n == 0 or steps == 0:
        return params, []
    tx = sft_optimizer(learning_rate, steps)
    step_fn = make_sft_step(graphdef, tx, microbatch)
    params = jax.tree.map(jnp.array, params)  # a private copy: the step donates it
    opt_state = tx.init(params)
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
        params, opt_state, loss = step_fn(
            params,
            opt_state,
            packed["tokens"][idx],
            packed["positions"][idx],
            packed["segment_ids"][idx],
            packed["loss_mask"][idx],
        )
        if on_step is not None or i == steps - 1:
            losses.append(float(loss))
            if on_step is not None:
                on_step(i, losses[-1])
    return params, losses


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
