"""The seams other suites plug into: ``learner:`` dispatch, ``--render`` frames, snapshots."""

import numpy as np
import pytest
from PIL import Image

from jaxagent.cli.main import main
from jaxagent.envs.base import StepResult, Task, supports_snapshot
from jaxagent.envs.render import RenderingEnv
from jaxagent.learners import registry as classic


class _Painter:
    """Draws its step count as the red channel; snapshots are that count."""

    def __init__(self):
        self.t = 0

    def reset(self, task):
        self.t = 0
        return "start"

    def step(self, action):
        self.t += 1
        return StepResult(f"t={self.t}", 0.0, self.t >= 2)

    def render_frame(self):
        frame = np.zeros((8, 6, 3), np.uint8)
        frame[..., 0] = 100 * self.t
        return frame

    def snapshot(self):
        return self.t

    def restore(self, s):
        self.t = s

    def close(self):
        pass


def test_rendering_env_writes_a_png_per_step_and_a_gif_per_episode(tmp_path):
    env = RenderingEnv(_Painter(), tmp_path)
    for _ in range(2):
        env.reset(Task("t", "test", "p"))
        env.step("a")
        env.step("b")
    env.close()
    pngs = sorted((tmp_path / "episode_001").glob("*.png"))
    assert [p.name for p in pngs] == ["step_000.png", "step_001.png", "step_002.png"]
    assert [np.asarray(Image.open(p))[0, 0, 0] for p in pngs] == [0, 100, 200]
    gif = Image.open(tmp_path / "episode_000.gif")
    assert gif.n_frames == 3
    assert supports_snapshot(env) and env.snapshot() == 2  # capabilities pass through


def test_rendering_refuses_an_env_that_cannot_draw(tmp_path):
    class Blind:
        pass

    with pytest.raises(ValueError, match="cannot render"):
        RenderingEnv(Blind(), tmp_path)


def test_train_dispatches_on_learner_and_refuses_an_unknown_one(tmp_path, capsys, monkeypatch):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("learner: dqn_dialog\n")
    assert main(["train", str(cfg)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "dqn_dialog" in err[0] and "dqn_dialogue" in err[0]

    seen = {}

    def fake(path, overrides):
        seen["args"] = (path, overrides)
        return {"return": 1.5}

    monkeypatch.setitem(classic.LEARNERS, "fake", classic.LearnerSpec(f"{__name__}:_FAKE"))
    import sys

    monkeypatch.setattr(sys.modules[__name__], "_FAKE", fake, raising=False)
    cfg.write_text("learner: fake\n")
    assert main(["train", str(cfg), "a.b=1"]) == 0
    assert seen["args"] == (str(cfg), ["a.b=1"])
    assert capsys.readouterr().out.strip().splitlines()[-1] == '{"return": 1.5}'


def test_one_learner_table_names_trainer_evaluator_and_example(tmp_path, capsys):
    """``LEARNERS`` holds each learner's trainer, evaluator and example config in one
    ``LearnerSpec``: a learner without an evaluator is refused by ``jaxagent eval`` with the
    ones that have one."""
    assert all(spec.example.endswith(".yaml") for spec in classic.LEARNERS.values())
    cfg = tmp_path / "c.yaml"
    cfg.write_text("learner: dqn_dialogue\n")
    assert main(["eval", str(cfg), "--checkpoint", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no evaluator" in err[0] and "ppo_continuous" in err[0], err
