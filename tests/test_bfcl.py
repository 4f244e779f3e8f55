"""BFCL multi-turn adapter: ground-truth replays succeed, dropped state-changing calls fail,
every failure-mode label, readable errors, dangerous actions, the health-check CLI."""

import json
import subprocess
import sys

import pytest

pytest.importorskip("bfcl_eval", reason="pip install --no-deps bfcl-eval")

from jaxagent.envs.tools import bfcl as B  # noqa: E402
from jaxagent.envs.tools.bfcl import data as D  # noqa: E402

MULTI_TURN = (
    "multi_turn_base",
    "multi_turn_miss_func",
    "multi_turn_miss_param",
    "multi_turn_long_context",
)


def _entry(category="multi_turn_base", index=0):
    return D.load_entries(category)[index]


def _env(entry, **config):
    env = B.BFCLEnv(**config)
    obs = env.reset(D.entry_to_task(entry))
    return env, obs


def test_list_categories_counts():
    cats = B.list_categories()
    for name in MULTI_TURN:
        assert cats[name] == {"tasks": 200, "multi_turn": True}
    assert cats["simple_python"]["multi_turn"] is False
    with pytest.raises(ValueError, match="multi_turn_base"):
        D.load_entries("multi_turn_nonexistent")
    with pytest.raises(ValueError, match="not a multi-turn"):
        D.load_entries("simple_python")


def test_ground_truth_replay_all_base_tasks():
    report = B.check_category("multi_turn_base")
    assert report["tasks"] == 200
    assert report["ground_truth_success"] == 1.0, report["errors"][:3]


@pytest.mark.parametrize("category", MULTI_TURN[1:])
def test_ground_truth_replay_other_categories_sample(category):
    # miss_func (held-out functions added mid-episode), miss_param (turns with no calls),
    # long_context (long scenarios): the adapter follows the data format, not one category.
    for entry in D.load_entries(category)[::25]:
        verdict = B.replay(entry)
        assert verdict["success"], verdict


def test_dropping_a_state_changing_call_fails_sample():
    tested = 0
    for entry in D.load_entries("multi_turn_base")[::10]:
        changing = B.state_changing_calls(entry)
        if not changing:
            continue
        tested += 1
        for drop in (changing[0], changing[-1]):
            verdict = B.replay(entry, drop=drop)
            assert not verdict["success"], (entry["id"], drop)
            assert verdict["failure_mode"] in ("wrong_state", "wrong_answer", "gave_up")
    assert tested >= 15


@pytest.mark.slow
def test_every_multi_turn_category_replays_and_every_drop_fails():
    for category in MULTI_TURN:
        report = B.check_category(category)
        assert report["ground_truth_success"] == 1.0 and not report["errors"], report
    base = B.check_category("multi_turn_base", drop_check=True)  # last state-changing call
    assert base["drop_tested"] >= 150 and base["drop_failed"] == base["drop_tested"]
    for entry in D.load_entries("multi_turn_base"):  # and each state-changing call in turn
        for drop in B.state_changing_calls(entry):
            assert not B.replay(entry, drop=drop)["success"], (entry["id"], drop)


def test_turn_failure_labels_and_scores():
    entry = _entry()  # turn 0: cd document, mkdir temp, mv final_report.pdf temp
    env, obs = _env(entry)
    assert obs.startswith("Available tools:") and "User: Move 'final_report.pdf'" in obs
    assert '"name": "mkdir"' in obs
    step = env.step("[cd(folder='document'), mkdir(dir_name='temp')]")  # mv forgotten
    assert not step.done and step.info["failure_mode"] is None
    assert "mkdir(dir_name='temp') -> None" in step.observation
    end = env.step("Final: done")
    assert end.done and not end.info["success"]
    assert end.info["failure_mode"] == "wrong_state" and "does not match" in end.observation
    assert end.info["termination"] == "terminated"

    env, _ = _env(entry)
    env.step(
        "[cd(folder='document'), mkdir(dir_name='temp'), mv(source='final_report.pdf', "
        "destination='temp')]"
    )
    nxt = env.step("Final: moved it")  # turn 0 passes -> turn 1's user message
    assert not nxt.done and nxt.info["reward_terms"]["outcome"] == 1.0
    assert nxt.observation.startswith("User: Perform a detailed search using grep")
    env.step("cd(folder='temp')")  # state right, but the grep result is missing
    end = env.step("Final: done")
    assert end.info["failure_mode"] == "wrong_answer"

    env, _ = _env(entry)
    end = env.step("")  # no call at all in a turn that needs calls
    assert end.done and end.info["failure_mode"] == "gave_up"
    assert end.reward == 0.0 and end.info["reward_terms"]["outcome"] == 0.0

    shaped, _ = _env(entry, outcome_weight=0.5)  # pass turn 0 of 4, fail turn 1
    shaped.step(
        "[cd(folder='document'), mkdir(dir_name='temp'), mv(source='final_report.pdf', "
        "destination='temp')]"
    )
    assert shaped.step("Final: ok").reward == 0.0  # paid at the end
    last = shaped.step("Final: done")
    assert last.done and last.info["reward_terms"]["outcome"] == pytest.approx(1 / 4)
    assert last.reward == pytest.approx(0.5 / 4)


def test_step_level_labels_and_readable_errors():
    env, _ = _env(_entry(), max_steps_per_turn=8)
    cases = [
        ("cd(folder='document'", "invalid_syntax", "not valid syntax"),
        ("frobnicate(x=1)", "unknown_tool", "unknown tool 'frobnicate'"),
        ("mkdri(dir_name='a')", "unknown_tool", "Did you mean mkdir"),
        ("cd(folder=3)", "bad_arguments", "argument 'folder' must be of type string"),
        ("cd(folder='no_such_dir')", "tool_error", "no_such_dir"),
        ('{"name": "pwd", "arguments": {}}', None, "pwd() -> "),
    ]
    for action, label, phrase in cases:
        step = env.step(action)
        assert not step.done
        assert step.info["failure_mode"] == label, (action, step.info)
        assert phrase in step.observation, (action, step.observation)
    assert env.step("cd(folder='document')").info["reward_terms"]["process"] == 1.0

    strict, _ = _env(_entry(), strict_schema=True)
    step = strict.step("cd(folder=3)")
    assert step.info["failure_mode"] == "bad_arguments" and "->" not in step.observation
    assert step.info["reward_terms"]["process"] == pytest.approx(2 / 3)

    budget, _ = _env(_entry(), max_steps_per_turn=2)
    assert not budget.step("pwd()").done
    end = budget.step("pwd()")
    assert end.done and end.truncated and end.info["failure_mode"] == "step_budget"
    assert end.info["termination"] == "truncated"


def test_env_error_label():
    broken = dict(_entry(), involved_classes=["NoSuchAPI"], id="broken")
    env = B.BFCLEnv()
    obs = env.reset(D.entry_to_task(broken))
    assert obs.startswith("environment error")
    step = env.step("pwd()")
    assert step.done and step.info["failure_mode"] == "env_error"
    assert step.info["termination"] == "env_error" and "NoSuchAPI" in step.info["error"]
    assert step.info["env_error"] == "exception"


def test_dangerous_actions_marked_unless_asked():
    env, _ = _env(_entry())  # turn 0 asks to move a file, not to delete one
    step = env.step("[cd(folder='document'), rm(file_name='previous_report.pdf')]")
    assert step.info["dangerous"] == ["rm(file_name='previous_report.pdf')"]
    asked = next(
        e
        for e in D.load_entries("multi_turn_base")
        if any("post_tweet(" in c for c in e["ground_truth"][0])
    )
    env, _ = _env(asked)
    step = env.step("[" + ", ".join(asked["ground_truth"][0]) + "]")
    assert step.info["dangerous"] == []


def test_truncation_marker_and_source_splits():
    env, _ = _env(_entry(), max_result_chars=64)
    step = env.step("[cd(folder='document'), cat(file_name='final_report.pdf')]")
    assert "characters truncated" in step.observation, step.observation
    assert step.info["failure_mode"] is None
    source = B.BFCLSource(test_fraction=0.25)
    train, test = source.tasks("train"), source.tasks("test")
    assert len(train) + len(test) == 200 and 30 <= len(test) <= 70
    source.check_disjoint()
    assert {t.split for t in test} == {"test"}
    with pytest.raises(ValueError, match="test_fraction"):
        B.BFCLSourceConfig(test_fraction=2.0)


@pytest.mark.parametrize("category", MULTI_TURN)
def test_every_multi_turn_category_builds_with_disjoint_turns(category):
    # long_context and miss_param have user turns that recur in two entries ("Let's do 100
    # shares."): the source once refused to build them; now such entries share a split.
    from jaxagent.envs.tools.bfcl.source import user_turns

    source = B.BFCLSource(category=category)
    train, test = source.tasks("train"), source.tasks("test")
    assert len(train) + len(test) == 200 and 30 <= len(test) <= 70
    train_turns = {text for t in train for text in user_turns(t)}
    assert not train_turns & {text for t in test for text in user_turns(t)}
    # the ground truth of held-out entries replays to success (every entry: the slow test)
    assert all(B.replay(t.data)["success"] for t in test[::8])


def test_turn_groups_join_entries_transitively():
    from jaxagent.envs.tools.bfcl.source import turn_groups

    def entry(i, *turns):
        return {"id": f"e{i}", "question": [[{"role": "user", "content": t}] for t in turns]}

    # e2 shares "b" with e1 and "c" with e3; e3 joined e0 first via "d": one group of four,
    # keyed by its first entry; e4 shares nothing (a turn without a user message is no turn)
    entries = [
        entry(0, "d"),
        entry(1, "a", "b"),
        entry(3, "c", "d"),
        entry(2, "b", "c"),
        {
            "id": "e4",
            "question": [[{"role": "system", "content": "a"}], [{"role": "user", "content": "x"}]],
        },
    ]
    groups = turn_groups(entries)
    assert groups == {"e0": "e0", "e1": "e0", "e3": "e0", "e2": "e0", "e4": "e4"}


def _cli(*args, block_bfcl=False):
    prelude = "import sys; sys.modules['bfcl_eval'] = None; " if block_bfcl else "import sys; "
    code = (
        prelude + "from jaxagent.cli.main import main; "
        f"sys.exit(main(['check', 'bfcl', *{list(args)!r}]))"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_check_cli():
    check = _cli("category=multi_turn_miss_param", "--tasks", "5", "--backend", "thread")
    assert check.returncode == 0, check.stderr
    report = json.loads(check.stdout.strip().splitlines()[-1])
    assert report["suite"] == "bfcl" and report["tasks"] == 5
    # the ground truth acted out through the pool succeeds, and fails without its last
    # state-changing call
    assert report["expert_success"] == 1.0 and report["env_errors"] == 0 and report["ok"]
    assert report["drop_failed"] == report["drop_tested"] > 0 and report["failed_checks"] == []
    missing = _cli(block_bfcl=True)
    assert missing.returncode == 2
    assert "pip install --no-deps bfcl-eval" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1


def test_ground_truth_expert_solves_train_entries_and_its_mistakes_fail():
    import dataclasses

    import numpy as np

    from jaxagent.envs.base import SplitLeakageError
    from jaxagent.envs.registry import get_env_spec
    from jaxagent.envs.tools.bfcl.expert import END_TURN

    spec = get_env_spec("bfcl", {"tool_format": "compact"})
    source = spec.make_source()
    train = source.tasks("train")

    def play(task, error_rate):
        env = spec.make_env()
        obs = env.reset(task)
        expert = spec.make_expert(task, error_rate, np.random.default_rng(1))
        for _ in range(50):
            step = env.step(expert.act(obs))
            obs = step.observation
            if step.done:
                return step.info["success"]
        raise AssertionError("the expert never ended the episode")

    assert all(play(t, 0.0) for t in train[:12])
    # error rate 1: one call left out of every episode, which fails the entry (every base
    # entry changes some app's state; the health check's drop test shows that removing
    # such a call fails it), here on entries whose only call list is state-changing
    assert sum(play(t, 1.0) for t in train[:12]) <= 3
    first = spec.make_expert(train[0], 0.0, None)
    actions = [first.act("") for _ in range(2 * len(train[0].data["ground_truth"]))]
    assert actions[-1] == END_TURN and actions[0].startswith("[")
    # compact tool docs: signatures without descriptions
    env = spec.make_env()
    assert "This tool belongs" not in env.reset(train[0]).split("User:")[0]
    # the leakage check: a test entry asking a train entry's request is refused
    leak = dataclasses.replace(
        source.tasks("test")[0],
        data={**source.tasks("test")[0].data, "question": train[0].data["question"]},
    )
    source._tasks["test"][0] = leak
    with pytest.raises(SplitLeakageError, match="also a turn of train entry"):
        source.check_disjoint()
