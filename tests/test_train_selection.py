"""Model selection and the RL learning-rate schedule of the trainer.

- ``eval.val_tasks``: validation tasks are carved from the train split (never trained on, never
  from the test split); the checkpoint with the best validation success is kept, tested once,
  and the summary's ``success_best_val`` is what that checkpoint really scores.
- ``rl.lr_schedule``: "constant" is exactly the recipe's optimiser; "cosine" / "linear" start
  at the peak and end at ``lr_final_ratio`` of it after the run's optimiser steps.
"""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxagent.rl.recipes import get_recipe
from jaxagent.rl.train_state import make_optimizer
from jaxagent.train.config import load_config
from jaxagent.errors import ConfigError
from jaxagent.train.policy import rl_optimizer

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
    "rollout.tasks_per_iteration=4",
    "rollout.samples_per_task=2",
    "rollout.max_turns=2",
    "rollout.max_new_tokens=8",
    "rl.update.minibatch_size=4",
    "rl.optim.learning_rate=0.01",
    "sft.num_demos=8",
    "sft.steps=3",
    "sft.batch_size=2",
    "eval.num_tasks=4",
    "eval.every=2",
    "eval.val_tasks=6",
    "train.iterations=4",
    "train.checkpoint_every=0",
    "train.progress=none",
    "train.tensorboard=false",
    "train.plot=false",
    "rl.lr_schedule=cosine",
]


def _step_sizes(tx, steps):
    """|param change| per step under a constant unit gradient (Adam makes it ~ the LR)."""
    params = {"w": jnp.zeros((3,))}
    state = tx.init(params)
    grads = {"w": jnp.ones((3,))}
    out = []
    for _ in range(steps):
        updates, state = tx.update(grads, state, params)
        new = optax.apply_updates(params, updates)
        out.append(float(jnp.abs(new["w"] - params["w"])[0]))
        params = new
    return np.asarray(out)


def test_constant_schedule_is_the_recipes_optimiser():
    rl = get_recipe("loop", optim={"learning_rate": 1e-2, "warmup_steps": 3}, lora={"rank": 0})
    np.testing.assert_allclose(
        _step_sizes(rl_optimizer(rl, "constant", 20), 10),
        _step_sizes(make_optimizer(rl), 10),
        rtol=1e-6,
    )


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_decayed_schedules_fall_from_peak_to_final_ratio(schedule):
    rl = get_recipe("loop", optim={"learning_rate": 1e-2}, lora={"rank": 0})
    sizes = _step_sizes(rl_optimizer(rl, schedule, total_steps=40, final_ratio=0.1), 45)
    np.testing.assert_allclose(sizes[0], 1e-2, rtol=1e-3)
    np.testing.assert_allclose(sizes[40:], 1e-3, rtol=1e-3)  # stays at the floor
    assert np.all(np.diff(sizes[:41]) <= 1e-9)  # never rises
    assert sizes[20] < 0.75e-2  # really decays in the middle of the run
    with pytest.raises(ConfigError, match="rl.lr_schedule"):
        load_config(ROOT / "configs/quickstart.yaml", ["rl.lr_schedule=step"])
    with pytest.raises(ConfigError, match="rl.lr_final_ratio"):
        load_config(ROOT / "configs/quickstart.yaml", ["rl.lr_final_ratio=2"])


@pytest.fixture(scope="module")
def selected_run(tmp_path_factory):
    from jaxagent.train.trainer import Trainer

    out = tmp_path_factory.mktemp("sel") / "run"
    trainer = Trainer(
        load_config(ROOT / "configs/quickstart.yaml", TINY + [f"train.out_dir={out}"]),
        echo=lambda s: None,
    )
    # The tiny model barely learns, so its validation scores would all tie: script them
    # (iteration 2 best) to exercise the selection; test evaluations stay real.
    scripted, real = [0.25, 0.5, 1 / 3], trainer.evaluation.evaluate

    def evaluate(params, tag, key, split="test"):
        m = real(params, tag, key, split)
        if split == "val":
            m["val/success"] = scripted.pop(0)
        return m

    trainer.evaluation.evaluate = evaluate
    val_ids = [t.id for t in trainer.built.tasks.val]
    train_ids = {t.id for t in trainer.built.tasks.train}
    seen = {t.id for it in range(30) for t in trainer.collector.tasks(it)}  # several epochs
    summary = trainer.run()
    return out, summary, val_ids, train_ids, seen


def test_validation_tasks_come_from_train_and_are_never_trained_on(selected_run):
    out, summary, val_ids, train_ids, seen = selected_run
    cfg = load_config(ROOT / "configs/quickstart.yaml", TINY)
    from jaxagent.envs.registry import get_env_spec

    source = get_env_spec(cfg.env.name, cfg.env.options).make_source()
    all_train = [t.id for t in source.tasks("train")]
    test_ids = {t.id for t in source.tasks("test")}
    assert len(val_ids) == 6 and set(val_ids) <= set(all_train) and not set(val_ids) & test_ids
    assert not set(val_ids) & train_ids and not set(val_ids) & seen
    assert train_ids | set(val_ids) == set(all_train)
    with pytest.raises(ValueError, match="eval.val_tasks=40"):
        from jaxagent.train.trainer import Trainer

        Trainer(
            load_config(
                ROOT / "configs/quickstart.yaml",
                TINY + ["eval.val_tasks=40", f"train.out_dir={out}_bad"],
            )
        )


def test_best_validation_checkpoint_is_kept_and_scores_what_the_summary_says(selected_run):
    from jaxagent.train.session import load_policy
    from jaxagent.train.run import eval_key
    from jaxagent.train.trainer import Trainer

    out, summary, _, _, _ = selected_run
    assert summary["val_curve"] == [[0, 0.25], [2, 0.5], [4, round(1 / 3, 4)]]
    best_it = 2
    assert summary["best_val_iteration"] == best_it and summary["best_val_success"] == 0.5
    # The kept checkpoint of that iteration, evaluated afresh on the test split, scores the
    # summary's figure (the trainer selected it on validation alone, then tested it once).
    policy = load_policy(out, step=best_it)
    fresh = Trainer(
        load_config(out / "config.yaml", [f"train.out_dir={out}_check"]), echo=lambda s: None
    )
    m = fresh.evaluation.evaluate(
        policy.params, "check", eval_key(policy.config.train.seed, best_it)
    )
    fresh.close()
    assert m["eval/success"] == summary["success_best_val"]
