"""Update guards inside the jitted step: skip a non-finite or empty optimiser step, stop on
runaway KL.

optax's ``apply_if_finite`` convention (a step whose gradient is not finite leaves params and
optimiser state untouched and is counted), written as a ``lax.cond`` over one minibatch step so
that the optimiser state keeps its layout (checkpoints stay compatible) and the taken branch
updates in place. The KL stop follows LOOP / PPO's ``target_kl``: once a minibatch's approximate
KL(old || new) exceeds ``kl_stop``, that step and every later one of the iteration is skipped.

A minibatch without a single loss token (LOOP's |A| filter and DAPO's dynamic sampling drop
whole groups, so a minibatch of dropped rows happens in ordinary runs) has a zero gradient, but
an optimiser step on it still moves every weight: Adam's momentum keeps stepping along the
stale direction, AdamW's decay shrinks the weights and the schedule advances. Such a step is
skipped whole, like a non-finite one, and counted in ``guard/no_tokens``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def guarded_step(tx, grads, opt_state, params, sums: dict, kl_stop: float, stopped):
    """One optimiser step unless the loss or the gradient is non-finite, the minibatch has no
    loss token, or the iteration was KL-stopped.

    Args:
      tx: the optimiser; grads, opt_state, params: its pytrees.
      sums: the minibatch's metrics: ``optim/grad_norm`` [] (non-finite iff some gradient
        entry is, or the norm overflowed), ``loss/total`` [] (a NaN loss can come with a
        finite, e.g. zero, gradient: the step is skipped all the same) and
        ``kl/approx_old_new`` [] (KL(old || new) before this step) and ``optim/loss_tokens``
        [] (the minibatch's loss-mask sum; 0: nothing to learn from).
      kl_stop: static threshold (0 = off).
      stopped: [] bool, the iteration's KL stop so far.

    Returns:
      (params, opt_state, stopped, metrics) with ``guard/nonfinite`` (1.0 when this step was
      skipped for a non-finite gradient), ``guard/no_tokens`` (1.0 when skipped for having no
      loss token) and ``guard/kl_stopped`` (1.0 when skipped by the stop).
    """
    apply, stopped, metrics = step_decision(sums, kl_stop, stopped)

    def step(operands):
        p, s, g = operands
        updates, s = tx.update(g, s, p)
        return optax.apply_updates(p, updates), s

    params, opt_state = jax.lax.cond(
        apply, step, lambda operands: operands[:2], (params, opt_state, grads)
    )
    return params, opt_state, stopped, metrics


def step_decision(sums: dict, kl_stop: float, stopped):
    """``(apply, stopped, metrics)``: whether the step goes through (see ``guarded_step``);
    the fused step (jaxagent.rl.fused_step) decides with it between its two passes."""
    finite = jnp.isfinite(sums["optim/grad_norm"]) & jnp.isfinite(sums["loss/total"])
    empty = ~(sums["optim/loss_tokens"] > 0)
    if kl_stop > 0:
        stopped = stopped | (sums["kl/approx_old_new"] > kl_stop)
    metrics = {
        "guard/nonfinite": (~finite & ~stopped).astype(jnp.float32),
        "guard/no_tokens": (empty & finite & ~stopped).astype(jnp.float32),
        "guard/kl_stopped": stopped.astype(jnp.float32),
    }
    return finite & ~empty & ~stopped, stopped, metrics
