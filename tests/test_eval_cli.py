"""``jaxagent eval --out DIR`` and ``jaxagent eval --compare A B`` end to end, on the
quickstart world's scripted expert (``--policy expert``: no model is compiled, so the whole
file runs in seconds); input errors exit 2 with one line."""

import json
from pathlib import Path

import pytest

import jaxagent
from jaxagent.cli.main import main

ROOT = Path(jaxagent.__file__).parent.parent
QS = str(ROOT / "configs/quickstart.yaml")
SMALL = [
    "env.options.num_train=20",
    "env.options.num_test=6",
    "eval.num_tasks=6",
    "eval.val_tasks=4",
    "eval.samples_per_task=2",
    "model.hidden_size=32",
    "model.num_layers=1",
    "model.num_heads=2",
    "model.num_kv_heads=1",
    "model.intermediate_size=64",
]


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    base = tmp_path_factory.mktemp("eval")
    outs = {}
    for name, rate, extra in (
        ("weak", "0.8", ["--seeds", "2", "--val"]),
        ("strong", "0.0", []),
    ):
        argv = ["eval", QS, *SMALL, "--policy", "expert", "--expert-error-rate", rate]
        argv += ["--out", str(base / name), "--price-input-per-mtok", "0.5"]
        argv += ["--price-output-per-mtok", "2", *extra]
        outs[name] = argv
    return base, outs


def test_eval_out_writes_json_markdown_and_plots(records, capsys):
    base, argv = records
    assert main(argv["weak"]) == 0
    out = capsys.readouterr().out
    line = _last_json(out)
    assert out.startswith("expert (step None): 24 episodes on quickstart/test")
    assert line["episodes"] == 24 and line["out"] == str(base / "weak")
    d = base / "weak"
    assert sorted(p.name for p in d.iterdir()) == [
        "cost_vs_success.png",
        "eval.json",
        "eval.md",
        "failure_modes.png",
        "success.png",
    ]
    rec = json.loads((d / "eval.json").read_text())
    s = rec["success"]
    assert s["mean"] == line["success"] and s["ci_low"] <= s["mean"] <= s["ci_high"]
    assert isinstance(s["iqm"], float) and "over_eval_seeds" in s
    assert rec["avg_steps"] == line["avg_steps"] and rec["failure_modes"]
    assert isinstance(rec["safety_violations"], int)
    t = rec["tokens"]
    assert t["prompt"] > 0 and t["generated"] > 0
    assert rec["cost_usd"] == pytest.approx(
        ((t["prompt"] + t["observation"]) * 0.5 + t["generated"] * 2.0) / 1e6
    )
    assert rec["wall_time"]["seconds"] > 0
    assert rec["generalisation"]["held_out"] == s["mean"]
    p = rec["provenance"]
    assert p["policy"] == "expert" and p["eval_seeds"] == [0, 1] and p["train_seeds"] == [0]
    assert len(p["config_hash"]) == 16 and p["packages"]["jax"] and p["expert_error_rate"] == 0.8
    md = (d / "eval.md").read_text()
    assert "| test | 24 |" in md and "| val | 16 |" in md and "Generalisation gap" in md


def test_eval_compare_reports_the_difference_and_p_of_improvement(records, capsys):
    base, argv = records
    if not (base / "weak" / "eval.json").exists():
        assert main(argv["weak"]) == 0
    assert main(argv["strong"]) == 0
    capsys.readouterr()
    a, b = str(base / "weak" / "eval.json"), str(base / "strong" / "eval.json")
    assert main(["eval", "--compare", a, b]) == 0
    out = capsys.readouterr().out
    line = _last_json(out)
    assert "B − A:" in out and "P(B > A):" in out
    assert line["difference"] == pytest.approx(line["success_b"] - line["success_a"])
    assert line["success_b"] == 1.0 > line["success_a"]  # an expert without mistakes
    assert line["difference_ci_low"] <= line["difference"] <= line["difference_ci_high"]
    assert line["prob_improvement"] > 0.5 and line["tasks"] == 6


ERRORS = {
    "bad --seeds": (["eval", QS, "--policy", "expert", "--seeds", "0"], "--seeds 0"),
    "negative price": (
        ["eval", QS, "--policy", "expert", "--price-input-per-mtok", "-1"],
        "input_per_mtok=-1.0",
    ),
    "bad error rate": (["eval", QS, "--policy", "expert", "--expert-error-rate", "2"], "2.0"),
    "no policy": (["eval", QS], "--checkpoint"),
    "compare a missing file": (["eval", "--compare", "nope_a.json", "nope_b.json"], "nope_a"),
    "compare with a config": (["eval", QS, "--compare", "a.json", "b.json"], "--compare"),
    "compare one file": (["eval", "--compare", "a.json"], "--compare"),
    "no config": (["eval", "--policy", "expert"], "CONFIG"),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_eval_input_errors_exit_2_with_one_line(case, capsys):
    argv, named = ERRORS[case]
    rc = main(argv)
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert rc == 2 and len(lines) == 1, captured.err
    assert "Traceback" not in captured.err + captured.out
    assert named in lines[0] and lines[0].startswith("jaxagent eval"), lines[0]
