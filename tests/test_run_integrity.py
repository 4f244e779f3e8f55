"""A finished run survives ordinary use: failing commands aimed at it change no byte of it,
a second training into it is refused while the first runs, and it still evaluates.

One tiny quickstart run is trained once (the settings of ``tests/test_train.py``); then every
command below must fail (exit 2, one line) and leave every file of the run directory with
the hash it had, after which ``jaxagent eval`` on it still works. The commands are the
ordinary mistakes: a bad ``model.init_from``, another model size, recipe, tokenizer or data
on resume, ``train.resume=false``, a misspelt key, a broken YAML file, an unimportable env
module, a missing checkpoint step, ``export --out`` naming a file, an unknown split.
"""

import hashlib
import os
import subprocess
import sys
import time

import pytest

from jaxagent.cli.main import main

from test_train import ROOT, TINY

QS = str(ROOT / "configs/quickstart.yaml")


@pytest.fixture(scope="module")
def finished(tiny_quickstart_run):
    # the session's tiny run (tests/conftest.py), trained once for this module and
    # tests/test_train.py: the TINY settings trained as `jaxagent train` trains them
    return tiny_quickstart_run[0]


def _hashes(root):
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


def _failing(run, tmp):
    bad_yaml = tmp / "broken.yaml"
    bad_yaml.write_text("model:\n  hidden_size: 3\n   oops: 1\n")
    a_file = tmp / "a_file"
    a_file.write_text("not a directory")
    train = ["train", QS, *TINY, f"train.out_dir={run}"]
    return {
        "init_from a missing directory": [*train, f"model.init_from={tmp / 'nohf'}"],
        "another model size": [*train, "model.hidden_size=64"],
        "another recipe": [*train, "rl.recipe=grpo"],
        "another tokenizer": [*train, "tokenizer.vocab_size=300"],
        "other training data": [*train, "env.options.num_train=30"],
        "resume=false": [*train, "train.resume=false"],
        "misspelt key": [*train, "trian.seed=1"],
        "broken YAML": ["train", str(bad_yaml), f"train.out_dir={run}"],
        "unimportable env module": [*train, "env.name=nopkg.suite:echo"],
        "missing step": ["eval", QS, *TINY, "--checkpoint", str(run), "--step", "99"],
        "export onto a file": ["export", "--checkpoint", str(run), "--out", str(a_file)],
        "unknown split": ["rollout", QS, *TINY, "--checkpoint", str(run), "--split", "dev"],
    }


def test_failed_commands_leave_a_finished_run_byte_for_byte(finished, tmp_path, capsys):
    before = _hashes(finished)
    assert "config.yaml" in before and "summary.json" in before
    commands = _failing(finished, tmp_path)
    assert len(commands) >= 10
    for name, argv in commands.items():
        capsys.readouterr()
        rc = main(argv)
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.strip()]
        assert rc == 2 and len(lines) == 1, (name, rc, err[-2000:])
        assert _hashes(finished) == before, name
    assert main(["eval", QS, *TINY, "--checkpoint", str(finished)]) == 0
    assert main(["eval", QS, "--checkpoint", str(finished), *TINY, "--step", "best"]) == 0


def test_eval_under_another_env_warns(finished, capsys):
    capsys.readouterr()
    argv = ["eval", QS, *TINY, "--checkpoint", str(finished), "env.options.num_test=3"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "warning: the checkpoint was trained on env 'quickstart'" in err, err
    assert "'num_test': 4" in err and "'num_test': 3" in err, err


def test_a_second_training_into_a_running_one_is_refused(tmp_path, capsys):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "jaxagent.cli", "train", QS, *TINY, f"train.out_dir={run}"]
    first = subprocess.Popen(
        cmd, env={**os.environ, "JAX_PLATFORMS": "cpu"}, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.time() + 300
        while not (run / "config.yaml").exists() and first.poll() is None:
            assert time.time() < deadline
            time.sleep(0.05)
        assert first.poll() is None, first.stderr.read()[-2000:]
        capsys.readouterr()
        assert main(["train", QS, *TINY, f"train.out_dir={run}"]) == 2
        lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(lines) == 1, lines
        assert f"pid {first.pid}" in lines[0] and "being trained by another process" in lines[0]
    finally:
        first.kill()
        first.wait()
    # the killed holder's lock is stale: the next training takes the directory over
    assert main(["train", QS, *TINY, f"train.out_dir={run}"]) == 0
