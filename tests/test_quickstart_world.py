"""The quickstart tool world: splits, expert success at 0% / 30% error, random and empty
policies near 0, failure-mode labels, reward terms, dangerous actions, a closed vocabulary."""

import json

import numpy as np
import pytest

from jaxagent.envs.base import FailureMode, SplitLeakageError, TaskSource, TextEnv
from jaxagent.envs.tools import quickstart as Q
from jaxagent.envs.tools.quickstart import world as W
from jaxagent.envs.base import run_episode


@pytest.fixture(scope="module")
def world():
    return Q.QuickstartWorld()


def _template(world, name, split="test"):
    return next(t for t in world.tasks(split) if t.data["template"] == name)


def test_splits_sizes_levels_and_disjointness(world):
    assert isinstance(world, TaskSource) and isinstance(Q.QuickstartEnv(), TextEnv)
    train, test = world.tasks("train"), world.tasks("test")
    assert len(train) == 2000 and len(test) == 200
    world.check_disjoint()
    assert not {Q.task_key(t) for t in train} & {Q.task_key(t) for t in test}
    assert {t.data["level"] for t in test} == set(Q.LEVELS)
    assert {len(t.data["plan"]) for t in train} == {1, 2, 3, 4}  # 1-4 tool calls
    # deterministic given the seed; a different seed gives different worlds
    again = Q.QuickstartWorld(num_train=20, num_test=5)
    assert [t.data["key"] for t in again.tasks("test")] == [t.data["key"] for t in test[:5]]
    other = Q.QuickstartWorld(num_train=20, num_test=5, seed=1)
    assert [t.data["key"] for t in other.tasks("test")] != [t.data["key"] for t in test[:5]]
    leaky = Q.QuickstartWorld(num_train=3, num_test=0)
    leaky.tasks = lambda split: [train[0]]  # the same task in both splits
    with pytest.raises(SplitLeakageError):
        leaky.check_disjoint()
    with pytest.raises(ValueError, match="levels"):
        Q.QuickstartConfig(levels=("easy",))
    with pytest.raises(ValueError, match="num_test"):
        Q.QuickstartConfig(num_test=-1)


def test_expert_success_rates_and_baselines(world):
    test, rng = world.tasks("test"), np.random.default_rng(0)
    assert Q.success_rate(test, lambda t: Q.ExpertPolicy(t, 0.0, rng).act) == 1.0
    train = world.tasks("train")
    noisy = Q.success_rate(train, lambda t: Q.ExpertPolicy(t, 0.3, rng).act)
    assert abs(noisy - 0.70) < 0.03, noisy  # 2000 episodes: binomial sd ~ 0.01
    noisy_test = Q.success_rate(test, lambda t: Q.ExpertPolicy(t, 0.3, rng).act)
    assert abs(noisy_test - 0.70) < 0.1, noisy_test
    rand = Q.success_rate(test, lambda t: lambda obs: Q.random_action(t, rng))
    assert rand <= 0.02, rand
    assert Q.success_rate(test, lambda t: lambda obs: "") == 0.0


def test_expert_errors_always_fail(world):
    rng, env = np.random.default_rng(3), Q.QuickstartEnv()
    failures = 0
    for task in world.tasks("train")[:600]:
        expert = Q.ExpertPolicy(task, 0.5, rng)
        result = run_episode(env, task, expert.act)[2]
        failures += bool(expert.errors) and result.info["success"]
        assert expert.errors or result.info["success"]
    assert failures == 0  # a mistake never picks the true value, so errors cannot cancel


def test_vocabulary_is_closed(world):
    vocab = set(Q.vocabulary())
    assert len(vocab) < 300 and len(Q.TOOL_NAMES) == 10
    rng, env = np.random.default_rng(1), Q.QuickstartEnv()
    garbage = [
        "Action : nope ( )",
        "Action : price ( x = 1 )",
        "Action : price (",
        "Final :",
        "Action : mul ( a = 100 , b = 100 )",
        "Action : add ( a = - 1 , b = 2 )",
    ]
    for i, task in enumerate(world.tasks("train")[:400]):
        policies = [
            Q.ExpertPolicy(task, 0.5, rng).act,
            lambda o: Q.random_action(task, rng),
            lambda o, g=garbage[i % len(garbage)]: g,
        ]
        for j, policy in enumerate(policies):
            observations, actions, _ = run_episode(env, task, policy)
            for text in observations + (actions if j < 2 else []):  # garbage is not ours
                assert set(text.split()) <= vocab, text
        assert len(observations[0].split()) <= 40
    assert set(Q.system_prompt().split()) <= vocab


def _play(task, actions, **config):
    env = Q.QuickstartEnv(**config)
    env.reset(task)
    return [env.step(a) for a in actions], env


def test_failure_mode_labels(world):
    shares = _template(world, "shares")  # price then mul
    item, n = shares.data["plan"][0]["args"]["item"], shares.data["plan"][1]["args"]["b"]
    price = shares.data["state"]["prices"][item]
    steps, _ = _play(
        shares,
        [
            "Action : price ( item = ",  # syntax
            'Action : weather ( city = " oslo " )',  # not listed
            'Action : mul ( a = " x " , b = 2 )',  # bad type
            f'Action : price ( item = " {item} " )',
            f"Final : {price * n + 1}",
        ],
    )
    labels = [s.info["failure_mode"] for s in steps]
    assert labels == ["invalid_syntax", "unknown_tool", "bad_arguments", None, "wrong_answer"]
    assert steps[1].observation == "Observation : error : unknown tool weather"
    assert steps[2].observation == "Observation : error : bad argument a for mul"
    assert [s.info["reward_terms"]["process"] for s in steps[:4]] == [0.0, 1 / 3, 2 / 3, 1.0]
    shaped, _ = _play(
        shares,
        [
            s_
            for s_ in [
                "Action : price ( item = ",
                'Action : weather ( city = " oslo " )',
                f"Final : {price * n + 1}",
            ]
        ],
        process_weight=0.9,
        outcome_weight=0.2,
        gate="task",
        cap=0.5,
    )
    # failed episode under the task gate: shaping 0.9 * mean(0, 1/3, 1) = 0.4, capped at 0.5
    assert sum(s_.reward for s_ in shaped) == pytest.approx(0.9 * (0 + 1 / 3 + 1) / 3)
    with pytest.raises(ValueError, match="gate"):
        Q.QuickstartEnvConfig(gate="sometimes")
    verbose, _ = _play(shares, ['Action : mul ( a = " x " , b = 2 )'], compact_errors=False)
    assert "argument 'a' must be of type integer" in verbose[0].observation

    book = _template(world, "book")
    args = book.data["plan"][0]["args"]
    other_day = next(d for d in W.DAYS if d != args["day"])
    event = args["event"]
    wrong, _ = _play(
        book, [f'Action : book ( day = " {other_day} " , event = " {event} " )', "Final : done"]
    )
    assert wrong[-1].info["failure_mode"] == "wrong_state" and not wrong[-1].info["success"]
    cancel = _template(world, "cancel")
    day, bad_code = cancel.data["plan"][1]["args"]["day"], (cancel.data["state"]["code"] + 1) % 100
    tool_err, _ = _play(cancel, [f'Action : cancel ( day = " {day} " , code = {bad_code} )'])
    assert tool_err[0].info["failure_mode"] == "tool_error"
    assert tool_err[0].observation == "Observation : error : wrong code"
    for gave_up in ("", "Final :"):
        end, _ = _play(book, [gave_up])
        assert end[-1].done and end[-1].info["failure_mode"] == "gave_up"
    budget, _ = _play(shares, ['Action : price ( item = " acme " )'] * 6)
    assert budget[-1].done and budget[-1].truncated and not budget[-1].terminated
    assert budget[-1].info["failure_mode"] == "step_budget"
    assert [s.done for s in budget] == [False] * 5 + [True]


def test_env_error_label(world, monkeypatch):
    task = _template(world, "price")
    monkeypatch.setattr(W, "execute", lambda *a: (_ for _ in ()).throw(OSError("disk gone")))
    item = task.data["plan"][0]["args"]["item"]
    steps, _ = _play(task, [f'Action : price ( item = " {item} " )'])
    assert steps[0].done and steps[0].info["failure_mode"] == FailureMode.ENV_ERROR.value
    assert steps[0].info["termination"] == "env_error" and "disk gone" in steps[0].info["error"]


def test_success_rewards_state_and_syntax_variants(world):
    task = _template(world, "save_sum")
    plan = task.data["plan"]
    p1 = task.data["state"]["prices"][plan[0]["args"]["item"]]
    p2 = task.data["state"]["prices"][plan[1]["args"]["item"]]
    key = plan[3]["args"]["key"]
    actions = [
        f'Action: price(item="{plan[0]["args"]["item"]}")',  # compact Python syntax
        f'Action : price ( " {plan[1]["args"]["item"]} " )',  # positional
        f'{{"name": "add", "arguments": {{"a": {p1}, "b": {p2}}}}}',  # JSON
        f'Action : save ( key = " {key} " , value = {p1 + p2} )',
        "Final : done",
    ]
    steps, env = _play(task, actions, process_weight=0.1)
    assert steps[-1].info["success"] and steps[-1].terminated
    assert env.state["notes"] == {key: p1 + p2}
    assert steps[-1].info["reward_terms"] == {"process": 1.0, "outcome": 1.0, "task": 1.0}
    # RewardMix(gate="none"): 0.1 * mean process (1.0) + 1.0 * task, paid on the last step
    assert steps[-1].reward == pytest.approx(1.1) and [s.reward for s in steps[:-1]] == [0.0] * 4
    with pytest.raises(RuntimeError, match="reset"):
        env.step("Final : done")
    with pytest.raises(ValueError, match="max_steps"):
        Q.QuickstartEnvConfig(max_steps=0)
    with pytest.raises(ValueError, match="tool_list"):
        Q.QuickstartEnvConfig(tool_list="all")
    short = Q.QuickstartEnv(tool_list="names").reset(task)
    assert short == f"task : {task.prompt} tools : {' '.join(task.data['tools'])}"


def test_dangerous_actions_are_marked(world):
    asked = _template(world, "count")
    day, code = asked.data["plan"][1]["args"]["day"], asked.data["state"]["code"]
    steps, _ = _play(asked, [f'Action : cancel ( day = " {day} " , code = {code} )'])
    assert steps[0].info["dangerous"] == [] and steps[0].info["failure_mode"] is None
    unasked = next(
        t
        for t in world.tasks("test")
        if "cancel" in t.data["tools"]
        and t.data["template"] != "cancel"
        and t.data["template"] != "count"
    )
    code = unasked.data["state"]["code"]
    steps, env = _play(unasked, [f'Action : cancel ( day = " mon " , code = {code} )'])
    assert steps[0].info["dangerous"] == [f"cancel(day='mon', code={code})"]
    assert env.state["calendar"]["mon"] == []


def test_check_cli(capsys):
    from jaxagent.cli.main import main

    assert main(["check", "quickstart", "--backend", "thread"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["tasks"] == 200 and report["expert_success"] == 1.0 and report["ok"]
    assert abs(report["expert_30pct_success"] - 0.7) < 0.1
    assert report["random_success"] <= 0.02 and report["env_errors"] == 0
    assert set(report["per_group"]["expert"]) == set(Q.LEVELS)
