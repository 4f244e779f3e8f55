"""The run's human-facing outputs, switched off everywhere else in the tests, all on here.

A shrunken quickstart run with ``train.progress=rich``, ``train.tensorboard=true`` and
``train.plot=true`` must write TensorBoard scalars equal to its ``metrics.jsonl`` records,
a learning-curve PNG of the plotted size with more than a blank canvas in it, and progress
bars for SFT and RL on the terminal (stderr).
"""

import struct
from pathlib import Path

import numpy as np

import jaxagent
from jaxagent.train.config import load_config
from jaxagent.train.metrics_log import read_jsonl

ROOT = Path(jaxagent.__file__).parent.parent
ITERATIONS = 2
ON = [
    "model.hidden_size=32",
    "model.num_layers=1",
    "model.num_heads=2",
    "model.num_kv_heads=1",
    "model.intermediate_size=64",
    "model.max_seq_len=160",
    "env.options.num_train=20",
    "env.options.num_test=4",
    "rollout.tasks_per_iteration=4",
    "rollout.samples_per_task=2",
    "rollout.max_turns=2",
    "rollout.max_new_tokens=8",
    "sft.num_demos=8",
    "sft.steps=3",
    "sft.batch_size=2",
    "eval.num_tasks=4",
    "eval.every=1",
    "eval.val_tasks=0",
    f"train.iterations={ITERATIONS}",
    "train.checkpoint_every=0",
    "train.progress=rich",
    "train.tensorboard=true",
    "train.plot=true",
]


def read_scalars(directory: Path) -> dict[str, dict[int, float]]:
    """tag -> {step: value} from the TFRecord event files in ``directory`` (length, masked
    CRC, ``Event`` proto, masked CRC per record; parsed with tensorboardX's protos)."""
    from tensorboardX.proto.event_pb2 import Event

    out: dict[str, dict[int, float]] = {}
    files = sorted(directory.glob("events.out.tfevents.*"))
    assert files, f"no event file in {directory}"
    for path in files:
        data = path.read_bytes()
        at = 0
        while at < len(data):
            (n,) = struct.unpack("<Q", data[at : at + 8])
            event = Event.FromString(data[at + 12 : at + 12 + n])
            at += 12 + n + 4
            for value in event.summary.value:
                out.setdefault(value.tag, {})[int(event.step)] = float(value.simple_value)
    return out


def test_progress_tensorboard_and_learning_curve(tmp_path, capfd):
    from jaxagent.train.trainer import Trainer

    out = tmp_path / "run"
    config = load_config(ROOT / "configs/quickstart.yaml", ON + [f"train.out_dir={out}"])
    summary = Trainer(config, echo=print).run()
    captured = capfd.readouterr()

    # Progress: both bars reached the terminal (stderr) and ran to completion.
    assert "sft" in captured.err and "rl" in captured.err, captured.err[-2000:]
    assert f"{ITERATIONS}/{ITERATIONS}" in captured.err and "3/3" in captured.err
    assert "held-out success" in captured.out  # the echo lines and the table stay on stdout

    # TensorBoard: every numeric record of metrics.jsonl is a scalar at its step.
    scalars = read_scalars(out / "tb")
    records = read_jsonl(out / "metrics.jsonl")
    checked = 0
    for record in records:
        for key, value in record.items():
            if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            assert key in scalars, (key, sorted(scalars))
            np.testing.assert_allclose(
                scalars[key][record["step"]], value, rtol=1e-6, atol=1e-6, err_msg=key
            )
            checked += 1
    assert checked > 50
    assert sorted(scalars["train/success"]) == list(range(1, ITERATIONS + 1))
    assert sorted(scalars["eval/success"]) == list(range(ITERATIONS + 1))
    assert "sft/loss" in scalars and np.isfinite(scalars["sft/loss"][0])

    # The learning curve: the size plot_learning_curve draws (6 x 4 in at 100 dpi), with
    # lines and text on it (a blank figure is one colour).
    from PIL import Image

    png = Path(summary["learning_curve"])
    assert png == out / "learning_curve.png"
    with Image.open(png) as im:
        assert im.format == "PNG" and im.size == (600, 400)
        pixels = np.asarray(im.convert("RGB"))
    colours = {tuple(c) for c in pixels.reshape(-1, 3)[::7]}
    assert len(colours) > 20
    blue = np.array([31, 119, 180])  # matplotlib tab:blue, the held-out success line
    assert (np.abs(pixels.astype(int) - blue).sum(axis=-1) < 30).sum() > 100
