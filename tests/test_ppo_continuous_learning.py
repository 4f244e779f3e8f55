"""Continuous-control PPO learns through the pool's MuJoCo engine (InvertedPendulum-v5), writes
its outputs, and `jaxagent eval` reloads the checkpoint."""

import json
from pathlib import Path

import numpy as np
import pytest

from jaxagent.cli.main import main as cli_main
from jaxagent.learners.ppo_continuous.train import train

CONFIG = str(Path(__file__).resolve().parent.parent / "configs/ppo_halfcheetah.yaml")
PENDULUM = ["env.name=InvertedPendulum-v5", "train.eval_every=0", "train.log_every=0"]


def test_short_run_raises_the_return_and_eval_reloads_the_checkpoint(tmp_path, capsys):
    # 8 envs x 64 steps x 16 iterations ~ 8k steps, a small net: episodes of the initial
    # policy last ~7 steps; by the end they last about twice as long.
    out = tmp_path / "run"
    overrides = PENDULUM + [
        "train.total_steps=8192",
        "ppo.num_envs=8",
        "ppo.horizon=64",
        "ppo.epochs=4",
        "ppo.minibatch_size=128",
        "ppo.hidden=[32,32]",
        "train.eval_episodes=4",
        f"train.out_dir={out}",
    ]
    summary = train(CONFIG, overrides)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    curve = [r["return_recent"] for r in rows]
    assert len(rows) == 16 and summary["steps"] > 7000
    assert np.mean(curve[-3:]) > 1.6 * curve[0], curve
    for name in ("curve.png", "summary.json", "checkpoint.msgpack", "config.yaml"):
        assert (out / name).stat().st_size > 0
    assert json.loads((out / "summary.json").read_text()) == summary
    capsys.readouterr()
    assert cli_main(["eval", CONFIG, *overrides, "--checkpoint", str(out)]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["env"] == "InvertedPendulum-v5" and line["episodes"] == 4
    assert line["return_mean"] > 0
    # the same `rollout --render DIR` as the LM suites, on the learner's checkpoint
    frames = tmp_path / "frames"
    args = ["rollout", CONFIG, *overrides, "--checkpoint", str(out), "--n", "2"]
    assert cli_main([*args, "--render", str(frames)]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["episodes"] == 2 and line["return_mean"] > 0
    from PIL import Image

    pngs = sorted(frames.glob("step_*.png"))
    assert len(pngs) >= 2 and (frames / "episode_000.gif").is_file()
    first, last = (np.asarray(Image.open(p)).astype(int) for p in (pngs[0], pngs[-1]))
    assert first.std() > 5 and np.abs(first - last).sum(-1).astype(bool).sum() > 50


def test_eval_without_a_checkpoint_file_names_the_fix(tmp_path, capsys):
    assert cli_main(["eval", CONFIG, "--checkpoint", str(tmp_path)]) == 2
    assert "checkpoint.msgpack" in capsys.readouterr().err
    assert cli_main(["rollout", CONFIG, "--render", str(tmp_path / "f")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--checkpoint RUN_DIR" in err[0]


@pytest.mark.slow
def test_inverted_pendulum_reaches_its_threshold(tmp_path):
    # Gymnasium's reward_threshold for InvertedPendulum-v5 is 950 (of 1000); the vectorised
    # variant (8 envs x 256 steps, 10 epochs of minibatch 64) gets there within 100k steps.
    summary = train(
        CONFIG,
        PENDULUM
        + [
            "train.total_steps=102400",
            "ppo.num_envs=8",
            "ppo.horizon=256",
            f"train.out_dir={tmp_path}",
        ],
    )
    assert summary["return_mean"] >= 950, summary
