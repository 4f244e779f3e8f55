"""Method configs (``configs/methods/*.yaml``) and ``jaxagent eval --method`` end to end on
the scripted imperfect quickstart policies (no model is run: seconds)."""

import json
from pathlib import Path

import pytest

import jaxagent
from jaxagent.agents.methods.config import SECTIONS, load_method, parse_method
from jaxagent.cli.main import main
from jaxagent.errors import ConfigError

ROOT = Path(jaxagent.__file__).parent.parent
QS = str(ROOT / "configs/quickstart.yaml")
METHODS = sorted((ROOT / "configs/methods").glob("*.yaml"))
SMALL = [
    "env.options.num_train=20",
    "env.options.num_test=30",
    "eval.num_tasks=30",
    "eval.val_tasks=4",
    "eval.samples_per_task=1",
    "model.hidden_size=32",
    "model.num_layers=1",
    "model.num_heads=2",
    "model.num_kv_heads=1",
    "model.intermediate_size=64",
]


def test_every_method_has_a_config_that_loads():
    names = [load_method(p).method for p in METHODS]
    assert sorted(names) == sorted(SECTIONS)
    assert load_method(ROOT / "configs/methods/reflexion.yaml").section.max_attempts == 3


@pytest.mark.parametrize(
    "data, match",
    [
        ({"method": "reflexoin"}, r"method='reflexoin' is unknown \(did you mean 'reflexion'\?\)"),
        ({"method": "reflexion", "max_attempt": 2}, r"unknown key 'max_attempt'.*'max_attempts'"),
        ({"method": "reflexion", "max_attempts": 0}, r"reflexion.max_attempts=0 must be >= 1"),
        ({"method": "reflexion", "max_attempts": "3"}, r"max_attempts='3' must be a int"),
        ({"method": "best_of_n", "verifier": "oracle"}, r"verifier='oracle'; choose one of"),
        ({"n": 3}, r"needs a 'method:' key"),
    ],
)
def test_bad_method_configs_name_the_key(data, match):
    with pytest.raises(ConfigError, match=match):
        parse_method(data)


def _eval(tmp_path, capsys, name, *extra):
    out = tmp_path / name
    argv = ["eval", QS, *SMALL, "--out", str(out), *extra]
    assert main(argv) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    return line, json.loads((out / "eval.json").read_text())


def test_eval_method_reflexion(tmp_path, capsys):
    reflexion = str(ROOT / "configs/methods/reflexion.yaml")
    line, rec = _eval(tmp_path, capsys, "refl", "--policy", "lookalike", "--method", reflexion)
    # the look-alike policy alone fails the distractor tasks (tests/test_methods.py)
    assert rec["success"]["mean"] == 1.0 and line["success"] == 1.0
    assert rec["provenance"]["method"] == {
        "method": "reflexion",
        "max_attempts": 3,
        "memory_size": 3,
        "reflector": "transcript",
    }
    assert rec["provenance"]["policy"] == "lookalike"


@pytest.mark.slow
def test_eval_method_gains_and_costs_against_the_bare_policy(tmp_path, capsys):
    reflexion = str(ROOT / "configs/methods/reflexion.yaml")
    refine = str(ROOT / "configs/methods/self_refine.yaml")
    _, base = _eval(tmp_path, capsys, "base", "--policy", "lookalike")
    _, rec = _eval(tmp_path, capsys, "refl", "--policy", "lookalike", "--method", reflexion)
    assert base["success"]["mean"] < 1.0 and rec["success"]["mean"] == 1.0
    assert rec["tokens"]["generated"] > base["tokens"]["generated"]
    assert rec["cost_usd"] >= base["cost_usd"]
    _, arg = _eval(tmp_path, capsys, "arg", "--policy", "argname")
    _, fixed = _eval(tmp_path, capsys, "argfix", "--policy", "argname", "--method", refine)
    assert arg["success"]["mean"] == 0.0 and fixed["success"]["mean"] == 1.0


def test_eval_method_input_errors_exit_2_with_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("method: dfsdt\nmax_child: 2\n")
    assert main(["eval", QS, *SMALL, "--policy", "lookalike", "--method", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown key 'max_child'" in err[0]
    assert main(["eval", QS, *SMALL, "--policy", "lookalike", "--method", "nope.yaml"]) == 2
    assert "no such file" in capsys.readouterr().err


@pytest.mark.slow
def test_eval_dfsdt_policy_proposer_needs_an_lm(capsys):
    dfsdt = str(ROOT / "configs/methods/dfsdt.yaml")  # proposer: policy
    assert main(["eval", QS, *SMALL, "--policy", "lookalike", "--method", dfsdt]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "dfsdt.proposer needs an LM policy" in err[0]
