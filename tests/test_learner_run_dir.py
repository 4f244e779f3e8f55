"""The classic learners' run directories: one writer at a time, and a finished run trained
with other settings is refused (exit 2, one line), never overwritten."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from jaxagent.cli.main import main as cli_main
from jaxagent.errors import ConfigError
from jaxagent.learners.ppo_continuous.train import load_ppo_config
from jaxagent.train.run_dir import RunLock, RunLocked, learner_run

CONFIG = str(Path(__file__).resolve().parent.parent / "configs/ppo_halfcheetah.yaml")


def _finished(run: Path, overrides=()) -> dict:
    """A run directory as a finished training leaves it; returns its files' bytes."""
    cfg = OmegaConf.structured(load_ppo_config(CONFIG, [f"train.out_dir={run}", *overrides]))
    with learner_run(run, OmegaConf.to_yaml(cfg)):
        (run / "summary.json").write_text('{"return_mean": 1.0}')
        (run / "metrics.jsonl").write_text('{"iteration": 1}\n')
    return {p.name: p.read_bytes() for p in run.iterdir()}


def test_a_finished_run_with_other_settings_is_refused_and_left_whole(tmp_path, capsys):
    run = tmp_path / "run"
    before = _finished(run)
    assert set(before) == {"config.yaml", "summary.json", "metrics.jsonl"}  # lock released
    code = cli_main(["train", CONFIG, f"train.out_dir={run}", "ppo.num_envs=4"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "ppo.num_envs" in err[0] and "choose another train.out_dir" in err[0]
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


def test_the_same_settings_repeat_the_run_in_place(tmp_path):
    run = tmp_path / "run"
    _finished(run, ["ppo.epochs=3"])
    _finished(run, ["ppo.epochs=3"])  # no refusal
    with pytest.raises(ConfigError, match="ppo.epochs: 3 -> 5"):
        _finished(run, ["ppo.epochs=5"])


def test_a_second_writer_is_refused_while_the_first_holds_the_directory(tmp_path):
    run = tmp_path / "run"
    held = RunLock.acquire(run)
    try:
        with pytest.raises(RunLocked, match="being trained by another process"):
            _finished(run)
        assert not (run / "config.yaml").exists()
    finally:
        held.release()
    _finished(run)
