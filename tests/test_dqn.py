"""DQN (learners/dqn_dialogue/dqn.py): double-DQN targets by hand, the replay ring, the schedule, a
learning curve that rises on a tiny chain, and the dialogue trainer's config errors."""

from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from jaxagent.learners.dqn_dialogue import dqn  # noqa: E402

CONFIG = str(Path(__file__).resolve().parent.parent / "configs/dqn_dialogue.yaml")


def test_double_and_vanilla_targets_by_hand():
    # Next-state Q: online prefers action 0, target rates action 0 at 1.0 and action 1 at 3.0.
    online = jnp.array([[5.0, 2.0], [0.0, 1.0]])
    target = jnp.array([[1.0, 3.0], [4.0, 2.0]])
    reward, term = jnp.array([1.0, 0.5]), jnp.array([0.0, 1.0])
    double = dqn.td_targets(dqn.DQNConfig(gamma=0.5, double=True), online, target, reward, term)
    vanilla = dqn.td_targets(dqn.DQNConfig(gamma=0.5, double=False), online, target, reward, term)
    # double: 1 + 0.5 * target[0, argmax online = 0] = 1.5; the terminal row is its reward.
    np.testing.assert_allclose(double, [1.5, 0.5])
    # vanilla: 1 + 0.5 * max target = 1 + 1.5 = 2.5.
    np.testing.assert_allclose(vanilla, [2.5, 0.5])


def test_replay_ring_wraps_and_samples_only_filled_entries():
    buf = dqn.buffer_init(4, 2)
    for start in (0, 3):
        obs = np.arange(start, start + 3, dtype=np.float32)[:, None].repeat(2, 1)
        buf = dqn.buffer_add(buf, obs, np.arange(3), np.ones(3), obs, np.zeros(3))
    assert int(buf.size) == 4 and int(buf.pos) == 2
    np.testing.assert_array_equal(np.asarray(buf.obs[:, 0]), [4, 5, 2, 3])  # 0, 1 overwritten
    small = dqn.buffer_add(dqn.buffer_init(8, 2), obs, np.arange(3), np.ones(3), obs, np.zeros(3))
    batch = dqn.buffer_sample(small, jax.random.PRNGKey(0), 64)
    assert set(np.asarray(batch["obs"][:, 0]).tolist()) <= {3.0, 4.0, 5.0}


def test_epsilon_schedule_is_linear_then_flat():
    cfg = dqn.DQNConfig(eps_start=1.0, eps_end=0.1, eps_decay_steps=100)
    np.testing.assert_allclose([dqn.epsilon(s, cfg) for s in (0, 50, 100, 500)],
                               [1.0, 0.55, 0.1, 0.1], rtol=1e-6)  # fmt: skip


def test_dqn_learns_a_chain_curve_rises():
    # A 6-state chain, all of it in one jitted scan (the DQN pieces are pure): action 1 moves
    # right, 0 left; +1 on reaching the end (terminal), -0.05 a step, 12 steps at most.
    length, n, iters = 6, 8, 200
    cfg = dqn.DQNConfig(hidden=(32,), learning_rate=3e-3, gamma=0.9, batch_size=32,
                        buffer_size=4000, target_every=50, eps_decay_steps=1200)  # fmt: skip
    select, update = dqn.make_select_fn(cfg, 2), dqn.make_update_fn(cfg, 2)
    eye = jnp.eye(length)

    def greedy_return(params):
        def body(carry, _):
            pos, total, done = carry
            a = select(params, eye[pos][None], jax.random.PRNGKey(0), 0.0)[0]
            new = jnp.maximum(0, pos + jnp.where(a == 1, 1, -1))
            total = total + jnp.where(done, 0.0, -0.05 + jnp.where(new == length - 1, 1.0, 0.0))
            return (jnp.where(done, pos, new), total, done | (new == length - 1)), None

        return jax.lax.scan(body, (0, 0.0, False), None, length=12)[0][1]

    def body(carry, it):
        state, buf, pos, t, key = carry
        key, k1, k2 = jax.random.split(key, 3)
        eps = jnp.clip(1.0 - it * n / cfg.eps_decay_steps, cfg.eps_end, 1.0)
        acts = select(state.params, eye[pos], k1, eps)
        new = jnp.maximum(0, pos + jnp.where(acts == 1, 1, -1))
        done = new == length - 1
        buf = dqn.buffer_add(buf, eye[pos], acts, jnp.where(done, 0.95, -0.05), eye[new], done)
        t = t + 1
        reset = done | (t >= 12)
        state = jax.lax.cond(
            it >= 10, lambda s: update(s, dqn.buffer_sample(buf, k2, cfg.batch_size))[0],
            lambda s: s, state,
        )  # fmt: skip
        ret = jax.lax.cond(it % 50 == 49, greedy_return, lambda p: jnp.nan, state.params)
        return (state, buf, jnp.where(reset, 0, new), jnp.where(reset, 0, t), key), ret

    state = dqn.init_dqn(cfg, length, 2, jax.random.PRNGKey(0))
    carry = (state, dqn.buffer_init(cfg.buffer_size, length), jnp.zeros(n, jnp.int32),
             jnp.zeros(n, jnp.int32), jax.random.PRNGKey(1))  # fmt: skip
    _, rets = jax.jit(lambda c: jax.lax.scan(body, c, jnp.arange(iters)))(carry)
    curve = [float(greedy_return(state.params))] + [float(r) for r in rets if not np.isnan(r)]
    # Before training the greedy policy never reaches the end (-0.6); after, it walks straight
    # there: 5 steps, 1 - 5 * 0.05 = 0.75.
    assert curve[0] < 0 and curve[-1] == pytest.approx(0.75), curve


@pytest.mark.parametrize(
    "override, needle",
    [
        ("dqn.gama=0.9", "dqn.gama"),
        ("dqn.gamma=2", "gamma"),
        ("train.num_envs=0", "train.num_envs=0"),
        ("env.options.patiense=3", "did you mean env.options.patience"),
        ("learner=ppo", "this trainer is 'dqn_dialogue'"),
    ],
)
def test_dqn_dialogue_config_errors_name_the_key(override, needle):
    from jaxagent.errors import ConfigError
    from jaxagent.learners.dqn_dialogue.train import load_dqn_config

    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(".", r"\.")):
        load_dqn_config(CONFIG, [override])


def test_dqn_dialogue_config_runs_shrunken_and_writes_its_outputs(tmp_path):
    import json

    from jaxagent.learners.registry import learner_of, run_learner

    assert learner_of(CONFIG) == "dqn_dialogue"
    summary = run_learner(
        "dqn_dialogue",
        CONFIG,
        [
            "train.total_steps=64",
            "train.num_envs=8",
            "train.learning_starts=16",
            "train.num_seeds=2",
            "train.eval_every=32",
            "train.eval_goals=4",
            "env.options.num_train=20",
            "env.options.num_test=6",
            "dqn.hidden=[16]",
            "dqn.batch_size=8",
            "dqn.buffer_size=128",
            f"train.out_dir={tmp_path}/run",
        ],
    )
    keys = {"dqn_return", "rule_return", "dqn_success", "rule_success", "wall_s"}
    assert keys <= set(summary) and summary["held_out_goals"] == 6
    lo, hi = summary["dqn_return_ci95"]
    assert lo <= summary["dqn_return"] <= hi and summary["seeds"] == [0, 1]
    assert summary["rule_success"] == 1.0  # the rule policy on these 6 held-out goals
    assert (tmp_path / "run" / "curve.png").stat().st_size > 1000
    assert json.loads((tmp_path / "run" / "summary.json").read_text()) == summary
