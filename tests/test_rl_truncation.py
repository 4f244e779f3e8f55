"""Truncation reaches the learner: pack_episodes flags budget cuts, GAE bootstraps at them,
and critic-free recipes keep them (a failure with its reward) or drop them (no loss, not in
any baseline) as ``advantage.truncated`` says."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.agents.batch import pack_episodes
from jaxagent.agents.episode import Episode, Turn
from jaxagent.envs.base import Task, Termination
from jaxagent.rl.prepare import compute_advantages
from jaxagent.rl.recipes import get_recipe
from jaxagent.types import TokenBatch

GAMMA, LAM = 0.9, 0.8


def _batch(rewards, truncated, groups, values=None, boot=None):
    """Rows of 6 tokens, policy tokens at positions 2..4."""
    b, t = len(rewards), 6
    mask = np.zeros((b, t), np.float32)
    mask[:, 2:5] = 1.0
    extra = {}
    if values is not None:
        extra = dict(
            values=jnp.asarray(values, jnp.float32), bootstrap_value=jnp.asarray(boot, jnp.float32)
        )
    return TokenBatch(
        tokens=jnp.ones((b, t), jnp.int32),
        positions=jnp.broadcast_to(jnp.arange(t), (b, t)),
        segment_ids=jnp.ones((b, t), jnp.int32),
        loss_mask=jnp.asarray(mask),
        old_logprobs=jnp.zeros((b, t)),
        advantages=jnp.zeros((b, t)),
        rewards=jnp.asarray(rewards, jnp.float32),
        group_ids=jnp.asarray(groups, jnp.int32),
        turn_ids=jnp.zeros((b, t), jnp.int32),
        truncated=jnp.asarray(truncated, jnp.float32),
        **extra,
    )


def test_gae_bootstraps_at_a_truncation_and_ends_at_a_termination():
    cfg = get_recipe(
        "ppo",
        advantage={"discount": GAMMA, "gae_lambda": LAM, "whiten": False},
        kl={"mode": "none"},
    )
    v = np.zeros((2, 6), np.float32)
    v[:, 2:5] = [0.3, 0.5, 0.7]
    r, boot = 1.0, 0.6
    out = compute_advantages(cfg, _batch([r, r], [1.0, 0.0], [0, 1], v, [boot, boot]))

    def hand(next_value):  # GAE over the three policy tokens, by hand
        d4 = r + GAMMA * next_value - 0.7
        d3 = GAMMA * 0.7 - 0.5
        d2 = GAMMA * 0.5 - 0.3
        a4 = d4
        a3 = d3 + GAMMA * LAM * a4
        a2 = d2 + GAMMA * LAM * a3
        return [0, 0, a2, a3, a4, 0]

    np.testing.assert_allclose(out.advantages[0], hand(boot), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(out.advantages[1], hand(0.0), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(
        out.returns[0, 2:5], np.asarray(hand(boot))[2:5] + [0.3, 0.5, 0.7], rtol=1e-6
    )
    assert float(out.loss_mask.sum()) == 6.0  # "keep": both rows train


def test_drop_mode_gives_truncated_rows_no_loss_and_no_place_in_the_baseline():
    rewards, trunc, groups = [1.0, 0.5, 0.0], [0.0, 0.0, 1.0], [0, 0, 0]
    keep = compute_advantages(get_recipe("rloo"), _batch(rewards, trunc, groups))
    # "drop" is decided on the host (RowDrops(truncated=True) -> row_weight 0 on the cut row);
    # the learner reads the weight only.
    dropped = _batch(rewards, trunc, groups).replace(row_weight=1.0 - jnp.asarray(trunc))
    drop = compute_advantages(get_recipe("rloo", advantage={"truncated": "drop"}), dropped)
    # keep: the truncated row is a failure with reward 0 in the leave-one-out baseline.
    np.testing.assert_allclose(keep.advantages[:, 2], [1.0 - 0.25, 0.5 - 0.5, 0.0 - 0.75])
    assert float(keep.loss_mask[2].sum()) == 3.0
    # drop: no loss on it, and the others' baseline leaves it out.
    np.testing.assert_allclose(drop.advantages[:2, 2], [1.0 - 0.5, 0.5 - 1.0])
    assert float(drop.loss_mask[2].sum()) == 0.0 and float(drop.loss_mask[:2].sum()) == 6.0


def _episode(group, termination, reward=0.0):
    ep = Episode(task=Task(id="t", split="train", prompt=""), group=group)
    ep.append([1, 2], sampled=False)
    ep.append([3, 4], sampled=True, logprobs=[-0.1, -0.2], turn=0)
    ep.turns.append(Turn(action="a", observation="", reward=reward))
    ep.finish(termination)
    return ep


def test_pack_episodes_flags_budget_cuts_only():
    eps = [
        _episode(0, Termination.TRUNCATED),
        _episode(0, Termination.TERMINATED, 1.0),
        _episode(1, Termination.ENV_ERROR),
    ]
    batch = pack_episodes(eps, pad_id=0, max_len=16, length_multiple=8, rows=4)
    np.testing.assert_array_equal(batch.truncated, [1, 0, 0, 0])
    np.testing.assert_array_equal(batch.row_weight, [1, 1, 0, 0])


def test_bootstrap_value_is_the_value_after_the_last_token():
    from jaxagent.rl.prepare import split_bootstrap_values

    values_ext = jnp.asarray([[0.0, 1.0, 2.0, 3.0, 4.0], [0.0, 5.0, 6.0, 7.0, 8.0]])
    seg = jnp.asarray([[1, 1, 1, 1], [1, 1, 0, 0]])
    values, boot = split_bootstrap_values(values_ext, seg)
    np.testing.assert_array_equal(values, values_ext[:, :4])
    np.testing.assert_array_equal(boot, [4.0, 6.0])  # V(tokens[:4]), V(tokens[:2])


@pytest.mark.parametrize("mode", ["keep", "drop"])
def test_truncated_mode_is_a_typed_config_field(mode):
    from jaxagent.train.config import load_config

    rl = load_config(None, [f"rl.advantage.truncated={mode}"]).rl_config
    assert rl.advantage.truncated == mode
