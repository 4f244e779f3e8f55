"""The dialogue suite: expert >= 95% on held-out goals, random ~0, the simulator's behaviours
(seeded; patience, verbosity, mis-statements, mind changes, hang-up) and the reward."""

import dataclasses

import numpy as np
import pytest

from jaxagent.envs.base import Task
from jaxagent.envs.dialogue import domain as D
from jaxagent.envs.dialogue import policies as P
from jaxagent.envs.dialogue.env import DialogueEnv, DialogueEnvConfig
from jaxagent.envs.registry import get_env_spec

OPTS = {"num_train": 200, "num_test": 200}
# A goal with a flight, and another day that also has one (for the mind change).
_F = next(f for f in D.database() if [g for g in D.database() if g["origin"] == f["origin"]
          and g["destination"] == f["destination"] and g["day"] != f["day"]])  # fmt: skip
GOAL = {"origin": _F["origin"], "destination": _F["destination"], "day": _F["day"],
        "time": "any", "class": "any"}  # fmt: skip
OTHER_DAY = next(g["day"] for g in D.database() if g["origin"] == _F["origin"]
                 and g["destination"] == _F["destination"] and g["day"] != _F["day"])  # fmt: skip


def _run(env, task, act):
    obs, transcript, total = env.reset(task), [], 0.0
    while True:
        action = act(obs)
        result = env.step(action)
        transcript += [obs, action]
        total += result.reward
        obs = result.observation
        if result.done:
            return result, total, transcript + [obs]


def _task(goal=None, change=None, **sim):
    goal = goal or dict(GOAL)
    flight = D.query(goal)
    data = {"goal": goal, "change": change, "sim": dataclasses.asdict(D.SimulatorConfig(**sim)),
            "sim_seed": 1}  # fmt: skip
    return Task("t", "test", "book a flight", data), flight


def test_expert_completes_held_out_goals_and_random_does_not():
    spec = get_env_spec("dialogue", OPTS)
    source = spec.make_source()
    tasks = source.tasks("test")
    assert tasks[0].data["sim"]["verbosity"] == 0.6  # the held-out simulator setting
    env = spec.make_env()
    wins = [_run(env, t, spec.make_expert(t, 0.0, None).act)[0].info["success"] for t in tasks]
    assert np.mean(wins) >= 0.95, np.mean(wins)
    rng = np.random.default_rng(0)
    rand = [_run(env, t, lambda o: P.random_text_action(rng))[0].info["success"] for t in tasks]
    assert np.mean(rand) < 0.05


def test_held_out_goals_share_no_route_with_train():
    source = get_env_spec("dialogue", OPTS).make_source()
    source.check_disjoint()
    route = lambda t: (t.data["goal"]["origin"], t.data["goal"]["destination"])  # noqa: E731
    assert not {route(t) for t in source.tasks("train")} & {route(t) for t in source.tasks("test")}
    assert source.tasks("train")[0].data["sim"]["verbosity"] == 0.3


def test_the_user_is_seeded_and_a_seed_varies_it():
    spec = get_env_spec("dialogue", OPTS)
    task = spec.make_source().tasks("train")[3]
    runs = [_run(DialogueEnv(), task, P.TextPolicy(P.rule_policy).act)[2] for _ in range(2)]
    assert runs[0] == runs[1]
    openings = set()
    for s in range(12):
        env = DialogueEnv()
        env.seed(s)
        openings.add(env.reset(task))
    assert len(openings) > 1


def test_verbosity_patience_and_hang_up():
    task, _ = _task(verbosity=1.0, error_rate=0.0)
    opening = DialogueEnv().reset(task)
    assert all(D.phrase(s, v) in opening for s, v in GOAL.items())
    task, _ = _task(verbosity=0.0, error_rate=0.0, patience=2)
    env = DialogueEnv()
    assert opening.count(",") > env.reset(task).count(",")
    for _ in range(2):
        assert not env.step("request day").done
    last = env.step("request day")
    assert last.done and last.info["hangup"] and last.info["failure_mode"] == "gave_up"


def test_mis_statement_then_correction_and_a_mind_change():
    task, _ = _task(verbosity=0.0, error_rate=1.0, correct_prob=1.0)
    env = DialogueEnv()
    env.reset(task)
    reply = env.step("request time").observation
    assert "sorry , i meant" in reply  # the opening's wrong value is corrected next turn
    task, flights = _task(change=["day", OTHER_DAY], change_prob=1.0, error_rate=0.0)
    env.reset(task)
    assert env.step(f"offer {flights[0]['id']}").observation.startswith("user : actually")
    assert env.step(f"book {flights[0]['id']}").info["failure_mode"] == "wrong_state"


def test_reward_terms_completion_turn_cost_and_penalties():
    cfg = DialogueEnvConfig(turn_cost=0.05, wrong_booking_penalty=1.0, wrong_confirm_penalty=0.3)
    task, flights = _task(error_rate=0.0, change_prob=0.0)
    env = DialogueEnv(cfg)
    env.reset(task)
    assert env.step("request day").reward == pytest.approx(-0.05)
    assert env.step(f"confirm day {OTHER_DAY}").reward == pytest.approx(-0.35)  # wrong value
    assert env.step(f"confirm day {GOAL['day']}").reward == pytest.approx(-0.05)
    right = env.step(f"book {flights[0]['id']}")
    assert right.info["success"] and right.reward == pytest.approx(0.95)
    env.reset(task)
    wrong = next(f for f in D.database() if f["day"] != GOAL["day"])
    result = env.step(f"book {wrong['id']}")
    assert result.reward == pytest.approx(-1.05) and result.info["failure_mode"] == "wrong_state"
    env.reset(task)
    assert env.step("fly me").info["failure_mode"] == "invalid_syntax"


def test_rule_policy_is_reliable_but_slower_than_the_expert():
    spec = get_env_spec("dialogue", OPTS)
    tasks = spec.make_source().tasks("test")[:100]
    rule = [_run(DialogueEnv(), t, P.TextPolicy(P.rule_policy).act)[:2] for t in tasks]
    expert = [_run(DialogueEnv(), t, P.TextPolicy(P.expert_policy).act)[:2] for t in tasks]
    assert np.mean([r.info["success"] for r, _ in rule]) >= 0.9
    assert np.mean([g for _, g in expert]) > np.mean([g for _, g in rule]) + 0.1


def test_texts_stay_in_the_vocabulary_and_a_simulator_crash_is_an_env_error(monkeypatch):
    spec = get_env_spec("dialogue", OPTS)
    vocab = set(spec.vocabulary())
    for i, task in enumerate(spec.make_source().tasks("test")[:40]):
        for text in _run(
            spec.make_env(), task, spec.make_expert(task, 0.3, np.random.default_rng(i)).act
        )[2]:  # noqa: E501
            assert set(text.split()) <= vocab, text
    from jaxagent.envs.dialogue import simulator

    monkeypatch.setattr(simulator.UserSimulator, "respond", lambda *a: 1 / 0)
    env = spec.make_env()
    env.reset(spec.make_source().tasks("test")[0])
    assert env.step("request day").info["termination"] == "env_error"


def test_bad_options_name_the_field():
    with pytest.raises(Exception, match="error_rate"):
        get_env_spec("dialogue", {"error_rate": 2.0})
    with pytest.raises(Exception, match="did you mean env.options.patience"):
        get_env_spec("dialogue", {"patiense": 3})
