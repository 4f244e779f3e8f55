"""``jaxagent check SUITE``: the one environment check (expert, baseline, faults)."""

from __future__ import annotations

import dataclasses
import functools
import json

from jaxagent.cli.main import main
from jaxagent.envs.base import StepResult, Task
from jaxagent.envs.registry import EnvSpec, register_env


class _Source:
    def splits(self):
        return ("train", "test")

    def tasks(self, split):
        return [Task(f"{split}-{i}", split, "say yes") for i in range(6)]


class _YesEnv:
    """One step: success when the action is "yes"."""

    def reset(self, task):
        return task.prompt

    def step(self, action):
        ok = action == "yes"
        return StepResult("bye", float(ok), True, {"success": ok})

    def close(self):
        pass


@dataclasses.dataclass(frozen=True)
class _Options:
    pass


def _build(options, expert=True):
    class Expert:
        def __init__(self, task, error_rate, rng):
            pass

        def act(self, observation):
            return "yes"

    return EnvSpec(
        name="yes_check",
        make_source=_Source,
        make_env=_YesEnv,
        system_prompt="",
        make_expert=Expert if expert else None,
    )


register_env("yes_check", _build, options=_Options, replace=True)
register_env(
    "yes_check_noexpert", functools.partial(_build, expert=False), options=_Options, replace=True
)


def _run(capsys, *argv):
    rc = main(["check", *argv])
    out, err = capsys.readouterr()
    return rc, (json.loads(out.strip().splitlines()[-1]) if out.strip() else None), err


def test_expert_beats_the_empty_baseline_and_the_line_holds_the_figures(capsys):
    rc, line, _ = _run(capsys, "yes_check", "--backend", "thread", "--seeds", "2")
    assert rc == 0 and line["ok"]
    assert line["expert_success"] == 1.0 and line["random_success"] == 0.0
    assert line["tasks"] == 6 and line["episodes"] == 2 * 2 * 6 and line["env_errors"] == 0


def test_a_suite_without_an_expert_says_so_and_fails_nothing(capsys):
    rc, line, _ = _run(capsys, "yes_check_noexpert", "--backend", "thread")
    assert rc == 0 and line["expert_success"] is None and line["random_success"] == 0.0


def test_faults_are_contained_and_counted(capsys):
    # a generous timeout: on a loaded machine a normal call must not be mistaken for a hang
    argv = ("quickstart", "--faults", "--tasks", "60", "--timeout", "3", "--backend", "thread")
    rc, line, _ = _run(capsys, *argv)
    assert rc == 0, line
    faults = line["faults"]
    assert faults["episodes_out"] == faults["episodes_in"] == 60 and faults["duplicates"] == 0
    injected = faults["injected"]
    assert sum(injected[k] for k in ("hang", "crash", "corrupt")) > 0
    pool = faults["pool"]
    assert (pool["timeouts"], pool["crashes"], pool["corrupt"]) == (
        injected["hang"],
        injected["crash"],
        injected["corrupt"],
    )


def test_bad_input_exits_2_with_one_line(capsys):
    for argv in (
        ["no_such_suite"],
        ["quickstart", "--tasks", "0"],
        ["quickstart", "--backend", "carrier_pigeon"],
        ["quickstart", "num_trian=3"],
        ["quickstart", "notanoption"],
    ):
        rc, line, err = _run(capsys, *argv)
        assert rc == 2 and line is None, argv
        assert len(err.strip().splitlines()) == 1 and err.startswith("jaxagent check"), err
