"""DAPO's data side (arXiv 2503.14476): dynamic sampling, over-long filtering and the soft
over-long punishment, as plain functions over episodes (``jaxagent.train.dapo``)."""

import numpy as np
import pytest

from jaxagent.agents.batch import RowDrops, pack_episodes
from jaxagent.agents.episode import Episode, Turn
from jaxagent.envs.base import Task, Termination
from jaxagent.rl.prepare import compute_advantages
from jaxagent.rl.recipes import get_recipe
from jaxagent.train import dapo
from jaxagent.train.config import load_config
from jaxagent.train.rl_section import RLDataSection


def _ep(group, reward, termination=Termination.TERMINATED, n_tokens=2, hit_limit=False):
    ep = Episode(task=Task(id=f"t{group}", split="train", prompt=""), group=group)
    ep.append([1, 2], sampled=False)
    ep.append([3] * n_tokens, sampled=True, logprobs=[-0.5] * n_tokens, turn=0)
    ep.turns.append(Turn(action="a", observation="", reward=reward, hit_token_limit=hit_limit))
    ep.finish(termination)
    return ep


def _round(rewards_by_group, offset):
    return [_ep(offset + g, r) for g, rs in enumerate(rewards_by_group) for r in rs]


def test_informative_groups_drop_equal_rewards_and_ignore_env_failures():
    eps = _round([[1, 1], [0, 1], [0, 0]], 0)
    eps.append(_ep(9, 1.0))
    eps.append(_ep(9, 0.0, Termination.ENV_ERROR))  # a failed env is not a spread
    kept = dapo.informative_groups(eps)
    assert [g[0].group for g in kept] == [1]


def test_dynamic_sampling_refills_the_batch_and_respects_the_cap():
    # Round r returns 4 groups of which only group (r % 4) has a reward spread.
    calls = []

    def collect(r):
        calls.append(r)
        groups = [[1, 1]] * 4
        groups[r % 4] = [0, 1]
        groups = list(groups)
        return _round(groups, 10 * r), f"stats{r}"

    out = dapo.dynamic_sample(collect, target_groups=3, max_rounds=10)
    assert calls == [0, 1, 2] and out.rounds == 3  # refilled until 3 groups were kept
    assert out.kept_groups == 3 and len(out.episodes) == 6
    assert {ep.group for ep in out.episodes} == {0, 11, 22}
    assert all(len({e.reward for e in out.episodes if e.group == g}) == 2 for g in (0, 11, 22))
    assert len(out.first_round) == 8 and out.stats == ["stats0", "stats1", "stats2"]
    assert out.sampled_groups == 12

    calls.clear()
    capped = dapo.dynamic_sample(collect, target_groups=3, max_rounds=2)
    assert calls == [0, 1] and capped.rounds == 2 and capped.kept_groups == 2  # the cap holds

    # More informative groups than needed: the first target_groups are kept.
    many = dapo.dynamic_sample(lambda r: (_round([[0, 1]] * 5, 0), None), 3, 4)
    assert many.rounds == 1 and many.kept_groups == 3


def test_refill_tasks_are_deterministic_fresh_draws():
    tasks = list(range(100))
    a = dapo.refill_tasks(tasks, 8, seed=0, iteration=3, round_=1)
    assert a == dapo.refill_tasks(tasks, 8, seed=0, iteration=3, round_=1)  # exact resume
    assert a != dapo.refill_tasks(tasks, 8, seed=0, iteration=3, round_=2)
    assert len(set(a)) == 8


@pytest.mark.parametrize(
    "length, expected",
    [
        (0, 0.0),
        (400, 0.0),
        (410, 0.0),  # up to L_max - L_cache = 410: no penalty
        (461, -0.5),  # (410 - 461) / 102
        (512, -1.0),  # L_max: the linear part reaches -1
        (513, -1.0),
        (2000, -1.0),  # beyond L_max
    ],
)
def test_soft_overlong_penalty_is_the_papers_formula(length, expected):
    assert dapo.overlong_penalty(length, max_len=512, cache_len=102) == pytest.approx(expected)
    # The paper's own values: L_max 20480, L_cache 4096, so the penalty starts at 16384.
    assert dapo.overlong_penalty(16384, 20480, 4096) == 0.0
    assert dapo.overlong_penalty(18432, 20480, 4096) == pytest.approx(-0.5)


def test_overlong_filter_gives_truncated_and_cut_episodes_no_loss():
    eps = [
        _ep(0, 1.0),
        _ep(0, 0.0, Termination.TRUNCATED),
        _ep(0, 0.0, hit_limit=True),
        _ep(0, 0.5),
    ]
    batch = pack_episodes(
        eps, pad_id=0, max_len=16, length_multiple=8, drops=RowDrops(overlong=True)
    )
    data = RLDataSection(
        overlong_filter=True, overlong_penalty=1.0, overlong_max_len=3, overlong_cache_len=2
    )
    shaped, m = dapo.shape_batch(batch, eps, data, default_max_len=100)
    np.testing.assert_array_equal(shaped.row_weight, [1, 0, 0, 1])
    assert m["data/overlong_frac"] == 0.5
    # 2 policy tokens with L_max 3, L_cache 2: (1 - 2) / 2 = -0.5 on every reward.
    np.testing.assert_allclose(shaped.rewards, np.asarray([1.0, 0.0, 0.0, 0.5]) - 0.5)
    # Through the learner: no loss on the filtered rows, and they are out of the baseline.
    import jax

    out = compute_advantages(get_recipe("dapo"), jax.tree.map(np.asarray, shaped))
    assert float(np.asarray(out.loss_mask)[1:3].sum()) == 0.0
    np.testing.assert_allclose(np.asarray(out.advantages)[[0, 3], 2], [1.0, -1.0], rtol=1e-5)


def test_dapo_config_sets_the_papers_data_side():
    from pathlib import Path

    d = load_config(Path(__file__).parent.parent / "configs/dapo_code.yaml").rl.data
    assert d.dynamic_sampling and d.overlong_filter and d.overlong_penalty == 1.0
    assert d.overlong_max_len == 512 and d.overlong_cache_len == 102
    off = load_config(None).rl.data  # off unless asked for
    assert not (off.dynamic_sampling or off.overlong_filter or off.overlong_penalty)
