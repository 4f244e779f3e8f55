"""Guards: a non-finite step is skipped and counted, the run stops past a limit, spikes and
runaway KL are reported (jaxagent.rl.guards inside the jitted step, jaxagent.train.guards in
the trainer)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.rl.prepare import compute_advantages
from jaxagent.rl.recipes import get_recipe
from jaxagent.rl.train_state import TrainState
from jaxagent.rl.update import make_update_step
from jaxagent.train.config import load_config
from jaxagent.errors import ConfigError
from jaxagent.train.guards import GuardSection, TrainingStopped, UpdateGuard

from test_rl_common import copy_tree, max_abs_diff, on_policy_batch, tiny_model


def _leaves_equal(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_injected_nan_skips_exactly_that_step_and_training_continues():
    apply_fn, params = tiny_model(num_layers=1)
    batch = on_policy_batch(apply_fn, params, batch_size=8, group=4)
    cfg = get_recipe("rloo", update={"minibatch_size": 4, "num_epochs": 1, "shuffle": False})
    step = make_update_step(cfg, apply_fn, compute_advantages=False)
    batch = compute_advantages(cfg, batch)
    # NaN in one advantage of row 0: minibatch 0's (rows 0-3) gradient is NaN, minibatch 1
    # (rows 4-7) is clean.
    poisoned = batch.replace(advantages=batch.advantages.at[0].set(jnp.nan))
    state0 = TrainState.create(copy_tree(params), cfg, jax.random.key(0))
    opt0 = jax.tree.map(np.asarray, state0.opt_state)
    state1, m = step(state0, poisoned)
    assert float(m["guard/nonfinite"]) == 0.5  # one of two optimiser steps skipped
    assert not np.isfinite(float(m["optim/grad_norm"]))  # reported, not hidden
    leaves = jax.tree.leaves(state1.params) + jax.tree.leaves(state1.opt_state)
    assert all(
        bool(jnp.all(jnp.isfinite(x))) for x in leaves if jnp.issubdtype(x.dtype, jnp.floating)
    )
    assert max_abs_diff(state1.params, params) > 5e-7  # the clean minibatch still trained
    # every step poisoned: params and optimiser state are exactly what they were
    all_bad = batch.replace(advantages=batch.advantages.at[0].set(jnp.nan).at[4].set(jnp.inf))
    state_b = TrainState.create(copy_tree(params), cfg, jax.random.key(0))
    state_b2, mb = step(state_b, all_bad)
    assert float(mb["guard/nonfinite"]) == 1.0
    assert _leaves_equal(state_b2.params, params)
    assert _leaves_equal(jax.tree.map(np.asarray, state_b2.opt_state), opt0)
    # and the next clean batch trains normally from there
    state_b3, mc = step(state_b2, batch)
    assert float(mc["guard/nonfinite"]) == 0.0 and max_abs_diff(state_b3.params, params) > 5e-7


@pytest.mark.slow  # 14 s of compilation; the default suite keeps the NaN-skip test
def test_kl_stop_skips_the_rest_of_the_iteration():
    apply_fn, params = tiny_model(num_layers=1)
    batch = on_policy_batch(apply_fn, params, batch_size=8, group=4)
    upd = {"minibatch_size": 8, "shuffle": False}
    one = get_recipe("rloo", update={**upd, "num_epochs": 1})
    three = get_recipe("rloo", update={**upd, "num_epochs": 3, "kl_stop": 1e-12})
    s1, _ = make_update_step(one, apply_fn)(
        TrainState.create(copy_tree(params), one, jax.random.key(0)), batch
    )
    s3, m3 = make_update_step(three, apply_fn)(
        TrainState.create(copy_tree(params), three, jax.random.key(0)), batch
    )
    # epoch 1 is on-policy (KL 0) and applied; epoch 2 sees KL > 1e-12: it and epoch 3 skip
    np.testing.assert_allclose(float(m3["guard/kl_stopped"]), 2 / 3, rtol=1e-6)
    assert float(m3["guard/nonfinite"]) == 0.0
    assert _leaves_equal(s1.params, s3.params)
    with pytest.raises(ValueError, match="update.kl_stop=-1.0"):
        get_recipe("rloo", update={"kl_stop": -1.0})


def test_trainer_guard_counts_continues_then_stops_with_a_clear_message(tmp_path):
    lines = []
    guard = UpdateGuard(GuardSection(max_skipped_updates=3), tmp_path / "m.jsonl", lines.append)
    m = guard.check(1, {"optim/steps": 4.0, "guard/nonfinite": 0.25, "optim/grad_norm": 1.0})
    assert m["guard/skipped_updates"] == 1 and m["guard/skipped_total"] == 1
    guard.stop_if_needed()  # under the limit: training continues
    guard.check(2, {"optim/steps": 4.0, "guard/nonfinite": 0.5, "optim/grad_norm": 1.0})
    guard.stop_if_needed()  # 3 == limit: still allowed
    guard.check(3, {"optim/steps": 4.0, "guard/nonfinite": 0.25, "optim/grad_norm": 1.0})
    with pytest.raises(TrainingStopped, match=r"4 optimiser steps .*max_skipped_updates=3"):
        guard.stop_if_needed()
    assert any("iteration 3: 1 of 4 optimiser steps skipped" in x for x in lines)


def test_trainer_guard_total_survives_a_resume_and_spikes_are_reported(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with path.open("w") as f:
        for step, skipped in ((1, 2), (2, 0), (3, 1), (4, 5)):  # step 4 was undone by resume
            f.write(json.dumps({"step": step, "guard/skipped_updates": skipped,
                                "optim/grad_norm": 1.0 + step / 10, "kl/approx_old_new": 0.01})
                    + "\n")  # fmt: skip
    lines = []
    guard = UpdateGuard(
        GuardSection(max_skipped_updates=5, grad_norm_spike=5.0), path, lines.append
    )
    m = guard.check(4, {"optim/steps": 2.0, "guard/nonfinite": 0.0, "optim/grad_norm": 60.0,
                        "kl/approx_old_new": 0.011})  # fmt: skip
    assert m["guard/skipped_total"] == 3  # 2 + 0 + 1 from records before iteration 4
    assert m["guard/grad_norm_spike"] > 5 and m["guard/kl_spike"] == 0.0
    assert any("optim/grad_norm=60 is" in x for x in lines)


def test_guard_config_section_is_validated():
    assert load_config(None, ["guards.max_skipped_updates=0"]).guards.max_skipped_updates == 0
    with pytest.raises(ConfigError, match="guards.max_skipped_updates=-1"):
        load_config(None, ["guards.max_skipped_updates=-1"])
    with pytest.raises(ConfigError, match="guards.grad_norm_spikes"):
        load_config(None, ["guards.grad_norm_spikes=3"])


def test_a_nan_loss_with_a_finite_gradient_is_skipped_too():
    """A NaN can reach the loss but not the gradient (masked terms: NaN * 0 in the forward
    pass, zero in the backward pass): the step is skipped all the same."""
    import optax

    from jaxagent.rl.guards import guarded_step

    tx = optax.adam(0.1)
    params = {"w": jnp.ones(3)}
    opt = tx.init(params)
    grads = {"w": jnp.full(3, 0.5)}
    sums = {"optim/grad_norm": jnp.float32(0.87), "loss/total": jnp.float32(jnp.nan),
            "kl/approx_old_new": jnp.float32(0.0), "optim/loss_tokens": jnp.float32(3.0)}  # fmt: skip
    p1, o1, stopped, m = guarded_step(tx, grads, opt, params, sums, 0.0, jnp.zeros((), bool))
    assert float(m["guard/nonfinite"]) == 1.0 and not bool(stopped)
    assert _leaves_equal(p1, params) and _leaves_equal(o1, opt)
    sums["loss/total"] = jnp.float32(1.0)
    p2, _, _, m = guarded_step(tx, grads, opt, params, sums, 0.0, jnp.zeros((), bool))
    assert float(m["guard/nonfinite"]) == 0.0 and not _leaves_equal(p2, params)


@pytest.mark.parametrize("recipe", ["loop", "dapo"])
def test_an_update_without_loss_tokens_is_skipped_whole_and_counted(recipe):
    """A minibatch whose rows all carry no loss (dropped groups) has a zero gradient, yet an
    AdamW step on it would still move every weight (momentum, decay) and advance the
    schedule: it is skipped, params and optimiser state stay bit-identical, and counted."""
    apply_fn, params = tiny_model(num_layers=1)
    batch = on_policy_batch(apply_fn, params, batch_size=8, group=4)
    cfg = get_recipe(
        recipe,
        lora={"rank": 0},
        optim={"learning_rate": 1e-2, "weight_decay": 0.1},
        update={"minibatch_size": 4, "num_epochs": 1, "shuffle": False},
    )
    step = make_update_step(cfg, apply_fn)
    # one real step first, so the momentum is nonzero and a stale step would move the weights
    state, m = step(TrainState.create(copy_tree(params), cfg, jax.random.key(0)), batch)
    assert float(m["guard/no_tokens"]) == 0.0 and max_abs_diff(state.params, params) > 1e-4
    before_p = jax.tree.map(np.asarray, state.params)
    before_o = jax.tree.map(np.asarray, state.opt_state)
    empty = batch.replace(loss_mask=jnp.zeros_like(batch.loss_mask))
    state2, m2 = step(state, empty)
    assert float(m2["guard/no_tokens"]) == 1.0 and float(m2["guard/nonfinite"]) == 0.0
    # no loss token: the advantage range reads 0 as the mean does, not +-float32 max
    assert float(m2["adv/max"]) == 0.0 and float(m2["adv/min"]) == 0.0
    assert _leaves_equal(state2.params, before_p)
    assert _leaves_equal(jax.tree.map(np.asarray, state2.opt_state), before_o)  # count too
    # half empty: minibatch 1 (rows 4-7) has no loss token, minibatch 0 trains
    half = batch.replace(loss_mask=batch.loss_mask.at[4:].set(0.0))
    state3, m3 = step(state2, half)
    assert float(m3["guard/no_tokens"]) == 0.5
    assert max_abs_diff(state3.params, before_p) > 1e-4
    counted = UpdateGuard(GuardSection(max_skipped_updates=0), None, lambda _: None)
    counted.check(1, dict(m3, **{"optim/steps": 2.0}))
    counted.stop_if_needed()  # not a fault: the limit 0 is not exceeded
    assert counted.check(2, {k: float(v) for k, v in m3.items()})["guard/no_token_updates"] == 1
