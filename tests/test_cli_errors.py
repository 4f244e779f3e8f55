"""Every ``jaxagent`` input error exits 2 with one line naming the input, the value and the fix.

Each case runs ``jaxagent.cli.main`` in-process and checks: status 2, exactly one non-empty
line on stderr, no traceback, and the offending input named in that line.
"""

from pathlib import Path

import pytest

import jaxagent
from jaxagent.cli.main import main

ROOT = Path(jaxagent.__file__).parent.parent  # the configs of the tree under test
QS = str(ROOT / "configs/quickstart.yaml")


def _run_dir(tmp_path, *, tokenizer: bool, checkpoints: bool) -> Path:
    """A run directory with the config, and optionally the tokenizer and an empty
    checkpoints directory, as a run killed during set-up leaves it."""
    from jaxagent.train.config import config_to_yaml, load_config

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(config_to_yaml(load_config(QS)))
    if tokenizer:
        from jaxagent.envs.tools.quickstart import vocabulary
        from jaxagent.train.tokenizer import build_word_tokenizer

        build_word_tokenizer(vocabulary()).save_pretrained(str(run / "tokenizer"))
    if checkpoints:
        (run / "checkpoints").mkdir()
    return run


CASES = {
    "missing config file": (lambda tmp: ["train", str(tmp / "nope.yaml")], "nope.yaml"),
    "unknown key": (lambda tmp: ["train", QS, "model.hiden_size=3"], "model.hiden_size"),
    "override without =": (lambda tmp: ["train", QS, "train.seed"], "train.seed"),
    "bad value": (
        lambda tmp: ["train", QS, "rollout.samples_per_task=-1"],
        "rollout.samples_per_task=-1",
    ),
    "missing checkpoint dir": (lambda tmp: ["eval", QS, "--checkpoint", str(tmp / "gone")], "gone"),
    "not a run dir": (lambda tmp: ["eval", QS, "--checkpoint", str(tmp)], "config.yaml"),
    "run dir without tokenizer": (
        lambda tmp: [
            "eval",
            QS,
            "--checkpoint",
            str(_run_dir(tmp, tokenizer=False, checkpoints=False)),
        ],
        "tokenizer",
    ),
    "run dir without checkpoints": (
        lambda tmp: [
            "eval",
            QS,
            "--checkpoint",
            str(_run_dir(tmp, tokenizer=True, checkpoints=False)),
        ],
        "checkpoints",
    ),
    "empty checkpoints dir": (
        lambda tmp: [
            "export",
            "--checkpoint",
            str(_run_dir(tmp, tokenizer=True, checkpoints=True)),
            "--out",
            str(tmp / "hf"),
        ],
        "checkpoints",
    ),
    "bad --n type": (lambda tmp: ["rollout", QS, "--n", "many"], "many"),
    "bad --n value": (lambda tmp: ["rollout", QS, "--n", "0"], "--n 0"),
    "unknown split": (
        lambda tmp: [
            "rollout",
            QS,
            "env.options.num_train=20",
            "env.options.num_test=4",
            "eval.val_tasks=4",
            "--split",
            "validation",
            "--n",
            "1",
        ],
        "validation",
    ),
    "unknown command": (lambda tmp: ["deploy", QS], "deploy"),
    "missing required flag": (lambda tmp: ["eval", QS], "--checkpoint"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_input_error_exits_2_with_one_line(case, tmp_path, capsys):
    argv, named = CASES[case]
    rc = main(argv(tmp_path))
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert rc == 2, captured.err
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err + captured.out
    assert named in lines[0], lines[0]
    assert lines[0].startswith("jaxagent"), lines[0]


def test_samples_per_task_message_says_what_zero_means():
    from jaxagent.train.config import load_config
    from jaxagent.errors import ConfigError

    with pytest.raises(ConfigError, match="0 for the recipe's default group size"):
        load_config(QS, ["rollout.samples_per_task=-1"])
