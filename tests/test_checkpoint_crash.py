"""Crash safety: a kill at any point of a checkpoint save leaves the previous checkpoint
loadable and the run resumable; a crash leaves metrics.jsonl parseable up to its last record.

The kills are real SIGKILLs of a process in the middle of ``Checkpointer.save`` (which also
deletes the oldest checkpoint: ``keep=2``). To afford 24 kill points in the default suite, one
helper process imports jax and orbax once (no backend, no thread started) and forks a fresh
saver per kill point; the saver signals the start of the save through a pipe and the helper
kills it after a delay spread over the measured save duration (the fastest of a few
uninterrupted saves: a forked saver's first save is about twice as slow as the later ones).
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest

from jaxagent.train.checkpoint import Checkpointer
from jaxagent.train.metrics_log import MetricsLogger, read_jsonl

KILL_POINTS = 24
CALIBRATIONS = 3  # uninterrupted saves timed before the kills

HELPER = textwrap.dedent(
    r"""
    import json, os, signal, sys, time
    import numpy as np
    from jaxagent.train.checkpoint import Checkpointer

    dirs, out = sys.argv[1:-1], sys.argv[-1]
    CALIBRATIONS = %d

    def saver(path, fd):
        state = {"w": np.full((256, 256), 4.0, np.float32), "step": np.int32(4)}
        ck = Checkpointer(path, keep=2)
        os.write(fd, b"s")
        ck.save(4, state, {"iteration": 4})
        ck.wait()
        ck.close()
        os.write(fd, b"d")

    def run(path, delay):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                saver(path, w)
            finally:
                os._exit(0)
        os.close(w)
        assert os.read(r, 1) == b"s"
        t0 = time.monotonic()
        if delay is None:
            done = os.read(r, 1) == b"d"
            os.waitpid(pid, 0)
            return time.monotonic() - t0, done
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        done = os.read(r, 1) == b"d"
        return delay, done

    cal, kill = dirs[:CALIBRATIONS], dirs[CALIBRATIONS:]
    duration = min(run(path, None)[0] for path in cal)
    results = []
    for i, path in enumerate(kill):
        delay = duration * 1.2 * i / (len(kill) - 1)
        results.append(run(path, delay))
    json.dump({"duration": duration, "kills": results}, open(out, "w"))
    """
    % CALIBRATIONS
)


def _state(value: float, step: int):
    return {"w": jnp.full((256, 256), value, jnp.float32), "step": jnp.int32(step)}


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    base = tmp_path_factory.mktemp("ck")
    pristine = base / "pristine"
    ck = Checkpointer(pristine, keep=2)
    for step in (1, 2, 3):
        ck.save(step, _state(float(step), step), {"iteration": step})
        ck.wait()
    ck.close()
    dirs = [base / f"k{i}" for i in range(CALIBRATIONS + KILL_POINTS)]
    for d in dirs:
        shutil.copytree(pristine, d)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
    proc = subprocess.run(
        [sys.executable, "-c", HELPER, *map(str, dirs), str(base / "out.json")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads((base / "out.json").read_text())
    return dirs[CALIBRATIONS:], info


def test_kill_at_any_point_of_a_save_leaves_a_loadable_checkpoint(killed):
    dirs, info = killed
    kills = info["kills"]
    assert len(kills) == KILL_POINTS
    interrupted = [i for i, (_, done) in enumerate(kills) if not done]
    # the kill points really fall inside the save (not all before or after it)
    assert len(interrupted) >= KILL_POINTS // 2, info
    latest_seen = set()
    for i, d in enumerate(dirs):
        ck = Checkpointer(d, keep=2)
        latest = ck.latest_step()
        assert latest in (3, 4), (i, kills[i], latest, sorted(os.listdir(d)))
        if not kills[i][1]:
            latest_seen.add(latest)
        state, meta = ck.restore(latest, _state(0.0, 0))
        assert meta["iteration"] == latest
        np.testing.assert_array_equal(np.asarray(state["w"]), float(latest))
        # resumable: the run goes on saving and restoring from here
        ck.save(latest + 1, _state(9.0, latest + 1), {"iteration": latest + 1})
        ck.wait()
        assert ck.latest_step() == latest + 1
        np.testing.assert_array_equal(np.asarray(ck.restore(latest + 1, _state(0, 0))[0]["w"]), 9.0)
        ck.close()
        assert not [n for n in os.listdir(d) if "tmp" in n], os.listdir(d)  # cleaned up
    assert 3 in latest_seen  # some kills did land before the new checkpoint was complete


def test_metrics_survive_a_crash_mid_record_and_a_resume_rewrite(tmp_path):
    log = MetricsLogger(tmp_path, tensorboard=False)
    for step in range(1, 6):
        log.log(step, {"loss": step / 10, "nan": float("nan")})
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 6, "loss": 0.')  # the process died in the middle of a record
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]  # parseable up to the last record
    assert records[0]["nan"] == "nan"
    log.truncate_after(3)  # a resume from checkpoint 3 redoes 4 and 5
    log.log(4, {"loss": 0.44})
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4]
    assert not list(tmp_path.glob("*.tmp"))  # the rewrite went through a renamed temp file


def test_a_kill_during_the_resume_rewrite_loses_nothing(tmp_path):
    """truncate_after replaces the file atomically: killing it at the worst moment (the new
    file written, not yet renamed) leaves the complete old file in place."""
    log = MetricsLogger(tmp_path, tensorboard=False)
    for step in range(1, 4):
        log.log(step, {"loss": float(step)})
    code = (
        "import os, sys\n"
        "from jaxagent.train import metrics_log\n"
        "def die(*a, **k):\n    os._exit(9)\n"
        "metrics_log.os.replace = die\n"
        f"metrics_log.MetricsLogger({str(tmp_path)!r}, tensorboard=False).truncate_after(1)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 9, proc.stderr
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2, 3]
