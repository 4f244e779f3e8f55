"""The math suite: expert 100%, random ~0, splits by template/difficulty, leakage, failures."""

import dataclasses

import numpy as np
import pytest

from jaxagent.envs.base import SplitLeakageError, Task
from jaxagent.envs.math import MathConfig, MathEnv, MathExpert, MathSource, random_action
from jaxagent.envs.math.vocab import vocabulary
from jaxagent.envs.registry import get_env_spec

SMALL = MathConfig(num_train=300, num_test=120)


def _episode(env, task, act):
    obs, steps = env.reset(task), 0
    while True:
        result = env.step(act(obs))
        steps += 1
        if result.done:
            return result, steps
        obs = result.observation


@pytest.mark.parametrize("variant", ["answer", "tool"])
def test_expert_solves_every_held_out_problem_and_random_does_not(variant):
    spec = get_env_spec("math", {"num_train": 300, "num_test": 120, "variant": variant})
    tasks = spec.make_source().tasks("test")
    env = spec.make_env()
    wins = [
        _episode(env, t, spec.make_expert(t, 0.0, np.random.default_rng(i)).act)[0].info["success"]
        for i, t in enumerate(tasks)
    ]
    assert np.mean(wins) == 1.0
    rng = np.random.default_rng(0)
    rand = [_episode(env, t, lambda o, t=t: random_action(t, rng))[0].info for t in tasks]
    assert np.mean([r["success"] for r in rand]) < 0.05
    assert {r["failure_mode"] for r in rand if not r["success"]} == {"wrong_answer"}


def test_expert_error_rate_is_its_failure_rate():
    tasks = MathSource(SMALL).tasks("train")
    env = MathEnv(variant="tool")
    wins = [
        _episode(env, t, MathExpert(t, 0.4, np.random.default_rng(i), variant="tool").act)[0]
        .info["success"] for i, t in enumerate(tasks)
    ]  # fmt: skip
    assert 0.5 < np.mean(wins) < 0.7  # about 1 - 0.4


def test_texts_stay_in_the_closed_vocabulary():
    vocab = set(vocabulary())
    src = MathSource(SMALL)
    for i, task in enumerate(src.tasks("train")[:100] + src.tasks("test")):
        # error rate 0: a perturbed operand may give a result outside the vocabulary (then it
        # reads as <|unk|>, which is fine); correct runs must not.
        env, expert = MathEnv(variant="tool"), MathExpert(task, 0.0, variant="tool")
        texts = [env.reset(task)]
        while True:
            texts.append(expert.act(texts[-1]))
            result = env.step(texts[-1])
            texts.append(result.observation)
            if result.done:
                break
        for text in texts:
            assert set(text.split()) <= vocab, set(text.split()) - vocab


@pytest.mark.parametrize("holdout", ["template", "difficulty", "none"])
def test_splits_hold_out_templates_or_difficulties_and_pass_the_leakage_check(holdout):
    src = MathSource(SMALL, holdout=holdout)
    src.check_leakage()
    train, test = src.tasks("train"), src.tasks("test")
    cells = lambda ts: {(t.data["template"], t.data["difficulty"]) for t in ts}  # noqa: E731
    if holdout == "template":
        assert {t for t, _ in cells(train)}.isdisjoint({t for t, _ in cells(test)})
        assert {t.data["template"] for t in test} >= {"divide", "pct_what", "share", "div"}
    elif holdout == "difficulty":
        assert {d for _, d in cells(test)} == {3} and 3 not in {d for _, d in cells(train)}
    else:
        assert cells(train) >= cells(test)
    assert {t.data["level"] for t in test} == {"arith", "fraction", "word", "linear"}
    assert not {t.prompt for t in train} & {t.prompt for t in test}


def test_leakage_check_catches_a_shared_problem_and_a_held_out_cell():
    src = MathSource(SMALL)
    leak = src.tasks("test")[0]
    leaky = MathSource(SMALL)
    leaky.tasks = lambda split, _t=src.tasks: (
        _t(split) + ([dataclasses.replace(leak, id="x", split="train")] if split == "train" else [])
    )
    with pytest.raises(SplitLeakageError, match="also appears"):
        leaky.check_leakage()
    renamed = dataclasses.replace(leak, id="y", prompt="a new text", split="train")
    leaky.tasks = lambda split, _t=src.tasks: _t(split) + ([renamed] if split == "train" else [])
    with pytest.raises(SplitLeakageError, match="held-out cell"):
        leaky.check_leakage()


def test_failure_modes_and_tool_steps():
    task = Task("t", "test", "what is 2 + 3 ?", {"expr": "2 + 3", "answer": "5"})
    env = MathEnv(variant="tool", max_steps=3)
    env.reset(task)
    assert env.step('Action : calc ( expr = " 2 / 0 " )').info["failure_mode"] == "tool_error"
    assert env.step('Action : calc ( expr = " 2 + 3 " )').observation == "Observation : 5"
    last = env.step("Action : mul ( a = 1 )")
    assert last.done and last.truncated and last.info["failure_mode"] == "step_budget"
    env = MathEnv()
    env.reset(task)
    assert env.step("\\boxed{5}").reward == 1.0
    for action, mode in (
        ("", "gave_up"),
        ("Final : five", "invalid_syntax"),
        ("6", "wrong_answer"),
    ):
        env.reset(task)
        info = env.step(action).info
        assert (info["success"], info["failure_mode"]) == (False, mode)


def test_a_checker_crash_is_an_env_error_not_a_policy_failure(monkeypatch):
    from jaxagent.envs.math import checker

    def boom(*a, **k):
        raise RuntimeError("checker bug")

    monkeypatch.setattr(checker, "is_equivalent", boom)
    env = MathEnv()
    env.reset(Task("t", "test", "q", {"expr": "1", "answer": "1"}))
    info = env.step("1").info
    assert info["termination"] == "env_error" and info["failure_mode"] == "env_error"


def test_bad_options_are_refused_with_the_field():
    with pytest.raises(Exception, match="holdout"):
        get_env_spec("math", {"holdout": "random"})
    with pytest.raises(Exception, match="did you mean env.options.variant"):
        get_env_spec("math", {"varaint": "tool"})
