"""The jitted RL update step: epochs x minibatches x microbatch gradient accumulation.

``make_update_step(config, apply_fn)`` returns ``update_step(state, batch) -> (state, metrics)``,
jitted with ``state`` donated. Inside, everything is ``lax.scan``:

    prepare (advantages, reference log-probs,        once per call
             the learner's own log-probs pi_prox)
    scan over epochs (a fresh shuffle each)
      scan over minibatches (one optimiser step each)
        scan over microbatches (gradient accumulation; without LoRA the first microbatch's
        gradient is the accumulator, so no zero-filled copy of the model exists)

Each level is a module-level function (``_prepare``, ``_epoch_step``, ``_minibatch_step``
with ``_minibatch_grads`` or ``_fused_minibatch_step``) that takes the step's static parts
(``_Plan``: recipe, optimiser, gradient function, microbatch placement) as its first argument.

Loss denominators are computed per minibatch and passed to every microbatch, so the summed
microbatch losses (and gradients) equal the loss of the whole minibatch: microbatching changes
memory, not maths. With a mesh, the state and batch carry NamedShardings and XLA partitions
the step (no pmap); the result equals the single-device step up to float reassociation.

The model enters as ``apply_fn(params, tokens [B,T], positions [B,T], segment_ids [B,T]) ->
(logits [B,T,V], values [B,T] or None)`` (``model_apply_fn(graphdef)`` adapts
``jaxagent.models.apply_model``), or, leaner, as ``logprob_fn(...) -> (logp [B,T],
entropy [B,T], values or None)``: ``model_logprob_fn(graphdef)`` rematerialises blocks and
chunks the vocabulary head (see ``jaxagent.rl.model_fns``); use it for large models.
pi_prox, the learner's log-probs under the state's parameters before any optimiser step, give
the sampler-vs-learner mismatch metrics (``mismatch/*``) and, with an off-policy correction
(``loss.off_policy``), the reference of the clipped ratio and the behaviour weight
pi_prox / pi_behav (``jaxagent.rl.tables.OFF_POLICY_CORRECTIONS``). A correction, or
``update.measure_mismatch="full"``, computes them by one no-grad forward over the whole batch;
by default (``"free"``) the mismatch is read off the first minibatch's own forward pass, which
runs at those parameters anyway. Without a correction they never enter the loss: the default
path's loss and gradients are unchanged.
Values: the model's value output at position t is V(tokens[:t+1]); the update aligns it as
``values[:, t] = V(tokens[:, :t])``, the value of the state in which token t is chosen, which
is the convention ``TokenBatch.values`` must follow too.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, Optional

import chex
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxagent.parallel.mesh import DEFAULT_RULES, batch_mesh_axes
from jaxagent.rl import losses as L
from jaxagent.rl.fused_step import ParamPlan, check_elementwise, fused_pass
from jaxagent.rl.guards import guarded_step, step_decision
from jaxagent.rl.kl import kl_estimate
from jaxagent.rl.lora import LoraParams, merge_lora
from jaxagent.models import token_values
from jaxagent.rl.model_fns import LogprobFn, LoraAwareLogprobFn, logits_logprob_fn
from jaxagent.rl.prepare import apply_row_weight, compute_advantages as _compute_advantages
from jaxagent.rl.config import OFF_POLICY_CORRECTIONS, POLICY_LOSSES, RLConfig
from jaxagent.rl.train_state import TrainState, make_optimizer
from jaxagent.types import TokenBatch

ApplyFn = Callable[..., tuple[jax.Array, Optional[jax.Array]]]


def make_loss_fn(config: RLConfig, logprob_fn: LogprobFn) -> Callable:
    """``loss_fn(params, micro, num_tokens, num_seqs, prox_logprobs=None) -> (loss,
    metric_sums)``.

    ``params`` are the model parameters (LoRA already merged). ``metric_sums`` are normalised
    by the minibatch's denominators, so summing them over microbatches gives minibatch means.
    ``prox_logprobs`` [B, T]: pi_prox, needed by an off-policy correction (``loss.off_policy``),
    which then takes the ratio against it (``ratio/mean`` and ``kl/approx_old_new`` too: the
    trust region, and ``update.kl_stop``, are around pi_prox) and weights the policy loss.
    """

    lc = config.loss
    policy_loss = POLICY_LOSSES[lc.policy].fn
    correction = OFF_POLICY_CORRECTIONS[lc.off_policy]
    free_mismatch = _mismatch_mode(config) == "free"

    def loss_fn(params, micro: TokenBatch, num_tokens, num_seqs, prox_logprobs=None):
        logp, entropy, values_out = logprob_fn(
            params,
            micro.tokens,
            micro.positions,
            micro.segment_ids,
            loss_mask=micro.loss_mask,
            **constraint_kwargs(micro),
        )
        mask = micro.loss_mask.astype(jnp.float32)
        agg = lambda x: L.aggregate(
            x,
            mask,
            lc.aggregation,
            num_tokens=num_tokens,
            num_seqs=num_seqs,
            norm_constant=lc.norm_constant,
        )
        tok_mean = lambda x: jnp.sum(x * mask) / jnp.maximum(num_tokens, 1.0)
        old = micro.old_logprobs
        if correction.uses_prox:
            if prox_logprobs is None:
                raise ValueError(
                    f"loss.off_policy={lc.off_policy!r} needs prox_logprobs (the learner's "
                    "log-probs before the update); make_update_step computes them"
                )
            old = jax.lax.stop_gradient(prox_logprobs)
        log_ratio = L.importance_log_ratio(logp, old, mask, lc.ratio_level, micro.turn_ids)
        per_tok, clip_low, clip_high = policy_loss(lc, logp, log_ratio, micro.advantages)
        if correction.uses_prox:
            weight, _ = correction.fn(lc, old, micro.old_logprobs, mask)
            per_tok = per_tok * weight
        policy = agg(per_tok)
        total = policy
        m = {"loss/policy": policy}
        if config.kl.mode == "loss":
            kl = agg(kl_estimate(logp, micro.ref_logprobs, config.kl.estimator))
            total = total + config.kl.beta * kl
            m["kl/ref"] = kl
        if config.critic.enabled:
            if values_out is None:
                raise ValueError(
                    "critic.enabled=True but the model returns no values; "
                    "build it with value_head=True"
                )
            v_loss = tok_mean(
                L.value_loss(
                    token_values(values_out),
                    micro.values,
                    micro.returns,
                    config.critic.value_clip_eps or None,
                )
            )
            total = total + config.critic.value_coef * v_loss
            m["loss/value"] = v_loss
        if free_mismatch:  # kept from the first minibatch only (make_update_step)
            m.update(L.mismatch_metrics(logp, micro.old_logprobs, mask, num_tokens))
        ent = agg(entropy)
        if lc.entropy_coef:
            total = total - lc.entropy_coef * ent
        m.update(
            {
                "loss/total": total,
                "entropy/mean": tok_mean(entropy),
                "clip/low_frac": tok_mean(clip_low),
                "clip/high_frac": tok_mean(clip_high),
                "kl/approx_old_new": tok_mean(L.approx_kl_old_new(logp, old)),
                "ratio/mean": tok_mean(jnp.exp(jnp.clip(log_ratio, -20.0, 20.0))),
            }
        )
        return total, m

    return loss_fn


def _mismatch_mode(config: RLConfig) -> str:
    """How the update measures the mismatch: "full" (the pi_prox forward over the whole
    batch: ``update.measure_mismatch="full"`` or any off-policy correction, which needs
    pi_prox), "free" (the first minibatch's forward), or "none" (also for a loss that reads no
    sampler log-probs, e.g. SFT)."""
    if OFF_POLICY_CORRECTIONS[config.loss.off_policy].uses_prox:
        return "full"
    if not POLICY_LOSSES[config.loss.policy].on_policy:
        return "none"
    return config.update.measure_mismatch


def _add_sums(a: dict, b: dict) -> dict:
    """Two microbatches' metric sums combined: added (they are normalised by the minibatch's
    denominators), except maxima."""
    return {k: jnp.maximum(a[k], b[k]) if k.endswith("/max_abs") else a[k] + b[k] for k in a}


def _split(tree: Any, n: int) -> Any:
    """[B, ...] leaves -> [n, B // n, ...]."""
    return jax.tree.map(lambda x: x.reshape((n, x.shape[0] // n) + x.shape[1:]), tree)


def _reference_logprobs(
    config, logprob_fn, params, batch: TokenBatch, constrain=lambda x: x
) -> jax.Array:
    """[B, T] log-probs of ``params`` (the reference model's, or the learner's own: pi_prox),
    one microbatch at a time (no gradient); ``constrain`` places the [n, micro, ...] chunks."""
    n = batch.tokens.shape[0] // min(config.update.microbatch, batch.tokens.shape[0])
    chunks = constrain(
        _split(
            (batch.tokens, batch.positions, batch.segment_ids, batch.loss_mask)
            + ((batch.constraint_ids, batch.constraint_masks) if _constrained(batch) else ()),
            n,
        )
    )

    def one(xs):
        extra = {"constraint": tuple(xs[4:])} if len(xs) > 4 else {}
        return logprob_fn(params, *xs[:3], loss_mask=xs[3], **extra)[0]

    lp = jax.lax.map(one, chunks)
    return jax.lax.stop_gradient(lp.reshape(batch.tokens.shape))


def _constrained(batch: TokenBatch) -> bool:
    if (batch.constraint_ids is None) != (batch.constraint_masks is None):
        raise ValueError("TokenBatch.constraint_ids and constraint_masks come together")
    return batch.constraint_ids is not None


def constraint_kwargs(batch: TokenBatch) -> dict:
    """``{"constraint": (ids, masks)}`` for a ``LogprobFn`` when the batch was sampled under
    constrained decoding (its log-probs are then the masked distribution's), else {}."""
    if not _constrained(batch):
        return {}
    return {"constraint": (batch.constraint_ids, batch.constraint_masks)}


def check_batch(batch: TokenBatch) -> None:
    """Shape and dtype contract of a learner batch (at trace time, so it costs nothing per
    step): [B, T] token-aligned arrays, [B] row arrays, integer ids, float log-probs."""
    b, t = batch.tokens.shape
    chex.assert_shape(
        [
            batch.positions,
            batch.segment_ids,
            batch.loss_mask,
            batch.old_logprobs,
            batch.advantages,
            batch.turn_ids,
        ],
        (b, t),
    )
    chex.assert_shape([batch.rewards, batch.group_ids], (b,))
    chex.assert_type(
        [batch.tokens, batch.positions, batch.segment_ids, batch.group_ids, batch.turn_ids], int
    )
    chex.assert_type([batch.old_logprobs, batch.rewards], float)
    for name in ("ref_logprobs", "values", "returns"):
        if getattr(batch, name) is not None:
            chex.assert_shape(getattr(batch, name), (b, t))
    for name in ("truncated", "bootstrap_value", "row_weight"):
        if getattr(batch, name) is not None:
            chex.assert_shape(getattr(batch, name), (b,))
    if (batch.turn_rewards is None) != (batch.anchor_ids is None):
        raise ValueError("TokenBatch.turn_rewards and anchor_ids come together (both or none)")
    if batch.anchor_ids is not None:
        chex.assert_equal_shape([batch.turn_rewards, batch.anchor_ids])
        chex.assert_shape(batch.anchor_ids, (b, None))
        chex.assert_type(batch.anchor_ids, int)


def _advantage_metrics(batch: TokenBatch) -> dict:
    mask = batch.loss_mask
    n = jnp.maximum(mask.sum(), 1.0)
    adv = batch.advantages
    mean = jnp.sum(adv * mask) / n
    std = jnp.sqrt(jnp.sum(((adv - mean) * mask) ** 2) / n)
    big = jnp.finfo(jnp.float32).max
    # a batch without loss tokens (all-equal groups dropped) reports 0, as its mean does,
    # not the float32 sentinels
    some = mask.sum() > 0
    return {
        "adv/mean": mean,
        "adv/std": std,
        "adv/max": jnp.where(some, jnp.max(jnp.where(mask > 0, adv, -big)), 0.0),
        "adv/min": jnp.where(some, jnp.min(jnp.where(mask > 0, adv, big)), 0.0),
        "reward/mean": jnp.mean(batch.rewards.astype(jnp.float32)),
        "samples/kept_frac": jnp.mean((mask.sum(axis=1) > 0).astype(jnp.float32)),
        "tokens/policy": mask.sum(),
    }


@dataclasses.dataclass(frozen=True)
class _Plan:
    """The update's static parts, fixed by ``make_update_step`` (nothing here is traced)."""

    config: RLConfig
    tx: optax.GradientTransformation
    logprob_fn: LogprobFn
    # (trainable, frozen, (alpha, rank), micro, num_tokens, num_seqs, prox) ->
    # ((loss, metric_sums), gradient of the trainable parameters)
    grad_fn: Callable
    constrain: Callable  # places [n, micro, ...] chunks over the mesh's batch axes
    lazy_lora: bool  # the log-prob function merges LoRA itself (LoraAwareLogprobFn)
    compute_advantages: bool
    fused_tx: Any = None  # update.fused_optimizer: the optimiser taking pass 1's norm


def _with_adapters(lazy_lora: bool, trainable, frozen, alpha_rank):
    """The parameters the loss sees: the trainable ones, or with LoRA (rank > 0) the
    adapters on the frozen base."""
    if not alpha_rank[1]:
        return trainable
    if lazy_lora:  # merged inside each rematerialised block (no merged model copy kept)
        return LoraParams(frozen, trainable, *alpha_rank)
    return merge_lora(frozen, trainable, *alpha_rank)


def _adapted_loss(loss_fn, lazy_lora, trainable, frozen, alpha_rank, *args):
    return loss_fn(_with_adapters(lazy_lora, trainable, frozen, alpha_rank), *args)


def _constrain_micro(mesh: Mesh, batch_axes: tuple, micro):
    sh = lambda x: NamedSharding(mesh, P(None, batch_axes, *([None] * (x.ndim - 2))))
    return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, sh(x)), micro)


def _microbatch_constraint(config: RLConfig, mesh: Optional[Mesh], rules) -> Callable:
    """How [n, micro, ...] chunks are placed: split over the mesh axes that ``rules`` maps the
    logical 'batch' axis to, when a microbatch divides over them; else left to XLA."""
    if mesh is None:
        return lambda x: x
    batch_axes = batch_mesh_axes(mesh, rules)
    if not batch_axes or config.update.microbatch % math.prod(mesh.shape[a] for a in batch_axes):
        return lambda x: x
    return functools.partial(_constrain_micro, mesh, batch_axes)


def _fused_optimizer(tx, logprob_fn) -> optax.GradientTransformationExtraArgs:
    """``update.fused_optimizer``'s optimiser, after checking that the step can fuse it."""
    if not (isinstance(logprob_fn, LoraAwareLogprobFn) and logprob_fn.block_wrap):
        raise ValueError(
            "update.fused_optimizer needs the model's own log-prob function "
            "(jaxagent.rl.model_fns.model_logprob_fn with remat), whose blocks it hooks"
        )
    check_elementwise(tx)
    return optax.with_extra_args_support(tx)


def _micro_grad(plan: _Plan, params, frozen, lora, num_tokens, num_seqs, x):
    """One microbatch's (gradient, metric sums); ``x`` = (microbatch, its pi_prox or None)."""
    (_, s), g = plan.grad_fn(params, frozen, lora, x[0], num_tokens, num_seqs, x[1])
    return g, s


def _accumulate_step(grad_of, acc, x):
    g, s = grad_of(x)
    return (jax.tree.map(jnp.add, acc[0], g), _add_sums(acc[1], s)), None


def _minibatch_grads(grad_of, micro, first, n_micro: int, zero_init: bool):
    """A minibatch's (gradient, metric sums), summed over its ``n_micro`` microbatches
    ``micro`` [n_micro, ...] (``first``: the first of them)."""
    if n_micro == 1:
        return grad_of(first)
    if zero_init:
        # Adapter-sized gradients: a zero-filled accumulator costs nothing, and the
        # model is traced once (peeling the first microbatch measured +138 MiB here).
        shapes = jax.eval_shape(grad_of, first)
        init, xs = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes), micro
    else:
        # The first microbatch's gradient is the accumulator (no zero-filled model
        # copy); the others are added into it as the backward pass produces them.
        init = grad_of(first)
        xs = jax.tree.map(lambda x: x[1:], micro)
    return jax.lax.scan(functools.partial(_accumulate_step, grad_of), init, xs)[0]


def _minibatch_step(plan: _Plan, frozen, lora, carry, mb_prox):
    """One optimiser step (the scan over minibatches): ``carry`` = (params, opt_state,
    stopped), ``mb_prox`` = (minibatch, its pi_prox or None)."""
    params, opt_state, stopped = carry
    mb, _ = mb_prox
    u = plan.config.update
    num_tokens, num_seqs = L.aggregation_denominators(mb.loss_mask)
    n_micro = u.minibatch_size // u.microbatch
    micro = plan.constrain(_split(mb_prox, n_micro))
    first = jax.tree.map(lambda x: x[0], micro)
    if plan.fused_tx is not None:  # two passes, no gradient tree (jaxagent.rl.fused_step)
        return _fused_minibatch_step(plan, params, opt_state, stopped, first, num_tokens, num_seqs)
    grad_of = functools.partial(_micro_grad, plan, params, frozen, lora, num_tokens, num_seqs)
    grads, sums = _minibatch_grads(grad_of, micro, first, n_micro, zero_init=bool(lora[1]))
    sums = dict(
        sums,
        **{"optim/grad_norm": optax.global_norm(grads), "optim/loss_tokens": num_tokens},
    )
    # a non-finite loss or gradient, a minibatch without loss tokens (or a KL stop)
    # skips the step whole, counted in guard/*
    params, opt_state, stopped, guard = guarded_step(
        plan.tx, grads, opt_state, params, sums, u.kl_stop, stopped
    )
    return (params, opt_state, stopped), dict(sums, **guard)


def _fused_loss(config, logprob_fn, micro, num_tokens, num_seqs, prox, params, hook):
    """The minibatch loss with every block run through the fused step's ``hook``."""
    lp = functools.partial(logprob_fn, block_wrap=hook)
    return make_loss_fn(config, lp)(params, micro, num_tokens, num_seqs, prox)


def _fused_one_pass(plan: _Plan, loss_of, param_plan, num_tokens, params, opt_state, norm, ok):
    sums, grad_norm, params, opt_state = fused_pass(
        loss_of, plan.fused_tx, param_plan, params, opt_state, norm, ok
    )
    extra = {"optim/grad_norm": grad_norm, "optim/loss_tokens": num_tokens}
    return dict(sums, **extra), params, opt_state


def _fused_two_pass(one_pass, kl_stop: float, carry, i):
    """Pass ``i`` of the fused step: 0 measures the loss and the norm, 1 steps if the guard
    lets it."""
    params, opt_state, sums, apply, was_stopped, guard = carry
    norm = sums["optim/grad_norm"]
    new_sums, params, opt_state = one_pass(params, opt_state, norm, apply & (i == 1))
    decided = step_decision(new_sums, kl_stop, was_stopped)
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(i == 0, a, b), new, old)
    (sums, apply, stopped_now, guard) = keep(
        (new_sums, *decided), (sums, apply, was_stopped, guard)
    )
    return (params, opt_state, sums, apply, stopped_now, guard), None


def _fused_minibatch_step(plan: _Plan, params, opt_state, stopped, mb_prox, num_tokens, num_seqs):
    """``_minibatch_step`` with ``update.fused_optimizer``: the optimiser applied block by
    block inside a second backward pass (``jaxagent.rl.fused_step``)."""
    mb, prox = mb_prox
    loss_of = functools.partial(
        _fused_loss, plan.config, plan.logprob_fn, mb, num_tokens, num_seqs, prox
    )
    one_pass = functools.partial(
        _fused_one_pass, plan, loss_of, ParamPlan(params, opt_state), num_tokens
    )
    shapes = jax.eval_shape(
        lambda: one_pass(params, opt_state, jnp.float32(1.0), jnp.bool_(False))[0]
    )
    zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)
    # One program run twice (not two unrolled copies: twice the code to compile).
    kl_stop = plan.config.update.kl_stop
    guard0 = step_decision(zeros, kl_stop, stopped)[2]
    init = (params, opt_state, zeros, jnp.bool_(False), stopped, guard0)
    (params, opt_state, sums, _, stopped, guard), _ = jax.lax.scan(
        functools.partial(_fused_two_pass, one_pass, kl_stop), init, jnp.arange(2)
    )
    return (params, opt_state, stopped), dict(sums, **guard)


def _epoch_step(minibatch_step, data, n_mini: int, shuffle: bool, carry, key):
    """One epoch (the scan over epochs): a fresh shuffle of ``data``, then its minibatches."""
    b = data[0].tokens.shape[0]
    perm = jax.random.permutation(key, b) if shuffle else jnp.arange(b)
    shuffled = jax.tree.map(lambda x: x[perm], data)
    return jax.lax.scan(minibatch_step, carry, _split(shuffled, n_mini))


def _prepare(plan: _Plan, state: TrainState, batch: TokenBatch, lora):
    """``(batch, prox, metrics)``: the batch the epochs train on (the host's row weights
    applied, reference log-probs for KL, advantages), pi_prox when the update measures it
    (module docstring; else None) and the batch's own metrics."""
    config = plan.config
    batch = apply_row_weight(batch)  # the host decided which rows train
    if config.needs_reference and batch.ref_logprobs is None:
        if state.ref_params is None:
            raise ValueError(
                f"recipe {config.name!r} uses KL (kl.mode={config.kl.mode!r}) but "
                "the batch has no ref_logprobs and TrainState.ref_params is None"
            )
        batch = batch.replace(
            ref_logprobs=_reference_logprobs(config, plan.logprob_fn, state.ref_params, batch)
        )
    prox = None
    if _mismatch_mode(config) == "full":
        # pi_prox: the learner's log-probs before any optimiser step (no gradient)
        prox = _reference_logprobs(
            config,
            plan.logprob_fn,
            _with_adapters(plan.lazy_lora, state.params, state.frozen_params, lora),
            batch,
            plan.constrain,
        )
        # over every sampled token of the rows the host kept (before advantage filters)
        prox_metrics = L.mismatch_metrics(prox, batch.old_logprobs, batch.loss_mask)
    if plan.compute_advantages:
        batch = _compute_advantages(config, batch)
    metrics = _advantage_metrics(batch)
    if prox is not None:
        correction = OFF_POLICY_CORRECTIONS[config.loss.off_policy]
        weight, dropped = correction.fn(config.loss, prox, batch.old_logprobs, batch.loss_mask)
        n_loss = jnp.maximum(jnp.sum(batch.loss_mask > 0), 1).astype(jnp.float32)
        prox_metrics["offpolicy/weight_mean"] = jnp.sum(weight) / n_loss
        prox_metrics["offpolicy/masked_frac"] = jnp.sum(dropped) / n_loss
        metrics.update(prox_metrics)
    return batch, prox, metrics


def _update(plan: _Plan, state: TrainState, batch: TokenBatch):
    """``update_step``'s body: prepare, then the epochs' scan, then the metrics."""
    check_batch(batch)
    u = plan.config.update
    b = batch.tokens.shape[0]
    if b % u.minibatch_size:
        raise ValueError(
            f"TokenBatch has B={b} rows but update.minibatch_size={u.minibatch_size} "
            "does not divide it; sample a multiple of minibatch_size trajectories or change it"
        )
    n_mini = b // u.minibatch_size
    lora = (state.lora_alpha, state.lora_rank)
    batch, prox, adv_metrics = _prepare(plan, state, batch, lora)
    # the scans carry pi_prox only when the loss reads it
    uses_prox = OFF_POLICY_CORRECTIONS[plan.config.loss.off_policy].uses_prox
    data = (batch, prox if uses_prox else None)
    minibatch_step = functools.partial(_minibatch_step, plan, state.frozen_params, lora)
    rng, ep_key = jax.random.split(state.rng)
    keys = jax.random.split(ep_key, u.num_epochs)
    (params, opt_state, _), per_step = jax.lax.scan(
        functools.partial(_epoch_step, minibatch_step, data, n_mini, u.shuffle),
        (state.params, state.opt_state, jnp.zeros((), bool)),
        keys,
    )
    metrics = {k: jnp.mean(v) for k, v in per_step.items()}
    # "free" mismatch: the first minibatch's, measured before any optimiser step
    metrics.update({k: v[0, 0] for k, v in per_step.items() if k.startswith("mismatch/")})
    metrics.update(adv_metrics)
    steps = u.num_epochs * n_mini
    metrics["optim/steps"] = jnp.asarray(steps, jnp.float32)
    new_state = state.replace(params=params, opt_state=opt_state, step=state.step + steps, rng=rng)
    return new_state, metrics


def _make_plan(config, tx, logprob_fn, compute_advantages, mesh, rules) -> _Plan:
    lazy_lora = isinstance(logprob_fn, LoraAwareLogprobFn)
    loss = functools.partial(_adapted_loss, make_loss_fn(config, logprob_fn), lazy_lora)
    return _Plan(
        config=config,
        tx=tx,
        logprob_fn=logprob_fn,
        grad_fn=jax.value_and_grad(loss, has_aux=True),
        fused_tx=_fused_optimizer(tx, logprob_fn) if config.update.fused_optimizer else None,
        constrain=_microbatch_constraint(config, mesh, rules),
        lazy_lora=lazy_lora,
        compute_advantages=compute_advantages,
    )


def make_update_step(
    config: RLConfig,
    apply_fn: Optional[ApplyFn] = None,
    optimizer: Optional[optax.GradientTransformation] = None,
    *,
    logprob_fn: Optional[LogprobFn] = None,
    compute_advantages: bool = True,
    mesh: Optional[Mesh] = None,
    state_sharding: Any = None,
    batch_sharding: Any = None,
    rules=DEFAULT_RULES,
    jit: bool = True,
) -> Callable[[TrainState, TokenBatch], tuple[TrainState, dict]]:
    """Build ``update_step(state, batch) -> (state, metrics)``.

    Args:
      config: the recipe (static).
      apply_fn: the model as a logits function (see module docstring), or
      logprob_fn: the model as a log-prob function (exactly one of the two).
      optimizer: defaults to ``make_optimizer(config)``; must match the state's.
      compute_advantages: run ``jaxagent.rl.prepare.compute_advantages`` first; False to use
        ``batch.advantages`` (and ``returns``) as given.
      mesh: device mesh; with it, microbatches are constrained to be split over the mesh axes
        that ``rules`` maps the logical 'batch' axis to.
      state_sharding, batch_sharding: NamedSharding pytrees (see ``jaxagent.parallel.mesh``) for
        the state and the batch; metrics come back replicated.
      jit: False returns the raw function (for tests and ``jax.jit(...).lower`` elsewhere).

    Returns:
      The update function; jitted with ``state`` donated unless ``jit=False``. The batch must
      have ``B`` divisible by ``config.update.minibatch_size`` (B is static).
    """
    tx = optimizer or make_optimizer(config)
    if (apply_fn is None) == (logprob_fn is None):
        raise TypeError("make_update_step: pass exactly one of apply_fn and logprob_fn")
    if logprob_fn is None:
        logprob_fn = logits_logprob_fn(apply_fn)
    plan = _make_plan(config, tx, logprob_fn, compute_advantages, mesh, rules)

    def update_step(state: TrainState, batch: TokenBatch):
        return _update(plan, state, batch)

    if not jit:
        return update_step
    if state_sharding is None and batch_sharding is None:
        return jax.jit(update_step, donate_argnums=0)
    replicated = NamedSharding(mesh, P()) if mesh is not None else None
    return jax.jit(
        update_step,
        donate_argnums=0,
        in_shardings=(state_sharding, batch_sharding),
        out_shardings=(state_sharding, replicated),
    )
