"""Reward ladder: process rewards guide, task rewards gate."""

import itertools

import numpy as np
import pytest

from jaxagent.envs.rewards import (
    RewardMix,
    episode_reward,
    process_score,
    reward_terms,
    step_rewards,
)


def test_process_score_is_a_ladder():
    assert process_score(False, True, True) == 0.0  # nothing counts above a broken rung
    assert process_score(True, False, True) == pytest.approx(1 / 3)
    assert process_score(True, True, False) == pytest.approx(2 / 3)
    assert process_score(True, True, True) == 1.0


def test_hand_computed_mixes():
    steps = [reward_terms(process=1 / 3), reward_terms(process=1.0, outcome=1.0, task=0.0)]
    # mean process = 2/3; shaping = 0.3 * 2/3 + 0.2 * 1 = 0.4
    none = RewardMix(process_weight=0.3, outcome_weight=0.2, gate="none")
    assert episode_reward(steps, none) == pytest.approx(0.4)
    capped = RewardMix(process_weight=0.3, outcome_weight=0.2, gate="cap", cap=0.25)
    assert episode_reward(steps, capped) == pytest.approx(0.25)  # min(0.4, 0.25 * 1.0)
    won = steps[:-1] + [reward_terms(process=1.0, outcome=1.0, task=1.0)]
    assert episode_reward(won, capped) == pytest.approx(1.25)
    task_gate = RewardMix(process_weight=0.3, outcome_weight=0.2, gate="task", cap=0.5)
    assert episode_reward(won, task_gate) == 1.0  # success pays exactly the task reward
    assert episode_reward(steps, task_gate) == pytest.approx(0.4)  # failure gets guidance


@pytest.mark.parametrize("gate", ["cap", "task"])
def test_gate_keeps_every_success_above_every_failure(gate):
    # Idle behaviour (perfect calls, no task success) must never beat a sloppy success.
    mix = RewardMix(process_weight=5.0, outcome_weight=5.0, gate=gate, cap=0.9)
    rng = np.random.default_rng(0)
    eps = []
    for _ in range(200):
        n = rng.integers(1, 6)
        terms = [reward_terms(process=rng.choice([0, 1 / 3, 2 / 3, 1])) for _ in range(n)]
        terms[-1] = reward_terms(terms[-1]["process"], rng.random(), float(rng.random() < 0.5))
        eps.append((terms[-1]["task"], episode_reward(terms, mix)))
    wins = [r for t, r in eps if t > 0]
    losses = [r for t, r in eps if t == 0]
    assert wins and losses and min(wins) > max(losses)
    # ...whereas without a gate these weights let idle episodes win.
    ungated = RewardMix(process_weight=5.0, outcome_weight=5.0, gate="none")
    idle = [reward_terms(1.0, 1.0, 0.0)] * 3
    sloppy_win = [reward_terms(0.0, 0.0, 1.0)]
    assert episode_reward(idle, ungated) > episode_reward(sloppy_win, ungated)


@pytest.mark.parametrize("gate", ["none", "cap", "task"])
def test_step_rewards_sum_to_episode_reward(gate):
    mix = RewardMix(gate=gate)
    for n, task in itertools.product([1, 2, 5], [0.0, 1.0]):
        terms = [reward_terms(process=(i % 4) / 3) for i in range(n)]
        terms[-1]["task"] = task
        dense = step_rewards(terms, mix)
        assert dense.shape == (n,) and dense.dtype == np.float32
        np.testing.assert_allclose(dense.sum(), episode_reward(terms, mix), rtol=1e-6)


def test_mix_errors_name_the_field():
    with pytest.raises(ValueError, match="RewardMix.gate='soft'"):
        RewardMix(gate="soft")
    with pytest.raises(ValueError, match="RewardMix.cap=1.0"):
        RewardMix(gate="cap", cap=1.0)
