"""configs/web_quickstart.yaml: RL and SFT on train layouts, evaluation on held-out layouts,
and one shrunken iteration end to end (SFT on the imperfect expert -> LOOP -> eval)."""

from pathlib import Path

import numpy as np
import pytest

from jaxagent.train.config import load_config

CONFIG = Path(__file__).parent.parent / "configs" / "web_quickstart.yaml"
SHRINK = [
    "model.hidden_size=32",
    "model.num_layers=1",
    "model.num_heads=2",
    "model.num_kv_heads=1",
    "model.intermediate_size=64",
    "env.options.num_train=24",
    "env.options.num_test=4",
    "rollout.tasks_per_iteration=2",
    "rollout.samples_per_task=2",
    "rollout.max_turns=3",
    "rl.update.minibatch_size=4",
    "rl.update.microbatch_size=2",  # the recipe accumulates over microbatches (8 of 32)
    "sft.num_demos=4",
    "sft.steps=2",
    "sft.batch_size=2",
    "eval.num_tasks=4",
    "eval.val_tasks=4",
    "eval.every=1",
    "train.iterations=1",
    "train.checkpoint_every=1",
    "train.progress=none",
    "train.tensorboard=false",
    "train.plot=false",
]


def test_training_tasks_and_held_out_tasks_use_disjoint_layouts():
    from jaxagent.envs.registry import get_env_spec
    from jaxagent.train.run import split_tasks

    config = load_config(CONFIG, ["env.options.num_train=2000"])
    spec = get_env_spec(config.env.name, dict(config.env.options))
    splits = split_tasks(config, spec)
    train = {t.data["layout_id"] for t in splits.train + splits.sft + splits.val}
    held_out = {t.data["layout_id"] for t in splits.eval}
    assert len(train) == 400 and len(held_out) == 20 and not train & held_out
    assert len(splits.eval) == 100 and len(splits.val) == 50


@pytest.mark.slow  # 191 s at load 12 on 2 cores; tests/test_configs.py runs it shrunken too
def test_web_quickstart_runs_one_shrunken_iteration(tmp_path):
    from jaxagent.train.metrics_log import read_jsonl
    from jaxagent.train.trainer import Trainer

    config = load_config(CONFIG, SHRINK + [f"train.out_dir={tmp_path}/run"])
    trainer = Trainer(config, echo=lambda s: None)
    summary = trainer.run()
    records = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    rec = [r for r in records if r["step"] == 1 and "loss/total" in r][0]
    assert np.isfinite(rec["loss/total"]) and rec["train/episodes"] == 4
    assert rec["eval/episodes"] == 4 and rec.get("env_health/env_error_episodes", 0) == 0
    assert {"success_before_rl", "success_after_rl", "avg_steps", "wall_s"} <= set(summary)
    # the SFT demonstrations came from the shop's expert through the episode loop
    sft = [r for r in records if "sft/loss" in r]
    assert sft and np.isfinite(sft[-1]["sft/loss"])
