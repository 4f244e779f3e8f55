"""``jaxagent train`` as 2 processes on localhost (gloo) equals 1 process, resume included.

The shrunken quickstart of test_mesh_trainer runs as two processes of one CPU device each
(``distributed.*``: each process samples its half of every iteration's tasks with its own
environment pool, from a host-local copy of the weights; the update runs on the 2-device
global mesh) and as one process of two devices (``mesh.data=2``) with
the same per-episode random streams (every episode draws from its global number). Both stop
after 2 iterations and resume for a third from their last checkpoint.

Same tokens, rewards and success at every step (the gathered metrics of the two hosts are
the one process's), losses to float32 reassociation, final parameters within
test_mesh_trainer's bound (3 iterations of 2 steps here): the update program is the same
on both sides, only the gloo all-reduce orders the two partial gradients differently.
Process 0 alone writes metrics and the summary; process 1 prints nothing.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest


from jaxagent.train.checkpoint import restore_params_only
from jaxagent.train.config import load_config
from jaxagent.train.metrics_log import read_jsonl
from test_mesh_trainer import NONDETERMINISTIC, TINY, assert_same_run

ROOT = Path(__file__).parent.parent
RUN = "import sys; from jaxagent.cli.main import main; sys.exit(main(sys.argv[1:]))"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _overrides(out: Path, iterations: int) -> list[str]:
    return [
        *TINY,
        f"train.out_dir={out}",
        f"train.iterations={iterations}",
        "train.checkpoint_every=1",
        "train.resume=true",
    ]


def _train_one(out: Path, iterations: int, devices: int = 2) -> None:
    """One process of ``devices`` of this test process's simulated devices, per-row streams
    on."""
    from jaxagent.train.trainer import Trainer

    extra = [f"mesh.data={devices}"]
    cfg = load_config(ROOT / "configs/quickstart.yaml", _overrides(out, iterations) + extra)
    Trainer(cfg, echo=lambda s: None).run()


def _train_two(out: Path, iterations: int, per_process=lambda i: [], rc: int = 0) -> list[str]:
    """Two ``jaxagent train`` processes of one CPU device each (``per_process(i)``: process
    i's own extra overrides; ``rc``: the exit status both must end with); their output."""
    port = _free_port()
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        JAX_PLATFORMS="cpu",
        XLA_FLAGS="",
        JAX_DEFAULT_MATMUL_PRECISION="highest",  # as conftest sets for this process
    )
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                RUN,
                "train",
                str(ROOT / "configs/quickstart.yaml"),
                *_overrides(out, iterations),
                "mesh.data=-1",
                "distributed.mode=explicit",
                f"distributed.coordinator_address=localhost:{port}",
                "distributed.num_processes=2",
                f"distributed.process_id={i}",
                "distributed.local_device_count=1",
                *per_process(i),
            ],
            cwd=out.parent,  # the test's tmp_path: nothing lands in the checkout
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    logs = [p.communicate(timeout=900)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == rc, log[-4000:]
    return logs


def _records(out: Path) -> tuple[dict, dict]:
    records: dict = {}
    for r in read_jsonl(out / "metrics.jsonl"):
        records.setdefault(r["step"], {}).update(
            {k: v for k, v in r.items() if not k.startswith(NONDETERMINISTIC)}
        )
    state, meta, step = restore_params_only(out / "checkpoints")
    assert step == 3 and meta["iteration"] == 3
    return records, state["params"]


@pytest.mark.slow  # ~100 s on 2 cores (nightly); CI keeps the refusal test below multi-process
def test_two_processes_train_and_resume_like_one(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    _train_one(one, 2)
    _train_one(one, 3)  # resumes from checkpoint 2
    first = _train_two(two, 2)
    second = _train_two(two, 3)
    assert "[resume] from checkpoint 2" in second[0]
    for log in (first[1], second[1]):  # process 1 printed nothing (gloo's own lines aside)
        assert [line for line in log.splitlines() if not line.startswith("[Gloo]")] == []
    line = json.loads(first[0].strip().splitlines()[-1])  # the quickstart's JSON line
    assert line["seed"] == 0 and "success_after_rl" in line
    (m1, p1), (m2, p2) = _records(one), _records(two)
    assert m1.keys() == m2.keys() == {0, 1, 2, 3}
    for it in (1, 2, 3):  # one process: its 2-device mesh; two: one device each
        assert (m1[it].pop("sampler/devices"), m2[it].pop("sampler/devices")) == (2, 1)
    assert m2[1]["batch/rows"] == 16 and m2[1]["train/episodes"] == 16
    assert_same_run((m1, p1), (m2, p2), steps=6)  # 3 iterations x 2 minibatches
    assert json.loads((two / "summary.json").read_text())["iterations"] == 3


def test_processes_that_do_not_share_the_checkpoint_directory_are_refused(tmp_path):
    # as if each host wrote checkpoints to its own local disk: orbax would split each
    # checkpoint between them; both processes stop at start-up, naming the fix
    (tmp_path / "run").mkdir()
    logs = _train_two(
        tmp_path / "run",
        1,
        per_process=lambda i: [f"train.checkpoint_dir={tmp_path}/host{i}"],
        rc=2,
    )
    for log in logs:
        assert "process(es) [1] of 2 do not see what process 0 writes" in log, log[-2000:]
        assert "Traceback" not in log
    assert not (tmp_path / "host0").exists()  # the token and its directory are gone


@pytest.mark.slow  # ~80 s on 2 cores (nightly: scripts/nightly.sh)
def test_each_process_samples_on_all_its_devices(tmp_path, monkeypatch):
    # two processes of two devices each: a host's sampler reads weights split over both of
    # its own devices (not one full copy on its first) and the run is the one-process run's
    one, two = tmp_path / "one", tmp_path / "two"
    _train_one(one, 3, devices=4)
    _train_two(two, 3, per_process=lambda i: ["distributed.local_device_count=2"])
    (m1, p1), (m2, p2) = _records(one), _records(two)
    assert m1.keys() == m2.keys() == {0, 1, 2, 3}
    for it in (1, 2, 3):  # one process: the 4-device mesh; two: each its own 2 devices
        assert (m1[it].pop("sampler/devices"), m2[it].pop("sampler/devices")) == (4, 2)
    assert_same_run((m1, p1), (m2, p2), steps=6)
