"""The learner's state as a pytree, and the optimiser a recipe asks for."""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp
import optax
from flax import struct

from jaxagent.rl.lora import VALUE_HEAD_LEAVES, init_lora, merge_lora, path_name
from jaxagent.rl.config import RLConfig, RLConfigError


@struct.dataclass
class TrainState:
    """Everything that changes during training (donated to the update step).

    Attributes:
      params: the trained parameters: the full model, or the LoRA adapters
        ``{path: {"a", "b"}}`` when ``frozen_params`` holds the base (with a critic, also
        the value head's leaves as ``{path: {"full"}}``: trained in full, see
        ``jaxagent.rl.lora.init_lora``).
      opt_state: optax state of ``params`` only (LoRA: the base has no optimiser state).
      step: int32 scalar, optimiser steps taken.
      rng: PRNG key for minibatch shuffling (split at each update).
      frozen_params: LoRA base parameters (never written: bit-identical for the whole run),
        or None.
      ref_params: reference-policy parameters for KL terms when the batch does not carry
        ``ref_logprobs`` (a second model copy; LOOP has none), or None.
      lora_scale_alpha, lora_rank: static LoRA scaling (alpha / rank); rank 0 means no LoRA.
    """

    params: Any
    opt_state: Any
    step: jax.Array
    rng: jax.Array
    frozen_params: Any = None
    ref_params: Any = None
    lora_alpha: float = struct.field(pytree_node=False, default=0.0)
    lora_rank: int = struct.field(pytree_node=False, default=0)

    @property
    def uses_lora(self) -> bool:
        return self.lora_rank > 0

    def model_params(self) -> Any:
        """The parameters to run the model with (base + adapters under LoRA)."""
        if self.uses_lora:
            return merge_lora(self.frozen_params, self.params, self.lora_alpha, self.lora_rank)
        return self.params

    @classmethod
    def create(
        cls,
        params: Any,
        config: RLConfig,
        rng: jax.Array,
        *,
        optimizer: Optional[optax.GradientTransformation] = None,
        ref_params: Any = None,
    ) -> "TrainState":
        """A fresh state: LoRA adapters when ``config.lora.rank > 0`` (in ``config.lora.dtype``;
        with ``critic.enabled`` the value head trains in full beside them), optimiser state
        of the trained parameters only.

        Args:
          params: model parameters (e.g. from ``jaxagent.models.init_model``).
          config: the recipe.
          rng: PRNG key.
          optimizer: defaults to ``make_optimizer(config)``; must be the one passed to
            ``make_update_step``.
          ref_params: reference parameters (only needed when the recipe uses KL and batches
            do not bring ``ref_logprobs``); copied.

        The update step donates the state: arrays of ``params`` are owned by the state from
        here on (copy them first if you need them after the first update).
        """
        tx = optimizer or make_optimizer(config)
        if ref_params is not None:
            # The state is donated to the update step: the reference must own its buffers even
            # when the caller passes the policy's own parameters as the reference.
            ref_params = jax.tree.map(jnp.copy, ref_params)
        rng, lora_key = jax.random.split(rng)
        lora = config.lora
        if lora.rank > 0:
            adapters = recipe_adapters(params, config, lora_key)
            return cls(
                params=adapters,
                opt_state=tx.init(adapters),
                step=jnp.zeros((), jnp.int32),
                rng=rng,
                frozen_params=params,
                ref_params=ref_params,
                lora_alpha=float(lora.alpha),
                lora_rank=int(lora.rank),
            )
        return cls(
            params=params,
            opt_state=tx.init(params),
            step=jnp.zeros((), jnp.int32),
            rng=rng,
            ref_params=ref_params,
        )


def recipe_adapters(params: Any, config: RLConfig, key: jax.Array) -> dict:
    """The trained parameters of a LoRA recipe (``config.lora.rank > 0``): adapters in
    ``config.lora.dtype`` on ``config.lora.targets``, and with ``critic.enabled`` the value
    head's leaves in full beside them (the base, frozen, would otherwise hold the critic).

    Raises:
      RLConfigError when the critic is enabled and the model has no value head.
    """
    lora = config.lora
    full = VALUE_HEAD_LEAVES if config.critic.enabled else ()
    names = {path_name(p).split("/")[-1] for p, _ in jax.tree.leaves_with_path(params)}
    if full and not set(full) <= names:
        raise RLConfigError(
            f"critic.enabled=true with lora.rank={lora.rank}: the model has no value head "
            f"({', '.join(full)}) to train beside the adapters; build it with "
            "model.value_head=true or disable the critic"
        )
    dtype = jnp.float32 if lora.dtype == "float32" else None
    return init_lora(params, lora.rank, lora.targets, key, dtype, full)


def make_optimizer(
    config: RLConfig,
    schedule: str = "constant",
    total_steps: int | None = None,
    final_ratio: float = 0.1,
) -> optax.GradientTransformation:
    """AdamW with global-norm gradient clipping and a linear warm-up of the learning rate
    (``config.optim``; ``max_grad_norm=0`` turns clipping off). The one optimiser builder:
    RL recipes and the SFT warm-start (``jaxagent.train.sft``) both train with it.

    After the warm-up the rate stays constant (``schedule="constant"``) or decays
    ("linear" / "cosine") to ``final_ratio * learning_rate`` at ``total_steps`` optimiser steps
    and stays there. ``"wsd"`` (warm-up, stable, decay) holds the rate until 75% of
    ``total_steps`` and then decays linearly: a long constant phase matters for tiny models
    learning to copy arguments from the prompt, an ability that appears abruptly after a few
    hundred steps and that an early decay delays (Hu et al. 2024, MiniCPM, arXiv 2404.06395,
    for the schedule).
    """
    o = config.optim
    peak, warm = o.learning_rate, o.warmup_steps
    if schedule == "constant":
        decay = optax.constant_schedule(peak) if warm > 0 else peak
    elif schedule in ("linear", "cosine", "wsd"):
        if total_steps is None:
            raise ValueError(f"make_optimizer: schedule={schedule!r} needs total_steps")
        decay_steps = max(1, total_steps - warm)
        if schedule == "linear":
            decay = optax.linear_schedule(peak, peak * final_ratio, decay_steps)
        elif schedule == "cosine":
            decay = optax.cosine_decay_schedule(peak, decay_steps, alpha=final_ratio)
        else:
            stable = max(1, int(total_steps * 0.75)) - warm
            decay = optax.join_schedules(
                [
                    optax.constant_schedule(peak),
                    optax.linear_schedule(
                        peak, peak * final_ratio, max(1, total_steps - warm - stable)
                    ),
                ],
                [stable],
            )
    else:
        raise ValueError(f"lr schedule {schedule!r}: choose constant, linear, cosine or wsd")
    lr = (
        decay
        if warm <= 0
        else optax.join_schedules([optax.linear_schedule(0.0, peak, warm), decay], [warm])
    )
    adamw = optax.adamw(lr, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay)
    tx = adamw
    if o.max_grad_norm:
        tx = optax.chain(clip_by_global_norm_scaled(o.max_grad_norm), adamw)
    return with_float32_moments(tx) if o.moments_dtype == "float32" else tx


def with_float32_moments(
    inner: optax.GradientTransformation,
) -> optax.GradientTransformationExtraArgs:
    """``inner`` run in float32 whatever the parameters' dtype: its state (Adam's mu and nu)
    is initialised from float32 parameters, each update sees float32 gradients and
    parameters, and the update it returns is cast back to each gradient's dtype.

    ``optax.adamw(mu_dtype=...)`` covers the first moment only; in bfloat16 the second one
    is the fragile one: ``b2 = 0.999`` rounds to 1.0 and the ``(1 - b2) g^2`` increments
    round away once nu is a few hundred times larger, so nu stops tracking g^2. Elementwise
    given ``grad_norm`` (the fused step's contract, ``jaxagent.rl.fused_step``), and the
    state keeps ``inner``'s layout (parameter-shaped trees), so shardings and the fused
    step's block slicing see the same structure.
    """
    inner = optax.with_extra_args_support(inner)

    def up(tree):
        # Arrays only: optax.tree_map_params initialises with a placeholder leaf.
        return jax.tree.map(lambda x: x.astype(jnp.float32) if hasattr(x, "astype") else x, tree)

    def init_fn(params):
        return inner.init(up(params))

    def update_fn(updates, state, params=None, **extra_args):
        new, state = inner.update(
            up(updates), state, None if params is None else up(params), **extra_args
        )
        return jax.tree.map(lambda n, g: n.astype(g.dtype), new, updates), state

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def clip_by_global_norm_scaled(max_norm: float) -> optax.GradientTransformation:
    """``optax.clip_by_global_norm`` written as one multiply by a scalar.

    Same maths (g * min(1, max_norm / ||g||)). optax's version divides elementwise, which
    XLA will not duplicate into the two Adam-moment fusions, so it materialises a whole
    clipped copy of the gradients (one extra model's worth of memory in the update); a
    multiply is fused into both consumers.
    """

    def init_fn(params):
        del params
        return optax.EmptyState()

    def update_fn(updates, state, params=None, *, grad_norm=None, **extra_args):
        # ``grad_norm``: the norm measured by an earlier pass over the same gradients (the
        # fused optimiser step, jaxagent.rl.fused_step): with it no leaf waits for the others.
        del params, extra_args
        norm = optax.global_norm(updates) if grad_norm is None else grad_norm
        scale = jnp.minimum(1.0, max_norm / jnp.maximum(norm, 1e-30))
        return jax.tree.map(lambda g: g * scale.astype(g.dtype), updates), state

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


# The merged model for sampling is a copy built from the base and the adapters: the base is
# never donated nor written, so it stays bit-identical for the whole run. (Merging into the
# base's own buffers and subtracting the delta after the rollout saves that copy but rounds
# every adapted weight twice a round trip: measured in bfloat16, 16.6% of the base's entries
# had drifted after 200 round trips.) The copy costs one model's worth of memory while
# sampling; it carries the base's shardings, so under FSDP over N chips each chip holds 1/N
# of it, beside its 1/N of the base (a critic's value head, trained beside the adapters, is
# replicated like them: D entries). It is dropped when ``end_sampling`` returns.
_merged_copy = jax.jit(merge_lora, static_argnums=(2, 3))


def begin_sampling(state: TrainState) -> tuple[Any, TrainState]:
    """(parameters to sample with, state to hand back to ``end_sampling``).

    Full fine-tuning: the state's own parameters, no copy. LoRA: a merged copy, base +
    adapters computed in float32 and rounded once (``merge_lora``), sharded like the base
    (see the note above); the state and its base are untouched."""
    if not state.uses_lora:
        return state.params, state
    merged = _merged_copy(state.frozen_params, state.params, state.lora_alpha, state.lora_rank)
    return merged, state


def on_sampling_params(state: TrainState, fn) -> tuple[TrainState, Any]:
    """``(state, fn(params))`` with ``params`` the model's parameters (LoRA: the merged copy
    of ``begin_sampling``, released when ``fn`` returns; full fine-tuning: no copy)."""
    merged, state = begin_sampling(state)
    out = fn(merged)
    return end_sampling(state, merged), out


def end_sampling(state: TrainState, merged: Any) -> TrainState:
    """The state to train on after sampling with ``merged``: unchanged (the base was never
    written). The caller drops its reference to ``merged``; a LoRA copy is then freed."""
    del merged
    return state
