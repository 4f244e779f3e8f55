"""The roofline record of a trainer iteration counts the optimiser steps the update took.

``time/update_mbu`` is 8 x the parameter bytes per optimiser step over the update's seconds
(``jaxagent.perf.roofline``). With 4 rows, minibatches of 2 and one epoch the update takes 2
steps (``optim/steps``); a count read off the epochs alone would say 1 and halve the figure.
"""

from pathlib import Path

import numpy as np

from jaxagent.train.config import load_config

ROOT = Path(__file__).parent.parent
TINY = [
    "model.hidden_size=32",
    "model.num_layers=1",
    "model.num_heads=2",
    "model.num_kv_heads=1",
    "model.intermediate_size=64",
    "model.max_seq_len=160",
    "env.options.num_train=40",
    "env.options.num_test=4",
    "rl.recipe=ppo",
    "model.value_head=true",
    "rollout.tasks_per_iteration=4",
    "rollout.samples_per_task=1",
    "rollout.max_turns=1",
    "rollout.max_new_tokens=8",
    "rl.update.minibatch_size=2",
    "rl.update.num_epochs=1",
    "rl.update.remat=false",
    "sft.steps=0",
    "eval.val_tasks=4",
    "train.progress=none",
    "train.tensorboard=false",
]


def test_roofline_counts_every_minibatch_step(tmp_path):
    from jaxagent.train.trainer import Trainer

    trainer = Trainer(
        load_config(ROOT / "configs/quickstart.yaml", TINY + [f"train.out_dir={tmp_path}"]),
        echo=lambda s: None,
    )
    roof = trainer.collector.roofline
    try:
        _, m = trainer.iteration(trainer.states.new(trainer.take_initial_params()), 0)
    finally:
        trainer.close()
    assert m["batch/rows"] == 4 and m["optim/steps"] == 2  # 2 minibatches, one epoch
    steps = m["time/update_mbu"] * m["time/update_s"] * roof.peak_bytes_s / (8 * roof.param_bytes)
    np.testing.assert_allclose(steps, 2, rtol=1e-6)
