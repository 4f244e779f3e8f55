"""MiniWoB++ in the real headless browser (CI smoke): solvers succeed, the shared action
vocabulary and its errors, a killed browser is an env_error and is restarted, screenshots."""

import os
import shutil
import signal

import numpy as np
import pytest

from jaxagent.envs.base import Task
from jaxagent.envs.base import run_episode

pytestmark = pytest.mark.skipif(
    shutil.which(os.environ.get("MINIWOB_CHROME_BINARY", "/usr/bin/chromium")) is None
    or pytest.importorskip("miniwob") is None,
    reason="MiniWoB++ needs chromium and chromedriver (apt-get install chromium chromium-driver)",
)

SMOKE_TASKS = ("click-button", "click-checkboxes", "enter-text", "use-autocomplete")


def _task(name, seed):
    return Task(f"miniwob-{name}-{seed}", "test", name, {"task": name, "seed": seed})


@pytest.fixture(scope="module")
def env():
    from jaxagent.envs.web.miniwob import MiniWoBEnv

    e = MiniWoBEnv(max_ms=60_000)  # a loaded CI machine must not hit MiniWoB's 10 s clock
    yield e
    e.close()


def test_solvers_succeed_in_the_real_browser(env):
    from jaxagent.envs.web.miniwob_solvers import MiniWoBSolver

    for name in SMOKE_TASKS:
        for seed in (1_000_000, 1_000_001):
            obs, acts, last = run_episode(
                env, _task(name, seed), MiniWoBSolver(_task(name, seed)).act
            )
            assert last.info["success"] and last.reward > 0, (name, seed, obs, acts, last.info)
            assert obs[0].startswith("task : ") and "[1] " in obs[0]


def test_same_action_vocabulary_and_readable_errors(env):
    obs = env.reset(_task("click-button", 3))
    assert "button" in obs
    for action, needle in [
        ("click ( 99 )", "no element 99 on this page"),
        ("back ( )", "no page to go back to"),
        ('search ( " ok " )', "no search box in view"),
        ('type ( 1 , "x" )', "only a textbox takes type"),
        ("jump ( 1 )", "unknown action"),
    ]:
        r = env.step(action)
        assert needle in r.observation and r.info["failure_detail"] == "refused_action", action
        assert not r.done
    # pressing the wrong button ends the episode with MiniWoB's own negative reward
    env.reset(_task("click-test-2", 3))
    r = env.step("click ( 2 )")  # button TWO, asked ONE
    assert r.done and not r.info["success"] and r.info["miniwob_raw_reward"] < 0
    assert r.info["failure_mode"] == "wrong_state" and r.reward < 0


def test_a_killed_browser_is_an_env_error_and_is_restarted(env):
    from jaxagent.envs.web.miniwob_solvers import MiniWoBSolver

    task = _task("enter-text", 7)
    env.reset(task)
    pids = env.browser.pids()
    assert len(pids) >= 2  # chromedriver and its browser
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    r = env.step('type ( 1 , "x" )')
    assert r.done and r.info["termination"] == "env_error" and r.info["failure_mode"] == "env_error"
    assert not r.info["success"]
    # the next episode runs on a fresh browser
    restarts = env.restarts
    obs, acts, last = run_episode(env, task, MiniWoBSolver(task).act)
    assert last.info["success"] and env.restarts == restarts
    assert set(env.browser.pids()).isdisjoint(pids)


def test_a_crashed_browser_through_the_pool_is_labelled_not_dropped():
    import psutil

    from jaxagent.envs.web.miniwob import MiniWoBEnvConfig, MiniWoBFactory
    from jaxagent.pool import EnvPool, PoolConfig

    config = PoolConfig(num_envs=1, backend="thread", step_timeout_s=30, reset_timeout_s=60)
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    with EnvPool(MiniWoBFactory(MiniWoBEnvConfig(max_ms=60_000)), config) as pool:
        pool.async_reset([0], [_task("click-button", 5)])
        (r,) = pool.recv(min_batch=1, timeout=120)
        assert r.kind == "reset" and not r.done
        for p in me.children(recursive=True):  # the browser this pool's worker started
            if p.pid not in before:
                p.kill()
        pool.send([0], ["click ( 1 )"])
        (r,) = pool.recv(min_batch=1, timeout=120)
        assert r.done and r.env_error, r.info
        assert pool.health["env_error_episodes"] == 1
        # the same worker serves the next episode on a restarted browser
        pool.async_reset([0], [_task("click-test", 5)])
        (r,) = pool.recv(min_batch=1, timeout=120)
        assert not r.done and "Click Me" in r.observation


def test_render_frames_are_screenshots(env, tmp_path):
    from PIL import Image

    from jaxagent.envs.render import RenderingEnv

    wrapped = RenderingEnv(env, tmp_path)
    wrapped.reset(_task("enter-text", 11))
    wrapped.step('type ( 1 , "hello" )')
    frames = sorted((tmp_path / "episode_000").glob("step_*.png"))
    assert len(frames) == 2
    a, b = (np.asarray(Image.open(f)) for f in frames)
    assert a.shape == (210, 160, 3) and a.dtype == np.uint8
    assert a.std() > 0 and (a != b).any()  # a real page, and typing changed its pixels


@pytest.mark.slow
def test_a_hung_browser_times_out_in_a_process_worker_and_leaves_no_orphan():
    import time

    import psutil

    from jaxagent.envs.web.miniwob import MiniWoBEnvConfig, MiniWoBFactory
    from jaxagent.pool import EnvPool, PoolConfig

    config = PoolConfig(
        num_envs=1, backend="process", step_timeout_s=3, reset_timeout_s=60, start_method="fork"
    )
    me = psutil.Process()
    with EnvPool(MiniWoBFactory(MiniWoBEnvConfig(max_ms=60_000)), config) as pool:
        pool.async_reset([0], [_task("click-button", 5)])
        (r,) = pool.recv(min_batch=1, timeout=120)
        browsers = [p for p in me.children(recursive=True) if "chrom" in p.name()]
        assert browsers
        for p in browsers:
            p.send_signal(signal.SIGSTOP)  # the browser hangs: every command blocks
        pool.send([0], ["click ( 1 )"])
        (r,) = pool.recv(min_batch=1, timeout=60)
        assert r.done and r.env_error and r.info["env_error"] == "timeout", r.info
        pool.async_reset([0], [_task("click-test", 5)])
        (r,) = pool.recv(min_batch=1, timeout=120)
        assert not r.done and "Click Me" in r.observation  # a fresh worker, a fresh browser
        time.sleep(1.5)  # the dead worker's watchdog has killed its browser group
        assert not [p for p in browsers if p.is_running() and p.status() != "zombie"]
