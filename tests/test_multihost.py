"""Multi-host: 2 CPU processes on localhost (gloo collectives) equal 1 process.

``tests/multihost_worker.py`` runs the trainer's device path (mesh over every process's
devices, host-local rows assembled into global arrays, sharded update, a collective orbax
checkpoint, a resume from it into an abstract template, one more update). Two processes of
2 devices each must give the parameters and losses of one process of 4 devices: the mesh
(data=4) and therefore the program are the same, so the only freedom is the gloo
all-reduce's summation order across the two processes. Bound: the gradient all-reduce sums
4 partial gradients (one per device), so reordering it moves a gradient by <= 4 eps32 |g|;
Adam with eps = 1 makes the step Lipschitz in g with constant lr (test_mesh_trainer); three
steps and p + step rounding: atol = 3 (lr 4 eps |g|max + 2 eps |p|max), |g| <= 10 here.
"""

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

WORKER = Path(__file__).with_name("multihost_worker.py")
ROOT = Path(__file__).parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _launch(nproc, per, out):
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(i), str(nproc), str(port), str(per), str(out)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(nproc)
    ]
    logs = [p.communicate(timeout=800)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    return logs


# Nightly (scripts/nightly.sh): the learner path it checks (global batches from host rows,
# the sharded update, a collective checkpoint and its resume) runs inside the whole trainer
# in tests/test_multihost_trainer.py, which CI runs.
@pytest.mark.slow
def test_two_processes_equal_one(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    _launch(1, 4, one)
    logs = _launch(2, 2, two)
    assert "procs 2" in logs[0] and "devices 4" in logs[0]
    # written once: only process 0 wrote its files (and no other process printed them)
    assert "losses" not in logs[1]
    p1, p2 = np.load(one / "params.npz"), np.load(two / "params.npz")
    l1, l2 = np.load(one / "losses.npy"), np.load(two / "losses.npy")
    np.testing.assert_allclose(l2, l1, rtol=1e-5)
    eps, lr = float(np.finfo(np.float32).eps), 1e-2
    moved = False
    for k in p1.files:
        atol = 3 * (lr * 4 * eps * 10.0 + 2 * eps * np.abs(p1[k]).max())
        np.testing.assert_allclose(p2[k], p1[k], rtol=0, atol=atol, err_msg=k)
        moved |= bool(np.abs(p1[k]).max() > 0)
    assert moved and len(l1) == 3
