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


def _interrupt_once_training(cmd, env, after_s: float):
    """Start ``cmd`` in its own process group with Ctrl-C delivered as a terminal does
    (Python's handler, even when this test runs in the background), send SIGINT ``after_s``
    seconds after the first RL iteration began; (status, stdout, stderr)."""
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
        os.killpg(proc.pid, signal.SIGINT)
        status = proc.wait(180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for t in readers:
        t.join(10)
    return status, "".join(out), "".join(err)


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
    status, out, err = _interrupt_once_training(cmd, env, after_s=3.0)
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
