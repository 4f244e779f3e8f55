"""SFT restarts (``sft.min_val_success`` / ``sft.max_restarts``): a fit whose validation
success stays below the threshold is redone from a new initialisation and data order, every
attempt is counted in the summary and the JSON line, the kept fit's validation figure is the
one the run starts from, and the settings that cannot work are refused by name."""

import json

import jax
import numpy as np
import pytest

from jaxagent.errors import ConfigError
from jaxagent.train.config import load_config
from jaxagent.train.trainer import Trainer
from test_train import ROOT, TINY

QS = str(ROOT / "configs/quickstart.yaml")
SFT = ["sft.enabled=true", "sft.num_demos=8", "sft.steps=3", "train.iterations=0"]


@pytest.mark.parametrize(
    "extra, named",
    [
        (["sft.max_restarts=2"], "sft.min_val_success"),
        (["sft.max_restarts=2", "sft.min_val_success=0.1", "eval.val_tasks=0"], "eval.val_tasks"),
        (["sft.max_restarts=1", "sft.min_val_success=1.5"], "sft.min_val_success"),
        (["sft.max_restarts=-1", "sft.min_val_success=0.1"], "sft.max_restarts"),
    ],
)
def test_settings_that_cannot_restart_are_refused_by_name(extra, named):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load_config(QS, [*TINY, *SFT, *extra])


def test_a_fit_below_the_threshold_is_restarted_and_counted(tmp_path, capsys):
    # 1.0 on validation is out of reach for 3 SFT steps: every attempt is redone, then the
    # last is kept and said to have missed the threshold.
    cfg = load_config(
        QS,
        [
            *TINY,
            *SFT,
            "sft.min_val_success=1.0",
            "sft.max_restarts=2",
            f"train.out_dir={tmp_path / 'run'}",
        ],
    )
    trainer = Trainer(cfg)
    firsts = []  # the first leaf of each restart's initialisation, copied before SFT donates it
    fresh = trainer._fresh_params

    def fresh_and_kept(attempt):
        params = fresh(attempt)
        firsts.append(np.array(jax.tree.leaves(params)[0]))
        return params

    trainer._fresh_params = fresh_and_kept
    summary = trainer.run()
    out = capsys.readouterr().out
    assert "restart 1 of 2" in out and "restart 2 of 2" in out, out[-2000:]
    assert "no fit reached sft.min_val_success 1.0 in 3 attempts" in out, out[-2000:]
    assert summary["sft_restarts"] == 2 and len(summary["sft_val_success"]) == 3, summary
    line = json.loads(out.strip().splitlines()[-1])
    assert line["sft_restarts"] == 2, line
    # each restart starts from its own initialisation
    assert len(firsts) == 2 and not np.array_equal(*firsts)
    # the run's validation at iteration 0 is the kept (last) fit's judgement, not a new one
    assert summary["val_curve"][0] == [0, summary["sft_val_success"][-1]], summary


def test_a_fit_that_reaches_the_threshold_is_the_run_without_restarts(tmp_path):
    """Attempt 0 is the seed's own fit: with the threshold met at once, the run equals the
    same run with restarts off (same validation and held-out figures, same SFT loss)."""
    runs = {}
    for name, extra in {
        "off": [],
        "on": ["sft.min_val_success=0.01", "sft.max_restarts=1"],
    }.items():
        cfg = load_config(QS, [*TINY, *SFT, *extra, f"train.out_dir={tmp_path / name}"])
        trainer = Trainer(cfg)
        # validation success 1.0 whatever the fit: the threshold is met by attempt 0
        validate = trainer.evaluation.validate

        def always_met(params, it, extra, validate=validate):
            m = validate(params, it, extra)
            return {**m, "val/success": 1.0}

        trainer.evaluation.validate = always_met
        runs[name] = trainer.run()
        runs[name]["sft_loss"] = json.loads(
            (tmp_path / name / "metrics.jsonl").read_text().splitlines()[0]
        ).get("sft/loss")
    off, on = runs["off"], runs["on"]
    assert on["sft_restarts"] == 0 and "sft_restarts" not in off
    assert on["success_before_rl"] == off["success_before_rl"]
    assert on["sft_loss"] == off["sft_loss"] and on["sft_loss"] is not None
