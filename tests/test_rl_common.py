"""Shared helpers for the RL tests (no tests here): a tiny model and on-policy batches."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxagent.models import ModelConfig, init_model
from jaxagent.models import token_logprobs_and_entropy
from jaxagent.rl.model_fns import model_apply_fn
from jaxagent.types import TokenBatch


def tiny_model(seed=0, **overrides):
    """(apply_fn, params) of a very small jaxagent LM (vocab 128, D 64, 2 layers); the params
    are a fresh copy (update steps donate them), the model is built once per process."""
    apply_fn, params = _tiny_model(seed, tuple(sorted(overrides.items())))
    return apply_fn, copy_tree(params)


@functools.lru_cache(maxsize=None)
def _tiny_model(seed, overrides):
    graphdef, params = init_model(ModelConfig.test(**dict(overrides)), jax.random.key(seed))
    return model_apply_fn(graphdef), params


def on_policy_batch(
    apply_fn,
    params,
    batch_size=16,
    seq_len=12,
    prompt_len=4,
    group=4,
    seed=1,
    vocab=128,
    with_values=False,
):
    """Random token rows with ragged right padding, loss on the completion, old log-probs from
    the current params (so the first update is on-policy), 0/1 rewards, groups of ``group``."""
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    tokens = jax.random.randint(k1, (batch_size, seq_len), 0, vocab)
    lengths = jax.random.randint(k2, (batch_size,), prompt_len + 2, seq_len + 1)
    t = jnp.arange(seq_len)[None, :]
    seg = (t < lengths[:, None]).astype(jnp.int32)
    pos = jnp.broadcast_to(t, (batch_size, seq_len)).astype(jnp.int32)
    mask = ((t >= prompt_len) & (seg > 0)).astype(jnp.float32)
    lp, values = _logprobs_values(apply_fn, params, tokens, pos, seg)
    rewards = jax.random.bernoulli(k3, 0.5, (batch_size,)).astype(jnp.float32)
    extra = {}
    if with_values:
        v = jnp.concatenate([jnp.zeros((batch_size, 1)), values[:, :-1]], axis=1)
        extra = dict(values=v * mask)
    return TokenBatch(
        tokens=tokens,
        positions=pos,
        segment_ids=seg,
        loss_mask=mask,
        old_logprobs=lp * mask,
        advantages=jnp.zeros_like(mask),
        rewards=rewards,
        group_ids=jnp.arange(batch_size) // group,
        turn_ids=jnp.where(mask > 0, 0, -1).astype(jnp.int32),
        **extra,
    )


@functools.partial(jax.jit, static_argnums=0)
def _logprobs_values(apply_fn, params, tokens, pos, seg):
    logits, values = apply_fn(params, tokens, pos, seg)
    return token_logprobs_and_entropy(logits, tokens)[0], values


def assert_trees_close_f32(a, b, n_terms: int, rtol: float = 0.0):
    """``chex.assert_trees_all_close`` at the float32 reassociation bound: a sum of ``n_terms``
    float32 terms computed in another order (another device layout, another microbatching,
    another CPU's vector width) can differ by up to ``n_terms * eps32`` times the largest
    magnitude, so each leaf gets ``atol = n_terms * eps32 * max|leaf|``."""
    import chex

    eps = float(np.finfo(np.float32).eps)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        scale = max(float(jnp.max(jnp.abs(x))), 1e-30) if np.size(x) else 1.0
        chex.assert_trees_all_close(x, y, atol=n_terms * eps * scale, rtol=rtol)


def copy_tree(tree):
    return jax.tree.map(jnp.copy, tree)


def max_abs_diff(a, b):
    return max(
        (float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))),
        default=0.0,
    )


def assert_logprob_fns_match(graphdef, params, lean, atol=1e-5):
    """``lean`` (a ``model_logprob_fn``) gives the plain logits path's log-probs, entropies,
    values and gradients on the loss tokens of an on-policy batch (to ``atol``)."""
    from jaxagent.rl.model_fns import logits_logprob_fn

    plain = logits_logprob_fn(model_apply_fn(graphdef))
    batch = on_policy_batch(model_apply_fn(graphdef), params, batch_size=4)
    args = (batch.tokens, batch.positions, batch.segment_ids)
    m = batch.loss_mask

    def objective(fn):
        def f(p):
            lp, ent, v = fn(p, *args, loss_mask=m)
            return jnp.sum((lp + 0.1 * ent + 0.01 * v) * m), (lp, ent, v)

        return jax.jit(jax.value_and_grad(f, has_aux=True))

    (_, out_a), g_a = objective(plain)(params)
    (_, out_b), g_b = objective(lean)(params)
    for a, b in zip(out_a, out_b):
        np.testing.assert_allclose(np.asarray(b) * m, np.asarray(a) * m, atol=atol)
    assert max_abs_diff(g_a, g_b) <= atol


def single_and_sharded_update(config, tx, logprob_fn, graphdef, params, batch, **mesh_shape):
    """One update step of ``config`` on one device and on a mesh (``data=4, fsdp=2`` unless
    given), from the same params and RNG: ``(single_state, single_metrics, sharded_state,
    sharded_metrics)``."""
    from jaxagent.models import param_logical_axes
    from jaxagent.parallel.mesh import batch_shardings, make_mesh, state_shardings
    from jaxagent.rl.train_state import TrainState
    from jaxagent.rl.update import make_update_step

    single = TrainState.create(copy_tree(params), config, jax.random.key(7), optimizer=tx)
    single, m1 = make_update_step(config, optimizer=tx, logprob_fn=logprob_fn)(single, batch)
    mesh = make_mesh(**(mesh_shape or dict(data=4, fsdp=2)))
    state = TrainState.create(copy_tree(params), config, jax.random.key(7), optimizer=tx)
    st_sh = state_shardings(state, mesh, param_logical_axes(graphdef, params), tx)
    b_sh = batch_shardings(mesh, batch)
    update = make_update_step(
        config,
        optimizer=tx,
        logprob_fn=logprob_fn,
        mesh=mesh,
        state_sharding=st_sh,
        batch_sharding=b_sh,
    )
    state, m8 = update(jax.device_put(state, st_sh), jax.device_put(batch, b_sh))
    return single, m1, state, m8
