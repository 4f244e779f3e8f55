"""The optimiser step fused into the backward pass: no full gradient tree in memory.

A plain update holds every gradient at once (params + grads + two Adam moments), because
global-norm clipping and the non-finite guard need all of them before any parameter moves,
and because XLA's scheduler, left alone, keeps most gradients of a backward pass alive until
it ends even when each is consumed by an elementwise optimiser (measured: a gradient + norm
program kept 400 of 512 MiB of gradients). The fused step runs the minibatch's forward +
backward pass twice, as LOMO does for clipping (Lv et al., arXiv 2306.09782):

1. the loss, its metrics and the gradient's global norm: each transformer block's backward
   reduces its weight gradient to a sum of squares at once; only the gradients outside the
   blocks (embedding, final norm, head) are kept whole;
2. only if the guard lets the step through (finite loss and norm, no KL stop): each block's
   backward applies the optimiser to that block's parameters and moments as soon as its
   gradient exists (clipped by the norm of pass 1), and the next block's backward waits for
   that update (a zero data dependence), so one block's gradient is alive at a time.

Both passes are one program run twice in a two-step loop (two unrolled copies compiled to
twice the code and +410 MiB of compiler memory on a 12-layer model). Exact: the same
gradients, clip, optimiser and guards as the plain step, up to the rounding of a differently
fused program. Costs one more forward + backward per optimiser step. The optimiser must be
elementwise over parameters given the norm (``make_optimizer``'s AdamW with
``clip_by_global_norm_scaled``, which takes the norm of pass 1 as ``grad_norm``);
``check_elementwise`` refuses others.

Each block goes through ``Transformer.hidden``'s ``remat`` hook (``model_logprob_fn``'s
``block_wrap``); the model says which parameters form a block (``jaxagent.models.api.layer_of``:
the ``layer_<i>`` entries of an unrolled model). A ``scan_layers`` model's stacked blocks go
through ``ScanHook`` instead (``Transformer.hidden``'s ``LayerScan``): the whole scan is one
custom VJP whose backward loop steps each layer's slice of the stacked parameters and moments
in place (measured on CPU at 6 x 384: 24.7 MB of temporaries against the plain scanned step's
41.8 MB; ``tests/test_fused_step.py``).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxagent.models.api import STACKED_BLOCKS, layer_index, layer_of
from jaxagent.rl.lora import path_name


class ParamPlan:
    """Which leaves of the params belong to which block, and where the optimiser state keeps
    its parameter-shaped trees (Adam's moments), so a block's slice of the state can be cut
    out, updated and put back."""

    def __init__(self, params: Any, opt_state: Any):
        flat, self.params_def = jax.tree_util.tree_flatten_with_path(params)
        top = [layer_of(path_name(path)) for path, _ in flat]
        # scan_layers: one stacked "block" whose leaves are [L, ...], stepped a layer at a
        # time inside the scan's own backward pass (``ScanHook``)
        self.stacked = STACKED_BLOCKS in top
        if self.stacked:
            blocks = [STACKED_BLOCKS]
        else:
            blocks = sorted({k for k in top if k is not None}, key=layer_index)
        self.blocks = {k: [j for j, t in enumerate(top) if t == k] for k in blocks}
        self.rest = [j for j, t in enumerate(top) if t not in self.blocks]
        is_mirror = lambda x: jax.tree.structure(x) == self.params_def
        nodes, self.state_def = jax.tree.flatten(opt_state, is_leaf=is_mirror)
        self.mirror = [is_mirror(n) for n in nodes]

    def split_state(self, opt_state) -> tuple[list, list]:
        """(mirrors: each parameter-shaped tree (or leaf list) as its leaf list, others: the
        rest of the state's leaves, e.g. step counts)."""
        nodes = self.state_def.flatten_up_to(opt_state)
        mirrors = [jax.tree.leaves(n) for n, m in zip(nodes, self.mirror) if m]
        others = [n for n, m in zip(nodes, self.mirror) if not m]
        return mirrors, others

    def state_of(self, mirrors: list, others: list) -> Any:
        """An optimiser state whose parameter-shaped trees are the given leaf lists."""
        mi, oi = iter(mirrors), iter(others)
        return self.state_def.unflatten([next(mi) if m else next(oi) for m in self.mirror])

    def join_state(self, mirror_leaves: list, others: list) -> Any:
        """The inverse of ``split_state``: full mirror leaf lists back into trees."""
        trees = [self.params_def.unflatten(leaves) for leaves in mirror_leaves]
        return self.state_of(trees, others)


def _step_if(ok, tx, plan, grads, params, mirrors, others, norm):
    """One optimiser step of a slice of the params (leaf lists) when ``ok``, else the old
    values: (params, mirrors, others). A ``lax.cond`` per slice: one around a whole pass
    measured +130 MiB of XLA temporaries (12 layers), a select per leaf +85 MiB (the new and
    the old value both alive)."""

    def step(operands):
        g, p, m = operands
        updates, opt = tx.update(g, plan.state_of(m, others), p, grad_norm=norm)
        new_m, new_others = plan.split_state(opt)
        return optax.apply_updates(p, updates), new_m, new_others

    return jax.lax.cond(ok, step, lambda o: (o[1], o[2], others), (grads, params, mirrors))


def _tie(tree, *xs):
    """``xs`` plus zero times one entry of ``tree``: a data dependence XLA keeps (an
    optimisation barrier alone is dropped before common-subexpression elimination)."""
    zero = jnp.ravel(jax.tree.leaves(tree)[0])[0] * 0
    return tuple(jax.tree.map(lambda a: a + zero.astype(a.dtype), x) for x in xs)


class BlockHook:
    """The ``remat`` callable for ``Transformer.hidden``: block ``i`` runs as a
    rematerialised custom-VJP whose backward consumes the block's gradient on the spot.

    The cotangent of the block's probe (a zero scalar) is the sum of its squared gradient;
    the cotangents of its parameters and of its slice of the optimiser moments are their
    values after the step (unchanged where ``ok`` is false); ``fused_pass`` reads them back.
    """

    def __init__(self, moments: list, probes: list, tx, plan, aux):
        self.moments, self.probes, self.tx, self.plan = moments, probes, tx, plan
        self.aux = aux  # (the optimiser state's other leaves, the grad norm, apply)
        self.calls = 0

    def __call__(self, block: Callable) -> Callable:
        i = self.calls
        self.calls += 1
        if i >= len(self.moments):
            raise ValueError(
                f"update.fused_optimizer: the model ran more blocks than the params' "
                f"{len(self.moments)} layer_<i> entries"
            )
        tx, plan = self.tx, self.plan

        @jax.custom_vjp
        def run(state, x, moments, probe, aux, *consts):
            return block(state, x, *consts)

        def fwd(state, x, moments, probe, aux, *consts):
            return block(state, x, *consts), (state, x, moments, aux, consts)

        def bwd(res, g):
            state, x, moments, (others, norm, ok), consts = res
            (state, x, consts), g = jax.lax.optimization_barrier(((state, x, consts), g))
            # Recompute only once the cotangent exists, from fresh copies of the block's
            # weights too: XLA would otherwise share the forward pass's transposed weight
            # copies with the backward pass and keep every block's alive in between.
            fresh, x = _tie(g, state, x)
            _, vjp = jax.vjp(lambda s, y: block(s, y, *consts), fresh, x)
            ds, dx = vjp(g)
            grads = jax.tree.leaves(ds)
            sq = sum(jnp.sum(jnp.square(v.astype(jnp.float32))) for v in grads)
            p_leaves, p_def = jax.tree.flatten(state)
            # the block's leaves and its slice of the moments must line up (both in key order)
            for m in moments:
                if [a.shape for a in m] != [a.shape for a in p_leaves]:
                    raise ValueError("update.fused_optimizer: a block's params and moments differ")
            new_p, new_m, _ = _step_if(ok, tx, plan, grads, p_leaves, moments, others, norm)
            # the next block's backward waits for this one's update: one block's gradient
            # is alive at a time
            (dx,) = _tie((new_p, new_m, sq), dx)
            return (p_def.unflatten(new_p), dx, new_m, sq, None) + (None,) * len(consts)

        run.defvjp(fwd, bwd)
        moments, probe, aux = self.moments[i], self.probes[i], self.aux
        return lambda state, x, *consts: run(state, x, moments, probe, aux, *consts)


class ScanHook:
    """The ``remat`` of a ``scan_layers`` model (``Transformer.hidden``'s ``LayerScan``): the
    whole scan over the stacked blocks as one custom VJP, whose backward pass is a loop over
    the layers from the last that recomputes layer i from its saved input, takes its
    gradient, and steps that layer's slice of the stacked parameters and moments in place
    (``dynamic_update_slice`` of loop-carried buffers, so no stacked gradient or second
    stacked copy of the weights or moments exists): one layer's gradient is alive at a time,
    as ``BlockHook``'s unrolled blocks. Cotangents returned: the stacked parameters and
    moments after the step (unchanged where ``ok`` is false), and the probe's, the blocks'
    sum of squared gradients."""

    def __init__(self, moments: list, probe, tx, plan, aux):
        self.moments, self.probe, self.tx, self.plan = moments, probe, tx, plan
        self.aux = aux  # (the optimiser state's other leaves, the grad norm, apply)
        self.calls = 0

    def __call__(self, block: Callable) -> Callable:
        raise ValueError(
            "update.fused_optimizer: the params hold the stacked blocks of a scan_layers "
            "model, whose hook runs the whole scan (ScanHook.scan), not one block"
        )

    def scan(self, block: Callable, stacked, x, consts: tuple):
        """``block(layer_state, x, *consts)`` over the layers of ``stacked`` ([L, ...]
        leaves), carrying ``x``; returns the last layer's output."""
        self.calls += 1
        tx, plan = self.tx, self.plan

        def forward(stacked, x, consts):
            def body(x, st):
                return block(st, x, *consts), x  # each layer's input kept (as remat does)

            return jax.lax.scan(body, x, stacked)

        @jax.custom_vjp
        def run(stacked, x, moments, probe, aux, consts):
            return forward(stacked, x, consts)[0]

        def fwd(stacked, x, moments, probe, aux, consts):
            y, inputs = forward(stacked, x, consts)
            return y, (stacked, inputs, moments, aux, consts)

        def bwd(res, g):
            stacked, inputs, moments, (others, norm, ok), consts = res
            p_leaves, p_def = jax.tree.flatten(stacked)
            for m in moments:
                if [a.shape for a in m] != [a.shape for a in p_leaves]:
                    raise ValueError(
                        "update.fused_optimizer: the blocks' params and moments differ"
                    )
            n = inputs.shape[0]
            at = lambda a, i: jax.lax.dynamic_index_in_dim(a, i, keepdims=False)  # noqa: E731
            put = lambda a, v, i: jax.lax.dynamic_update_index_in_dim(a, v, i, 0)  # noqa: E731

            def body(j, carry):
                dx, p_all, m_all, sq = carry
                i = n - 1 - j
                p_i = [at(a, i) for a in p_all]  # not yet stepped: layers > i only are
                _, vjp = jax.vjp(
                    lambda s, y: block(p_def.unflatten(s), y, *consts), p_i, at(inputs, i)
                )
                grads, dx = vjp(dx.astype(inputs.dtype))
                sq = sq + sum(jnp.sum(jnp.square(v.astype(jnp.float32))) for v in grads)
                m_i = [[at(a, i) for a in m] for m in m_all]
                new_p, new_m, _ = _step_if(ok, tx, plan, grads, p_i, m_i, others, norm)
                p_all = [put(a, v, i) for a, v in zip(p_all, new_p)]
                m_all = [[put(a, v, i) for a, v in zip(m, nm)] for m, nm in zip(m_all, new_m)]
                return dx, p_all, m_all, sq

            init = (g, p_leaves, moments, jnp.zeros((), jnp.float32))
            dx, p_all, m_all, sq = jax.lax.fori_loop(0, n, body, init)
            return p_def.unflatten(p_all), dx, m_all, sq, None, None

        run.defvjp(fwd, bwd)
        return run(stacked, x, self.moments[0], self.probe[0], self.aux, consts)


def check_elementwise(tx) -> None:
    """The fused step applies ``tx`` block by block: refuse an optimiser whose update of one
    leaf depends on the others (e.g. ``optax.clip_by_global_norm``, which would clip each
    block by its own norm) instead of silently changing the maths."""
    tx = optax.with_extra_args_support(tx)

    @jax.jit  # one small program (op-by-op evaluation compiled dozens, ~250 MiB of them)
    def probe():
        p = [jnp.ones((2,)), jnp.full((3,), 2.0)]
        g = [jnp.full((2,), 3e6), jnp.full((3,), -4e6)]
        norm = optax.global_norm(g)
        joint, _ = tx.update(g, tx.init(p), p, grad_norm=norm)
        alone = [tx.update([g[i]], tx.init([p[i]]), [p[i]], grad_norm=norm)[0][0] for i in (0, 1)]
        return joint, alone

    joint, alone = probe()
    if not all(np.allclose(a, j, rtol=1e-5, atol=0) for a, j in zip(alone, joint)):
        raise ValueError(
            "update.fused_optimizer: the optimiser's update of one parameter depends on "
            "the others (global-norm clipping that ignores grad_norm?); build it with "
            "jaxagent.rl.train_state.make_optimizer or set fused_optimizer=false"
        )


def fused_pass(loss_of: Callable, tx, plan: ParamPlan, params, opt_state, norm, ok):
    """One forward + backward pass of ``loss_of(params, hook) -> (loss, metric_sums)``.

    Returns ``(metric_sums, grad_norm, params, opt_state)``: the gradient's global norm of
    this pass and, where ``ok``, the params and optimiser state after one step clipped by
    ``norm`` (the norm of an earlier pass over the same minibatch); else the old ones.
    """
    mirrors, others = plan.split_state(opt_state)
    keys = list(plan.blocks)
    moments = [[[m[j] for j in plan.blocks[k]] for m in mirrors] for k in keys]
    probes = [jnp.zeros((), jnp.float32) for _ in keys]
    hooks = []

    def f(p, moments, probes):
        hook = ScanHook if plan.stacked else BlockHook
        hooks.append(hook(moments, probes, tx, plan, (others, norm, ok)))
        return loss_of(p, hooks[-1])

    (_, sums), (g, new_moments, sq) = jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True)(
        params, moments, probes
    )
    if hooks[-1].calls != len(keys):
        raise ValueError(
            f"update.fused_optimizer: the model ran {hooks[-1].calls} blocks through the hook "
            f"but the params hold {len(keys)} layer_<i> entries; the fused step needs "
            "jaxagent.rl.model_fns.model_logprob_fn (full fine-tuning, no LoRA)"
        )
    g_leaves, p_leaves = jax.tree.leaves(g), jax.tree.leaves(params)
    rest_g = [g_leaves[j] for j in plan.rest]
    grad_norm = jnp.sqrt(sum(sq) + sum(jnp.sum(jnp.square(v)) for v in rest_g))
    # The parameters outside the blocks (embedding, final norm, head) step as usual.
    rest_p, rest_m, new_others = _step_if(
        ok,
        tx,
        plan,
        rest_g,
        [p_leaves[j] for j in plan.rest],
        [[m[j] for j in plan.rest] for m in mirrors],
        others,
        norm,
    )
    new_p = list(g_leaves)  # a block's "gradient" is its value after the step (BlockHook)
    for j, v in zip(plan.rest, rest_p):
        new_p[j] = v
    new_m = [list(m) for m in mirrors]
    for mi in range(len(mirrors)):
        for j, v in zip(plan.rest, rest_m[mi]):
            new_m[mi][j] = v
        for b, k in enumerate(keys):
            for j, v in zip(plan.blocks[k], new_moments[b][mi]):
                new_m[mi][j] = v
    new_params = plan.params_def.unflatten(new_p)
    return sums, grad_norm, new_params, plan.join_state(new_m, new_others)
