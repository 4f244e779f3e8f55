"""The update step: microbatching identity, recipe identities, LoRA, reference model, critic."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.models import token_logprobs_and_entropy
from jaxagent.rl.losses import aggregation_denominators
from jaxagent.rl.lora import lora_param_count
from jaxagent.rl.prepare import compute_advantages
from jaxagent.rl.recipes import get_recipe
from jaxagent.rl.train_state import TrainState
from jaxagent.rl.model_fns import logits_logprob_fn
from jaxagent.rl.update import _reference_logprobs, make_loss_fn, make_update_step
import optax

from test_rl_common import (
    assert_logprob_fns_match,
    assert_trees_close_f32,
    copy_tree,
    max_abs_diff,
    on_policy_batch,
    tiny_model,
)


def minibatch_grad(config, apply_fn, params, batch):
    """Gradient of one full-minibatch loss (one epoch, one minibatch, no optimiser)."""
    prepared = compute_advantages(config, batch)
    loss_fn = make_loss_fn(config, logits_logprob_fn(apply_fn))
    nt, ns = aggregation_denominators(prepared.loss_mask)
    return jax.jit(jax.grad(lambda p: loss_fn(p, prepared, nt, ns)[0]))(params), prepared


def test_microbatch_accumulation_equals_one_big_batch():
    apply_fn, params = tiny_model(num_layers=1)
    batch = on_policy_batch(apply_fn, params, batch_size=8)
    results = []
    # SGD: the parameter change is the gradient itself, so two summation orders can only
    # differ by float32 reassociation (Adam would turn near-zero gradient entries into
    # sign-like steps of +-lr, and the comparison would depend on the CPU's vector width).
    tx = optax.sgd(0.5)
    for micro in (2, 8):
        cfg = get_recipe(
            "dapo", update={"minibatch_size": 8, "microbatch_size": micro, "num_epochs": 2}
        )
        state = TrainState.create(copy_tree(params), cfg, jax.random.key(0), optimizer=tx)
        results.append(make_update_step(cfg, apply_fn, tx)(state, batch))
    (s_micro, m_micro), (s_full, m_full) = results
    # 8 rows x 12 tokens summed per gradient entry, over two steps.
    assert_trees_close_f32(
        jax.tree.map(jnp.subtract, s_micro.params, params),
        jax.tree.map(jnp.subtract, s_full.params, params),
        n_terms=2 * 96,
    )
    assert max_abs_diff(s_full.params, params) > 1e-3  # the update moved the weights
    np.testing.assert_allclose(m_micro["loss/policy"], m_full["loss/policy"], atol=1e-6)
    np.testing.assert_allclose(m_micro["optim/grad_norm"], m_full["optim/grad_norm"], rtol=1e-5)
    # The second epoch is off-policy: the ratio moved away from 1.
    assert float(m_full["kl/approx_old_new"]) > 0
    assert int(s_full.step) == 2


def test_loop_one_epoch_one_minibatch_equals_rloo_gradient():
    # On-policy, the PPO ratio is 1 and its gradient is the log-prob gradient: LOOP's clipped
    # surrogate with leave-one-out advantages is RLOO's REINFORCE gradient.
    apply_fn, params = tiny_model(num_layers=1)
    batch = on_policy_batch(apply_fn, params, batch_size=8, group=4)
    rloo = get_recipe("rloo", update={"minibatch_size": 8})
    loop = get_recipe(
        "loop",
        lora={"rank": 0},
        update={"num_epochs": 1, "minibatch_size": 8},
        advantage={"drop_below": 0.0},
        loss={"aggregation": rloo.loss.aggregation, "norm_constant": rloo.loss.norm_constant},
    )
    g_loop, prep = minibatch_grad(loop, apply_fn, params, batch)
    g_rloo, _ = minibatch_grad(rloo, apply_fn, params, batch)
    assert float(jnp.abs(prep.advantages).max()) > 0.1
    assert max(float(jnp.abs(x).max()) for x in jax.tree.leaves(g_rloo)) > 1e-3
    assert max_abs_diff(g_loop, g_rloo) <= 1e-5


def test_grpo_equals_loop_with_std_normalized_advantages():
    # GRPO's KL term is zero with zero gradient at the reference (first step, ref = policy),
    # so GRPO is LOOP's loss fed with group-std-normalised advantages.
    apply_fn, params = tiny_model(num_layers=1)
    batch = on_policy_batch(apply_fn, params, batch_size=8, group=4)
    batch = batch.replace(ref_logprobs=batch.old_logprobs)
    grpo = get_recipe("grpo", update={"minibatch_size": 8})
    loop = get_recipe(
        "loop",
        lora={"rank": 0},
        update={"minibatch_size": 8},
        advantage={
            "drop_below": 0.0,
            "estimator": "group_normalized",
            "std_mode": grpo.advantage.std_mode,
        },
    )
    g_grpo, p_grpo = minibatch_grad(grpo, apply_fn, params, batch)
    g_loop, p_loop = minibatch_grad(loop, apply_fn, params, batch)
    np.testing.assert_allclose(p_grpo.advantages, p_loop.advantages)
    assert max_abs_diff(g_grpo, g_loop) <= 1e-5
    # ...whereas plain LOOP (leave-one-out, no std) gives a different gradient.
    g_plain, _ = minibatch_grad(
        loop.override(advantage={"estimator": "leave_one_out"}), apply_fn, params, batch
    )
    assert max_abs_diff(g_plain, g_grpo) > 1e-4


def test_lora_trains_only_adapters():
    apply_fn, params = tiny_model(num_layers=1)
    batch = on_policy_batch(apply_fn, params, batch_size=8)
    cfg = get_recipe(
        "loop",
        update={"minibatch_size": 8, "num_epochs": 2},
        optim={"learning_rate": 1e-2},
        advantage={"drop_below": 0.0},
    )
    assert cfg.lora.rank == 16
    base = copy_tree(params)
    state = TrainState.create(copy_tree(params), cfg, jax.random.key(0))
    n_adapter = lora_param_count(state.params)
    n_full = sum(x.size for x in jax.tree.leaves(params))
    assert sum(x.size for x in jax.tree.leaves(state.opt_state)) <= 2 * n_adapter + 8 < n_full
    # b = 0 at start: the adapted model is the base model.
    assert max_abs_diff(state.model_params(), base) == 0.0
    state, metrics = make_update_step(cfg, apply_fn)(state, batch)
    assert max_abs_diff(state.frozen_params, base) == 0.0
    assert max_abs_diff(state.model_params(), base) > 1e-4
    assert float(metrics["optim/grad_norm"]) > 0


def test_reference_logprobs_from_ref_params_and_missing_reference_error():
    apply_fn, params = tiny_model(num_layers=1)
    batch = on_policy_batch(apply_fn, params, batch_size=8)
    cfg = get_recipe("grpo", update={"minibatch_size": 8, "microbatch_size": 4})
    ref = jax.jit(lambda p, b: _reference_logprobs(cfg, logits_logprob_fn(apply_fn), p, b))(
        params, batch
    )
    logits, _ = apply_fn(params, batch.tokens, batch.positions, batch.segment_ids)
    np.testing.assert_allclose(ref, token_logprobs_and_entropy(logits, batch.tokens)[0], atol=1e-5)
    state = TrainState.create(copy_tree(params), cfg, jax.random.key(0))
    with pytest.raises(ValueError, match="ref_params is None"):
        make_update_step(cfg, apply_fn)(state, batch)
    with pytest.raises(ValueError, match="minibatch_size=8 does not divide"):
        make_update_step(cfg, apply_fn)(state, on_policy_batch(apply_fn, params, batch_size=12))


def test_ppo_with_critic_fits_values():
    apply_fn, params = tiny_model(num_layers=1, value_head=True)
    batch = on_policy_batch(apply_fn, params, batch_size=8, with_values=True)
    # A reward the critic can see: 1 when the first token is in the lower half of the vocabulary.
    batch = batch.replace(rewards=(batch.tokens[:, 0] < 64).astype(jnp.float32))
    # No value clipping: the batch (and its old values) is reused, and the clip would hold V
    # within 0.2 of the old values by design.
    cfg = get_recipe(
        "ppo",
        update={"minibatch_size": 4},
        optim={"learning_rate": 3e-3},
        kl={"mode": "none"},
        critic={"value_coef": 1.0, "value_clip_eps": 0.0},
    )
    state = TrainState.create(copy_tree(params), cfg, jax.random.key(0))
    update = make_update_step(cfg, apply_fn)
    losses = []
    for _ in range(6):
        state, metrics = update(state, batch)
        losses.append(float(metrics["loss/value"]))
    # GAE targets of the terminal reward (values ~ 0 at sampling): the critic fits them.
    assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.parametrize("remat", [True, False])
def test_lean_logprob_fn_matches_logits_path(remat):
    # The head over blocks of 3 loss positions (prompt positions skipped), with or without
    # block remat (rl.update.remat), must give the same log-probs, entropies, values and
    # gradients on the loss tokens as the plain logits path.
    from jaxagent.models import ModelConfig, init_model
    from jaxagent.rl.model_fns import model_logprob_fn

    graphdef, params = init_model(
        ModelConfig.test(num_layers=2, value_head=True), jax.random.key(0)
    )
    lean = model_logprob_fn(graphdef, remat=remat, head_chunk=3, skip_unmasked_chunks=True)
    assert_logprob_fns_match(graphdef, params, lean)
