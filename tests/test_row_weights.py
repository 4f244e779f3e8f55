"""Which learner rows train is decided once, on the host (``jaxagent.agents.batch.row_weights``
-> ``TokenBatch.row_weight``), and the learner only reads the weight: a weight-0 row has no
loss and no place in any group baseline."""

import jax
import numpy as np
import pytest

from jaxagent.agents.batch import RowDrops, pack_episodes, row_weights
from jaxagent.agents.episode import Episode, Turn
from jaxagent.envs.base import Task, Termination
from jaxagent.rl.prepare import compute_advantages
from jaxagent.rl.recipes import get_recipe

OK, TRUNC, ERR = Termination.TERMINATED, Termination.TRUNCATED, Termination.ENV_ERROR


def _ep(group, reward, termination=OK, hit_limit=False):
    ep = Episode(task=Task(id=f"t{group}", split="train", prompt=""), group=group)
    ep.append([1, 2], sampled=False)
    ep.append([3, 3], sampled=True, logprobs=[-0.5, -0.5], turn=0)
    ep.turns.append(Turn(action="a", observation="", reward=reward, hit_token_limit=hit_limit))
    ep.finish(termination)
    return ep


# (case, episodes as (group, reward, termination, hit_token_limit), drops, expected weights)
CASES = [
    ("env_error", [(0, 1, OK, 0), (0, 0, ERR, 0)], RowDrops(), [1, 0]),
    ("env_error under every rule", [(0, 1, OK, 0), (0, 0, ERR, 0), (0, 0, OK, 0)],
     RowDrops(True, True, True), [1, 0, 1]),
    ("truncated, keep", [(0, 1, OK, 0), (0, 0, TRUNC, 0)], RowDrops(), [1, 1]),
    ("truncated, drop", [(0, 1, OK, 0), (0, 0, TRUNC, 0)], RowDrops(truncated=True), [1, 0]),
    ("overlong: cut by a budget or at max_new_tokens",
     [(0, 1, OK, 0), (0, 0, TRUNC, 0), (0, 0, OK, 1)], RowDrops(overlong=True), [1, 0, 0]),
    ("overlong off", [(0, 1, OK, 0), (0, 0, OK, 1)], RowDrops(), [1, 1]),
    ("all-equal group under dynamic sampling",
     [(0, 1, OK, 0), (0, 1, OK, 0), (1, 0, OK, 0), (1, 1, OK, 0)],
     RowDrops(uninformative_groups=True), [0, 0, 1, 1]),
    ("a failed env is no reward spread",
     [(0, 1, OK, 0), (0, 0, ERR, 0)], RowDrops(uninformative_groups=True), [0, 0]),
    ("all-equal group without dynamic sampling",
     [(0, 1, OK, 0), (0, 1, OK, 0)], RowDrops(), [1, 1]),
]  # fmt: skip


@pytest.mark.parametrize("case,spec,drops,expected", CASES, ids=[c[0] for c in CASES])
def test_row_weight_table(case, spec, drops, expected):
    eps = [_ep(g, r, t, bool(h)) for g, r, t, h in spec]
    np.testing.assert_array_equal(row_weights(eps, drops), expected)
    # The packer writes the same column, and its padding rows never train.
    batch = pack_episodes(eps, pad_id=0, max_len=16, length_multiple=8, rows=len(eps) + 2)
    assert batch.row_weight.tolist() == [float(w) for w in row_weights(eps)] + [0.0, 0.0]
    dropped = pack_episodes(eps, pad_id=0, max_len=16, length_multiple=8, drops=drops)
    np.testing.assert_array_equal(dropped.row_weight, expected)


def test_the_learner_reads_the_weight_only():
    # Four rows of one group, rewards 1, 0, 0.5, 1; row 3 weighted out on the host. Leave-one-
    # out over the three others: 1 - 0.25, 0 - 0.75, 0.5 - 0.5; row 3: no loss, no advantage.
    eps = [_ep(0, r) for r in (1.0, 0.0, 0.5, 1.0)]
    batch = pack_episodes(eps, pad_id=0, max_len=16, length_multiple=8)
    batch = batch.replace(row_weight=np.asarray([1, 1, 1, 0], np.float32))
    out = compute_advantages(get_recipe("rloo"), jax.tree.map(np.asarray, batch))
    np.testing.assert_allclose(np.asarray(out.advantages)[:, 2], [0.75, -0.75, 0.0, 0.0])
    np.testing.assert_array_equal(np.asarray(out.loss_mask).sum(axis=1), [2, 2, 2, 0])
    # "drop" in the recipe alone changes nothing on the device: the host's weight decides.
    trunc = pack_episodes([_ep(0, 1.0), _ep(0, 0.0, TRUNC)], pad_id=0, max_len=16)
    out = compute_advantages(
        get_recipe("rloo", advantage={"truncated": "drop"}), jax.tree.map(np.asarray, trunc)
    )
    np.testing.assert_array_equal(np.asarray(out.loss_mask).sum(axis=1), [2, 2])


def test_dense_packing_leaves_weight_0_episodes_out():
    eps = [_ep(0, 1.0), _ep(0, 0.0, ERR), _ep(1, 1.0)]
    batch = pack_episodes(eps, pad_id=0, max_len=12, dense=True)
    # two healthy 4-token episodes share one row of 12; the failed one is not packed
    assert batch.tokens.shape == (1, 12)
    np.testing.assert_array_equal(batch.segment_ids[0], [1] * 4 + [2] * 4 + [0] * 4)
    np.testing.assert_array_equal(batch.row_weight, [1.0])


def _long(n):
    ep = Episode(task=Task(id=f"t{n}", split="train", prompt=""), group=0)
    ep.append([1] * (n - 2), sampled=False)
    ep.append([3, 3], sampled=True, logprobs=[-0.5, -0.5], turn=0)
    ep.turns.append(Turn(action="a", observation="", reward=1.0))
    ep.finish(OK)
    return ep


def test_pow2_length_buckets_bound_the_compiled_widths():
    # every batch width a run can produce, by the longest episode's length: steps of 32 give
    # one compiled update per 32 tokens, powers of two log2(max_len / 32) + 1 of them
    max_len = 4096

    def widths(pow2):
        return {
            pack_episodes(
                [_long(n)], pad_id=0, max_len=max_len, length_multiple=32, length_pow2=pow2
            ).tokens.shape[1]
            for n in range(3, max_len + 1, 7)
        }

    steps, pow2 = widths(False), widths(True)
    assert len(steps) == max_len // 32 and len(pow2) == 8  # 32, 64, ..., 4096
    assert sorted(pow2) == [32 << i for i in range(8)]
    batch = pack_episodes([_long(300)], pad_id=0, max_len=max_len, length_pow2=True)
    assert batch.tokens.shape[1] == 512 and int(batch.segment_ids.sum()) == 300  # < 2x padding
    from jaxagent.errors import ConfigError
    from jaxagent.train.config import load_config

    with pytest.raises(ConfigError, match=r"rl.data.length_buckets='log'"):
        load_config(None, ["rl.data.length_buckets=log"])
