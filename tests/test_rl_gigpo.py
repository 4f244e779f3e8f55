"""GiGPO: anchor-state grouping from episodes, hand-computed step- and episode-level
advantages, a slow numpy reference, and the estimator inside the jitted update."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.agents.batch import pack_episodes, turn_steps
from jaxagent.agents.episode import Episode, Turn
from jaxagent.envs.base import Task, Termination
from jaxagent.rl import advantages as A
from jaxagent.rl.prepare import apply_row_weight, compute_advantages
from jaxagent.rl.recipes import default_samples_per_task, get_recipe
from jaxagent.rl.train_state import TrainState
from jaxagent.rl.update import make_update_step

from test_rl_common import on_policy_batch, tiny_model

TOKENS_PER_TURN = 2


def episode(group, first_obs, turns, *, failed=False):
    """An episode whose turns are (observation after the action, reward); each action is
    TOKENS_PER_TURN policy tokens after a one-token prompt."""
    ep = Episode(
        task=Task(id=f"t{group}", prompt="p", split="train"),
        group=group,
        first_observation=first_obs,
    )
    ep.append([1], sampled=False)
    for k, (obs, reward) in enumerate(turns):
        ep.append([2] * TOKENS_PER_TURN, sampled=True, logprobs=[-0.5] * TOKENS_PER_TURN, turn=k)
        ep.turns.append(Turn(action="a", observation=obs, reward=reward))
    ep.finish(Termination.ENV_ERROR if failed else Termination.TERMINATED)
    return ep


def constructed_batch():
    """Task 0 (group 0): three trajectories from state s0, two of which reach state "x";
    one more trajectory of task 0 whose environment failed. Task 1 (group 1) starts in a
    state whose text equals task 0's "x": it must not join task 0's "x" group."""
    eps = [
        episode(0, "s0", [("x", 0.0), ("", 1.0)]),  # A: s0 -> x -> success
        episode(0, "s0", [("x", 0.0), ("", 0.0)]),  # B: s0 -> x -> failure
        episode(0, "s0", [("y", 0.0), ("", 0.0)]),  # C: s0 -> y -> failure
        episode(0, "s0", [("x", 0.0), ("", 5.0)], failed=True),  # F: env error, ignored
        episode(1, "x", [("", 1.0)]),  # D
        episode(1, "x", [("", 1.0)]),  # E
    ]
    batch = pack_episodes(eps, pad_id=0, max_len=16, length_multiple=8, max_turns=3)
    # the learner's view: rows that do not train (the env error) carry no loss
    return eps, apply_row_weight(batch)


def test_turn_steps_group_identical_observations_within_a_task():
    eps, _ = constructed_batch()
    rewards, anchors = turn_steps(eps, rows=7, max_turns=3)
    # Task 0: s0 -> 0, x -> 1, y -> 2 (first appearance); task 1 numbers its own states.
    np.testing.assert_array_equal(
        anchors,
        [[0, 1, -1], [0, 1, -1], [0, 2, -1], [0, 1, -1], [0, -1, -1], [0, -1, -1], [-1] * 3],
    )
    np.testing.assert_array_equal(
        rewards[:, :2], [[0, 1], [0, 0], [0, 0], [0, 5], [1, 0], [1, 0], [0, 0]]
    )
    # Turns past the budget are left out.
    assert turn_steps(eps[:1], rows=1, max_turns=1)[1].tolist() == [[0]]


def test_pack_episodes_fills_turn_data_only_when_asked():
    eps, batch = constructed_batch()
    assert batch.turn_rewards.shape == batch.anchor_ids.shape == (6, 3)
    plain = pack_episodes(eps, pad_id=0, max_len=16, length_multiple=8)
    assert plain.turn_rewards is None and plain.anchor_ids is None


def test_gigpo_hand_computed():
    _, batch = constructed_batch()
    adv = A.gigpo_advantages(
        batch.rewards,
        batch.group_ids,
        batch.turn_rewards,
        batch.anchor_ids,
        batch.turn_ids,
        batch.loss_mask,
        std_mode="none",
        discount=0.5,
        step_weight=1.0,
    )
    # Episode level (mean only), task 0 without the failed row: rewards 1, 0, 0, mean 1/3
    #   -> A 2/3, B -1/3, C -1/3; task 1: 1, 1 -> 0, 0.
    # Step returns (gamma 0.5): A (0.5, 1), B (0, 0), C (0, 0); D 1, E 1.
    # Anchor groups of task 0: s0 {A 0.5, B 0, C 0} mean 1/6 -> +1/3, -1/6, -1/6;
    #   x {A 1, B 0} mean 1/2 -> +1/2, -1/2; y {C} alone -> 0. Task 1: x {D 1, E 1} -> 0, 0
    #   (joined with task 0's x, the x mean would be 3/4 instead).
    per_turn = {
        0: [2 / 3 + 1 / 3, 2 / 3 + 1 / 2],
        1: [-1 / 3 - 1 / 6, -1 / 3 - 1 / 2],
        2: [-1 / 3 - 1 / 6, -1 / 3 + 0.0],
        3: [0.0, 0.0],  # env error: no loss, no advantage
        4: [0.0],
        5: [0.0],
    }
    adv = np.asarray(adv)
    for row, values in per_turn.items():
        expected = np.repeat(values, TOKENS_PER_TURN)
        np.testing.assert_allclose(adv[row, 1 : 1 + len(expected)], expected, atol=1e-6)
    assert np.all(adv[:, 0] == 0)  # the prompt token
    # Without the step term GiGPO is GRPO's episode advantage on every token.
    episode_only = A.gigpo_advantages(
        batch.rewards,
        batch.group_ids,
        batch.turn_rewards,
        batch.anchor_ids,
        batch.turn_ids,
        batch.loss_mask,
        std_mode="population",
        step_weight=0.0,
    )
    grpo = A.group_normalized_advantages(
        batch.rewards, batch.group_ids, "population", 1e-6, batch.loss_mask.sum(1) > 0
    )
    np.testing.assert_allclose(episode_only, grpo[:, None] * batch.loss_mask, atol=1e-6)


def gigpo_reference(rewards, groups, turn_rewards, anchors, turn_ids, mask, mode, eps, gamma, w):
    """Slow loops over rows, turns and group members."""
    b, m = anchors.shape
    row_valid = mask.sum(1) > 0

    def norm(x, members):
        vals = np.array(members)
        if mode == "none":
            return x - vals.mean()
        std = vals.std(ddof=0 if mode == "population" else (1 if len(vals) > 1 else 0))
        return (x - vals.mean()) / (std + eps)

    returns = np.zeros((b, m))
    for i in range(b):
        running = 0.0
        for k in reversed(range(m)):
            if anchors[i, k] >= 0:
                running = turn_rewards[i, k] + gamma * running
                returns[i, k] = running
    out = np.zeros(mask.shape)
    for i in range(b):
        if not row_valid[i]:
            continue
        ep = norm(
            rewards[i], [rewards[j] for j in range(b) if groups[j] == groups[i] and row_valid[j]]
        )
        for t in range(mask.shape[1]):
            if not mask[i, t]:
                continue
            k, step = turn_ids[i, t], 0.0
            if 0 <= k < m and anchors[i, k] >= 0:
                members = [
                    returns[j, q]
                    for j in range(b)
                    for q in range(m)
                    if row_valid[j] and groups[j] == groups[i] and anchors[j, q] == anchors[i, k]
                ]
                step = norm(returns[i, k], members)
            out[i, t] = ep + w * step
    return out


@pytest.mark.parametrize("mode", ["population", "sample", "none"])
def test_gigpo_matches_numpy_with_ragged_turns(mode):
    rng = np.random.default_rng(7)
    b, m, tokens = 12, 4, 3
    t = 1 + m * tokens
    groups = np.repeat(np.arange(3), 4)
    n_turns = rng.integers(1, m + 1, size=b)
    anchors = np.where(np.arange(m)[None, :] < n_turns[:, None], rng.integers(0, 3, (b, m)), -1)
    turn_rewards = np.where(anchors >= 0, rng.normal(size=(b, m)), 0.0)
    rewards = turn_rewards.sum(1)
    turn_ids = np.full((b, t), -1)
    mask = np.zeros((b, t))
    for i in range(b):
        for k in range(n_turns[i]):
            turn_ids[i, 1 + k * tokens : 1 + (k + 1) * tokens] = k
            mask[i, 1 + k * tokens : 1 + (k + 1) * tokens] = 1
    mask[5] = 0  # a row without loss (env error) takes no part
    fn = jax.jit(A.gigpo_advantages, static_argnames=("std_mode",))
    out = fn(
        rewards,
        groups,
        turn_rewards,
        anchors,
        turn_ids,
        mask,
        std_mode=mode,
        eps=1e-6,
        discount=0.9,
        step_weight=0.7,
    )
    ref = gigpo_reference(
        rewards, groups, turn_rewards, anchors, turn_ids, mask, mode, 1e-6, 0.9, 0.7
    )
    np.testing.assert_allclose(out, ref, atol=1e-4, rtol=1e-5)


def test_recipe_and_compute_advantages():
    cfg = get_recipe("gigpo")
    assert cfg.needs_turns and not get_recipe("grpo").needs_turns
    assert default_samples_per_task("gigpo") == 8
    assert (cfg.advantage.discount, cfg.advantage.step_weight, cfg.kl.beta) == (0.95, 1.0, 0.01)
    eps, batch = constructed_batch()
    out = compute_advantages(cfg, jax.tree.map(jnp.asarray, batch))
    direct = A.gigpo_advantages(
        batch.rewards,
        batch.group_ids,
        batch.turn_rewards,
        batch.anchor_ids,
        batch.turn_ids,
        batch.loss_mask,
        std_mode="population",
        discount=0.95,
    )
    np.testing.assert_allclose(out.advantages, direct, atol=1e-6)
    plain = pack_episodes(eps, pad_id=0, max_len=16, length_multiple=8)
    with pytest.raises(ValueError, match="max_turns"):
        compute_advantages(cfg, plain)


def test_gigpo_update_step_runs_and_differs_from_grpo():
    """The [B, M] turn arrays go through shuffling and minibatching; the step term changes
    the policy gradient (the same batch under GRPO gives another loss)."""
    apply_fn, params = tiny_model(num_layers=1)
    batch = on_policy_batch(apply_fn, params, batch_size=8, group=4)
    b, t = batch.tokens.shape
    rng = np.random.default_rng(0)
    # two turns a row: the completion's first and second halves, from one of two states
    completion = np.asarray(batch.loss_mask) > 0
    first_col = completion.argmax(1)
    turn_ids = np.where(
        completion, (np.arange(t)[None, :] >= first_col[:, None] + 3).astype(int), -1
    )
    anchors = np.stack([np.zeros(b, int), rng.integers(0, 2, b)], axis=1)
    turn_rewards = np.stack([np.zeros(b), np.asarray(batch.rewards)], axis=1)
    batch = batch.replace(
        turn_ids=jnp.asarray(turn_ids, jnp.int32),
        anchor_ids=jnp.asarray(anchors, jnp.int32),
        turn_rewards=jnp.asarray(turn_rewards, jnp.float32),
    )
    losses = {}
    for name, estimator in (("gigpo", "gigpo"), ("grpo", "group_normalized")):
        cfg = get_recipe(
            "gigpo",
            advantage={"estimator": estimator},
            kl={"mode": "none"},
            update={"minibatch_size": 4, "num_epochs": 2},
        )
        state = TrainState.create(params, cfg, jax.random.key(0))
        _, m = make_update_step(cfg, apply_fn)(state, batch)
        assert np.isfinite(m["loss/total"]) and m["optim/steps"] == 4
        losses[name] = float(m["loss/policy"])
        _, params = tiny_model(num_layers=1)  # the step donated the state
    assert abs(losses["gigpo"] - losses["grpo"]) > 1e-4
