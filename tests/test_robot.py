"""MuJoCo through jaxagent's array side: identical to Gymnasium's own v5 environments."""

import gymnasium as gym
import numpy as np
import pytest

from jaxagent.envs.base import ArrayEnv
from jaxagent.envs.robot import MujocoVectorEnv
from jaxagent.envs.robot.engines import _Chooser


class _RoundRobin:
    """A chooser that ignores timings: the next layout every ``every`` recorded cycles."""

    def __init__(self, num_layouts: int, every: int):
        self.num_layouts, self.every, self.n = num_layouts, every, 0

    def record(self, ns: int) -> int:
        self.n += 1
        return (self.n // self.every) % self.num_layouts


@pytest.mark.parametrize(
    "task, engine, steps",
    [
        ("HalfCheetah-v5", "batch", 300),
        ("HalfCheetah-v5", "batch:1", 200),
        ("HalfCheetah-v5", "batch:2", 200),
        ("HalfCheetah-v5", "threads", 300),
        ("Hopper-v5", "batch", 300),
        ("Hopper-v5", "threads", 300),
        ("Ant-v5", "threads", 150),
    ],
)
def test_matches_gymnasium_sync_vector_env(task, engine, steps):
    # Same seeds and actions -> same observations, rewards and flags, through terminations,
    # Gymnasium's next-step autoreset and (with a short TimeLimit) truncations.
    n, limit = 3, 120
    # "batch:1": one mujoco.batch Batch on MuJoCo's two C threads; "batch:2": two chunks on two
    # Python threads; "batch": all layouts, switching every 5 steps here (the state moves from
    # one to the next), which must not change a bit. The switches are forced, not timed: the
    # timing chooser's switch count depends on the machine's load (CI once saw 34 of >= 37).
    engine, _, chunks = engine.partition(":")
    kw = dict(engine=engine, chunks=int(chunks) if chunks else None)
    ours = MujocoVectorEnv(task, n, num_threads=2, max_episode_steps=limit, **kw)
    assert ours.engine_name == engine
    if engine == "batch" and not chunks:
        ours.engine.chooser = _RoundRobin(len(ours.engine.layouts), every=5)
    ref = gym.vector.SyncVectorEnv(
        [lambda: gym.make(task, max_episode_steps=limit) for _ in range(n)]
    )
    assert isinstance(ours, ArrayEnv)
    assert ours.single_action_space == ref.single_action_space
    assert ours.single_observation_space == ref.single_observation_space
    assert ours.action_space == ref.action_space
    obs, _ = ours.reset(seed=42)
    obs_ref, _ = ref.reset(seed=42)
    np.testing.assert_array_equal(obs, obs_ref)
    rng = np.random.default_rng(0)
    flags = {"terminated": 0, "truncated": 0}
    for t in range(steps):
        a = rng.uniform(-1, 1, (n, ours.act_dim)).astype(np.float32)
        o, r, term, trunc, _ = ours.step(a)
        o_ref, r_ref, term_ref, trunc_ref, _ = ref.step(a)
        # Bitwise: same MuJoCo calls per instance (warm start kept), same float formulas.
        np.testing.assert_array_equal(o, o_ref, err_msg=f"obs at step {t}")
        np.testing.assert_array_equal(r, r_ref, err_msg=f"reward at step {t}")
        np.testing.assert_array_equal(term, term_ref)
        np.testing.assert_array_equal(trunc, trunc_ref)
        flags["terminated"] += term.sum()
        flags["truncated"] += trunc.sum()
    if engine == "batch" and not chunks:
        # one switch per 5 engine steps; reset-only steps (autoresets) record no cycle
        assert steps // 10 <= ours.engine.switches <= (steps - 1) // 5
    if task != "HalfCheetah-v5":
        assert flags["terminated"] > 0  # the autoreset path was exercised
    else:
        assert flags["truncated"] == n * (steps // (limit + 1))
    ours.close()
    ref.close()


def test_bad_actions_shape_names_the_fix():
    env = MujocoVectorEnv("Hopper-v5", num_envs=2)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"expected \(num_envs, act_dim\) = \(2, 3\)"):
        env.step(np.zeros((2, 6)))
    with pytest.raises(ValueError, match="unknown MuJoCo task 'Walker'"):
        MujocoVectorEnv("Walker", num_envs=1)


@pytest.mark.parametrize("engine", ["batch", "threads"])
def test_array_pool_steps_subsets_like_independent_gymnasium_envs(engine):
    # send/recv with ragged subsets: each env's own trajectory must equal a Gymnasium env
    # stepped with the same actions (including its next-step autoreset).
    from jaxagent.pool.array_pool import ArrayEnvPool

    n = 3
    pool = ArrayEnvPool(MujocoVectorEnv("Hopper-v5", num_envs=n, engine=engine), seed=7)
    refs = [gym.make("Hopper-v5") for _ in range(n)]
    pool.async_reset()
    first = pool.recv()
    last_done = [False] * n
    for i, env in enumerate(refs):
        o, _ = env.reset(seed=7 + i)
        np.testing.assert_array_equal(first.obs[i], o)
    rng = np.random.default_rng(1)
    autoresets = 0
    for t in range(90):
        ids = [0, 2] if t % 2 == 0 else [1]
        a = rng.uniform(-1, 1, (len(ids), 3)).astype(np.float32)
        pool.send(ids, a)
        batch = pool.recv()
        np.testing.assert_array_equal(batch.env_ids, ids)
        for k, i in enumerate(ids):
            if last_done[i]:  # Gymnasium's next-step autoreset: reset obs, reward 0, no flags
                (o_ref, _), r_ref, te, tr = refs[i].reset(), 0.0, False, False
                autoresets += 1
            else:
                o_ref, r_ref, te, tr, _ = refs[i].step(a[k])
            np.testing.assert_array_equal(batch.obs[k], o_ref)
            assert batch.reward[k] == r_ref
            assert (batch.terminated[k], batch.truncated[k]) == (te, tr)
            last_done[i] = bool(te or tr)
    assert autoresets > 0
    assert pool.health["steps"] == 45 * 2 + 45
    with pytest.raises(ValueError, match=r"envs \[0\] already have an action pending"):
        pool.send([0], np.zeros((1, 3)))
        pool.send([0], np.zeros((1, 3)))


def test_rollout_engine_matches_gymnasium_over_a_short_horizon():
    # engine="rollout" zeroes the solver warm start each step (mujoco.rollout has no warm-start
    # output), so it equals Gymnasium only up to solver tolerance, which chaos amplifies over
    # ~100 steps; over 30 steps it must agree to 1e-8. Without contacts it would be exact.
    ours = MujocoVectorEnv("HalfCheetah-v5", num_envs=2, engine="rollout")
    ref = gym.vector.SyncVectorEnv([lambda: gym.make("HalfCheetah-v5") for _ in range(2)])
    np.testing.assert_array_equal(ours.reset(seed=5)[0], ref.reset(seed=5)[0])
    rng = np.random.default_rng(2)
    for t in range(30):
        a = rng.uniform(-1, 1, (2, 6)).astype(np.float32)
        o, r, *_ = ours.step(a)
        o_ref, r_ref, *_ = ref.step(a)
        np.testing.assert_allclose(o, o_ref, rtol=0, atol=1e-8, err_msg=f"step {t}")
        np.testing.assert_allclose(r, r_ref, rtol=0, atol=1e-8)
    ours.close()
    # Every env truncating at once leaves an empty batch for the next step (all autoreset).
    for engine in ("rollout", "batch"):
        short = MujocoVectorEnv("Hopper-v5", num_envs=2, engine=engine, max_episode_steps=2)
        short.reset(seed=0)
        flags = [short.step(np.zeros((2, 3)))[3].tolist() for _ in range(6)]
        assert flags == [[False, False], [True, True], [False, False]] * 2
    for engine in ("rollout", "batch"):
        with pytest.raises(ValueError, match="cfrc_ext.*use engine='threads'"):
            MujocoVectorEnv("Ant-v5", num_envs=1, engine=engine)
    with pytest.raises(ValueError, match="chunks=2 with engine='threads'"):
        MujocoVectorEnv("Hopper-v5", num_envs=1, engine="threads", chunks=2)
    with pytest.raises(ValueError, match="engine='exact'; choose one of"):
        MujocoVectorEnv("Hopper-v5", num_envs=1, engine="exact")


def test_chooser_settles_on_the_fastest_layout_and_follows_a_change_of_load():
    # Synthetic step times for three layouts: layout 1 is fastest at first, then layout 2
    # (e.g. the machine got busy). The chooser must run mostly on the fastest one and follow.
    chooser, used = _Chooser(3, window=8, period=64), []
    for fast in (1, 2):
        for _ in range(600):
            used.append(chooser.current)
            chooser.record(100 if chooser.current == fast else 300)
        assert sum(u == fast for u in used[-400:]) >= 0.8 * 400
        assert chooser.home == fast
    assert set(used) == {0, 1, 2}
    # A pause of the caller (a training update between rollouts) in every window of layout 2
    # is not a slow layout: it stays in use although the others are now as fast.
    timed_on_2 = 0
    for _ in range(400):
        if chooser.current == 2:
            timed_on_2 += 1
            chooser.record(10**9 if timed_on_2 % 8 == 5 else 100)
        else:
            chooser.record(100)
    assert chooser.home == 2


def test_without_mujoco_batch_the_default_is_threads_and_batch_names_the_fix(monkeypatch):
    import jaxagent.envs.robot.vector as vector

    monkeypatch.setattr(vector, "_has_mujoco_batch", lambda: False)
    env = MujocoVectorEnv("HalfCheetah-v5", num_envs=2)
    assert env.engine_name == "threads"
    env.close()
    with pytest.raises(ValueError, match=r"MuJoCo >= 4.0.*engine='threads'"):
        MujocoVectorEnv("HalfCheetah-v5", num_envs=2, engine="batch")
