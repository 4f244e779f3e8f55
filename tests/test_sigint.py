"""Ctrl-C of a training run, in every mode: exit status 130 (what a shell reports for
Ctrl-C), one line on stderr that says where the run resumes, and the run resumable.

An overlapped run (``overlap.staleness >= 1``) collects on daemon producer threads that are
inside XLA calls most of the time; a process that left them to the interpreter's teardown
aborted (``terminate called ... FATAL: exception not rethrown``, status 134). A harness run
has its server's and the harness's threads too. The real ``jaxagent`` command runs, SIGINT
goes to its process group as a terminal sends it, once the RL loop has started.
"""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from importlib.util import find_spec

import pytest

from test_train import ROOT, TINY

QS = str(ROOT / "configs/quickstart.yaml")
JAXAGENT = [sys.executable, "-m", "jaxagent.cli"]
HARNESS = ["harness.entry=jaxagent.serve.examples:quickstart_harness", "harness.concurrency=2"]


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory):
    return {
        "JAX_COMPILATION_CACHE_DIR": str(tmp_path_factory.mktemp("xla")),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
    }


def _interrupt_once_training(cmd, env, after_s: float, group_s: float = 0.0):
    """Start ``cmd`` in its own process group with Ctrl-C delivered as a terminal does
    (Python's handler, even when this test runs in the background), send SIGINT ``after_s``
    seconds after the first RL iteration began; (status, stdout, stderr, the stderr lines
    written after the signal). ``group_s``: wait that long for the whole process group (what
    the command started: Ray's daemons) to be gone after the command ended, else fail."""
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.default_int_handler),
    )
    out: list[str] = []
    err: list[str] = []
    started = threading.Event()

    def read_out():
        for line in proc.stdout:
            out.append(line)
            if line.startswith("[iter 0]"):  # the start's validation: RL begins now
                started.set()

    readers = [
        threading.Thread(target=read_out, daemon=True),
        threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True),
    ]
    for t in readers:
        t.start()
    try:
        assert started.wait(420), "".join(out)[-2000:] + "".join(err)[-2000:]
        time.sleep(after_s)
        before = len(err)
        os.killpg(proc.pid, signal.SIGINT)
        status = proc.wait(180)
        left = _group_left(proc.pid, group_s) if group_s else []
    finally:
        try:  # anything of the group still there (the command, what it started)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    for t in readers:
        t.join(10)
    assert not left, f"still running after the command ended: {left}"
    return status, "".join(out), "".join(err), [x for x in err[before:] if x.strip()]


def _group_left(pgid: int, timeout_s: float) -> list[str]:
    """The commands of the processes still in group ``pgid`` after ``timeout_s`` ([]: none)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        if time.monotonic() > deadline:
            ps = subprocess.run(
                ["ps", "-o", "pid=,stat=,args=", "-g", str(pgid)], capture_output=True, text=True
            )
            # zombies (stat Z) are gone, only not yet reaped by their new parent
            left = [x for x in ps.stdout.splitlines() if x.split()[1:2] != ["Z"]]
            if not left:
                return []
            return left
        time.sleep(0.2)


def _settings(run, *extra):
    return [
        *TINY,
        "train.iterations=200",  # far more than run before the signal
        "train.checkpoint_every=2",
        f"train.out_dir={run}",
        *extra,
    ]


MODES = {
    "sync": [],
    "overlap-one-lane": ["overlap.staleness=1"],
    "overlap-two-lanes": ["overlap.staleness=1", "overlap.lanes=2"],
    "harness-overlap": ["overlap.staleness=1", *HARNESS],
}


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param("sync", marks=pytest.mark.slow),  # tests/test_resume_matrix.py: in CI
        "overlap-one-lane",  # with the resume
        pytest.param("overlap-two-lanes", marks=pytest.mark.slow),
        pytest.param("harness-overlap", marks=pytest.mark.slow),
    ],
)
def test_ctrl_c_exits_130_with_one_line_and_resumes(mode, compile_cache, tmp_path):
    run = tmp_path / "run"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", **compile_cache}
    cmd = [*JAXAGENT, "train", QS, *_settings(run, *MODES[mode])]
    status, out, err, _ = _interrupt_once_training(cmd, env, after_s=3.0)
    assert status == 130, f"status {status}\n{err[-3000:]}"
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err[-3000:]
    m = re.fullmatch(
        r"jaxagent train: interrupted; (.*) resumes from checkpoint (\d+) when you run the "
        r"same command again",
        lines[0],
    )
    assert m and m.group(1) == str(run), lines[0]
    step = int(m.group(2))
    if mode != "overlap-one-lane":
        return
    # The tiny model starts RL near 0 after 3 SFT steps: the log says so, with the fix.
    assert "[note] held-out success 0.000 before RL" in out and "raise sft.steps (now 3" in out
    # The same command, one iteration past the checkpoint: it resumes there and ends.
    again = [*JAXAGENT, "train", QS, *_settings(run, *MODES[mode])]
    again[again.index("train.iterations=200")] = f"train.iterations={step + 1}"
    done = subprocess.run(again, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"[resume] from checkpoint {step}" in done.stdout, done.stdout[-2000:]


def test_serve_ctrl_c_exits_130_with_one_line_and_the_episodes_kept(tmp_path):
    """``jaxagent serve --episodes FILE``, Ctrl-C after two sessions ended and one left open:
    status 130, one line naming what was kept (uvicorn's shutdown lines quiet), and both
    ended sessions' episodes in the file, whole."""
    import openai

    try:  # the HTTP client the openai package depends on (httpx2 in its recent releases)
        import httpx2 as httpx
    except ImportError:  # pragma: no cover
        import httpx

    from jaxagent.serve.server import free_port

    port, out = free_port(), tmp_path / "episodes.jsonl"
    cmd = [*JAXAGENT, "serve", QS, *TINY[:6], "--slots", "2", "--port", str(port)]
    proc = subprocess.Popen(
        [*cmd, "--episodes", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.default_int_handler),
    )
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
    reader.start()
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 300
        while True:  # up once the policy's programs compiled
            assert proc.poll() is None and time.monotonic() < deadline, "".join(err)[-3000:]
            try:
                if httpx.get(f"{url}/models", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120)
        for sid in ("a", "b", "open"):
            client.chat.completions.create(
                model="quickstart",
                messages=[{"role": "user", "content": "look at the box"}],
                max_tokens=4,
                extra_headers={"X-Session-Id": sid},
            )
            if sid != "open":
                r = httpx.post(f"{url}/sessions/{sid}/reward", json={"reward": 1.0})
                assert r.status_code == 200, r.text
        time.sleep(0.3)  # the start-up lines are read
        before = len(err)
        os.killpg(proc.pid, signal.SIGINT)
        status = proc.wait(60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(10)
    after = [line.strip() for line in err[before:] if line.strip()]
    assert status == 130, f"status {status}\n{''.join(err)[-3000:]}"
    assert after == [
        f"jaxagent serve: interrupted; the episodes of 2 ended sessions are in {out}; "
        "1 open session never ended (not kept)"
    ], err
    episodes = [json.loads(line) for line in out.read_text().splitlines()]
    assert [e["session"] for e in episodes] == ["a", "b"]
    assert all(e["reward"] == 1.0 and sum(e["loss_mask"]) > 0 for e in episodes)


@pytest.mark.slow  # ~40 s to the first iteration with Ray's start, ~40 s more for the resume
@pytest.mark.skipif(find_spec("ray") is None, reason="the ray pool backend needs Ray installed")
def test_ctrl_c_under_the_ray_backend_exits_130_stops_ray_and_resumes(compile_cache, tmp_path):
    """The env pool in Ray actors on a local instance the run started itself: Ctrl-C exits
    130 with the one line, nothing the run started (Ray's daemons and agents, its actors)
    outlives it, and the same command resumes from the checkpoint."""
    run = tmp_path / "run"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", **compile_cache}
    ray = ["env.pool.backend=ray", "env.pool.ray_address=local", "env.pool.num_envs=2"]
    cmd = [*JAXAGENT, "train", QS, *_settings(run, *ray)]
    status, _, err, after = _interrupt_once_training(cmd, env, after_s=3.0, group_s=15.0)
    assert status == 130, f"status {status}\n{err[-3000:]}"
    # Ray's start-up notes come before the signal; after it, the command's one line only
    assert len(after) == 1, err[-3000:]
    m = re.fullmatch(
        r"jaxagent train: interrupted; (.*) resumes from checkpoint (\d+) when you run the "
        r"same command again",
        after[0].strip(),
    )
    assert m and m.group(1) == str(run), after
    step = int(m.group(2))
    again = [*JAXAGENT, "train", QS, *_settings(run, *ray)]
    again[again.index("train.iterations=200")] = f"train.iterations={step + 1}"
    done = subprocess.run(again, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"[resume] from checkpoint {step}" in done.stdout, done.stdout[-2000:]
