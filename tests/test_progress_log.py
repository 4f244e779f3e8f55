"""Progress in a log file: when stderr is not a terminal (a log file, ``nohup``, a cluster
job) the default display writes a plain line every ``train.progress_every_s`` seconds, during
SFT too, where a live bar printed nothing until the phase ended. The real ``jaxagent``
command runs with stderr going to a file."""

import io
import os
import re
import subprocess
import sys
import time

import pytest

from jaxagent.train.progress import Progress
from test_train import ROOT, TINY

QS = str(ROOT / "configs/quickstart.yaml")


def test_lines_every_period_while_a_step_runs(monkeypatch):
    """A step that outlasts the period (the first one compiles) still gets lines: they come
    from a timer, not from the steps."""
    err = io.StringIO()  # not a terminal
    monkeypatch.setattr(sys, "stderr", err)
    with Progress("rich", "sft", 10, every_s=0.05) as bar:
        time.sleep(0.6)  # a long first step
        bar.update(1, loss="5.358")
        time.sleep(0.3)
    lines = err.getvalue().splitlines()
    assert len(lines) >= 4, lines
    assert all(re.fullmatch(r"sft (0|1)/10 0:00:00 elapsed.*", ln) for ln in lines), lines
    assert lines[0].startswith("sft 0/10") and lines[-1].endswith("left loss=5.358"), lines


def test_none_and_an_interrupted_loop_print_nothing_more(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    with Progress("none", "rl", 3, every_s=0.01) as bar:
        bar.update(1)
        time.sleep(0.05)
    with pytest.raises(KeyboardInterrupt):
        with Progress("rich", "rl", 3, every_s=60) as bar:
            raise KeyboardInterrupt
    assert err.getvalue() == ""


# The real command end to end (81 s on 2 shared cores): nightly.
@pytest.mark.slow
def test_a_log_file_gets_periodic_progress_lines(tmp_path):
    settings = [s for s in TINY if not s.startswith(("train.progress=", "sft.steps="))]
    cmd = [sys.executable, "-m", "jaxagent.cli", "train", QS, *settings]
    cmd += [
        "sft.steps=40",
        "train.iterations=1",
        "eval.every=0",
        "train.progress=rich",  # the default: what a user's run has
        "train.progress_every_s=0.5",
        f"train.out_dir={tmp_path / 'run'}",
    ]
    log = tmp_path / "stderr.log"
    with open(log, "w") as err:
        done = subprocess.run(
            cmd,
            env={**os.environ, "JAX_PLATFORMS": "cpu"},
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            timeout=600,
        )
    text = log.read_text()
    assert done.returncode == 0, text[-3000:]
    sft = re.findall(r"^sft (\d+)/40 (\d+):(\d\d):(\d\d) elapsed", text, re.M)
    rl = re.findall(r"^rl (\d+)/1 ", text, re.M)
    # Several lines while SFT runs (not one at its end), its steps counting up, and its
    # last line at 40/40; the RL phase ends with its own.
    steps = [int(s[0]) for s in sft]
    assert len(sft) >= 3 and any(0 < s < 40 for s in steps), text[-3000:]
    assert steps == sorted(steps) and steps[-1] == 40, steps
    assert rl and rl[-1] == "1", text[-3000:]
    assert "━" not in text and "\x1b[" not in text  # no bar drawing, no escape codes


def test_a_low_start_is_called_out_with_the_fix():
    from jaxagent.train.config import load_config
    from jaxagent.train.sft import low_start_note

    on = load_config(QS, ["sft.enabled=true", "sft.steps=300"])
    note = low_start_note(on, 0.01, has_expert=True)
    assert "0.010 before RL" in note and "raise sft.steps (now 300, e.g. sft.steps=900)" in note
    assert low_start_note(on, 0.3, has_expert=True) is None
    off = load_config(QS, ["sft.enabled=false"])
    assert "sft.enabled=true" in low_start_note(off, 0.0, has_expert=True)
    assert low_start_note(off, 0.0, has_expert=False) is None
