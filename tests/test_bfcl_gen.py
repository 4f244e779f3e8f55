"""Generated long-horizon BFCL tasks (``bfcl_gen``): the expert solves them through BFCL's own
judges, its mistakes and shortcuts fail, held-out tasks are unseen compositions on unseen
states (the leakage check refuses anything else), the check CLI."""

import dataclasses
import json
import re
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("bfcl_eval", reason="pip install --no-deps bfcl-eval")

from jaxagent.envs.base import SplitLeakageError  # noqa: E402
from jaxagent.envs.registry import get_env_spec  # noqa: E402
from jaxagent.envs.tools.bfcl import generated as G  # noqa: E402

SMALL = {"num_train": 300, "num_test": 60}


@pytest.fixture(scope="module")
def spec():
    return get_env_spec("bfcl_gen", SMALL)


def _play(spec, task, actions=None, error_rate=0.0, seed=1):
    """Runs the expert (or the given actions); returns the last step and the observations."""
    env = spec.make_env()
    obs = env.reset(task)
    expert = spec.make_expert(task, error_rate, np.random.default_rng(seed))
    seen = [obs]
    for i in range(60):
        action = actions[i] if actions is not None else expert.act(obs)
        step = env.step(action)
        obs = step.observation
        seen.append(obs)
        if step.done:
            return step, seen
    raise AssertionError("the episode never ended")


def test_expert_solves_both_splits_and_its_mistakes_fail(spec):
    source = spec.make_source()
    train, test = source.tasks("train"), source.tasks("test")
    assert len(train) == 300 and len(test) == 60
    for task in train[:40] + test[:40]:
        step, _ = _play(spec, task)
        assert step.info["success"], (task.id, step.observation)
    # error rate 1: one call left out of each episode; its result is missing (BFCL's response
    # checker) or the state differs, so nearly every episode fails
    failed = [not _play(spec, t, error_rate=1.0)[0].info["success"] for t in train[:40]]
    assert np.mean(failed) >= 0.9


def test_state_and_answers_are_judged(spec):
    tasks = spec.make_source().tasks("train")
    buy = next(t for t in tasks if t.data["composition"][0] == "trade_buy")
    good = spec.make_expert(buy, 0.0, None)._actions
    order = next(i for i, a in enumerate(good) if "place_order" in a)
    # a wrong price (not the one looked up): BFCL's state checker fails the turn
    wrong = re.sub(r"price=([0-9.]+)", lambda m: f"price={float(m.group(1)) + 1.0}", good[order])
    step, _ = _play(spec, buy, good[:order] + [wrong] + good[order + 1 :])
    assert not step.info["success"] and step.info["failure_mode"] == "wrong_state"
    # the order skipped: wrong state as well
    step, _ = _play(spec, buy, good[:order] + good[order + 1 :])
    assert step.info["failure_mode"] in ("wrong_state", "wrong_answer")

    asks = next(t for t in tasks if t.data["answers"][0])  # a question in the first turn
    good = spec.make_expert(asks, 0.0, None)._actions
    end = next(i for i, a in enumerate(good) if a.startswith("Final:"))
    answer = asks.data["answers"][0][0]
    assert answer in good[end]
    step, _ = _play(spec, asks, good[:end] + ["Final: done"] + good[end + 1 :])
    assert not step.info["success"] and step.info["failure_mode"] == "wrong_answer"
    assert "does not contain the answer" in step.observation


def test_tasks_are_long_and_need_earlier_results(spec):
    tasks = spec.make_source().tasks("train")
    calls = [sum(map(len, t.data["ground_truth"])) for t in tasks]
    assert min(calls) >= 5 and max(calls) <= 15 and np.mean(calls) >= 7
    assert all(2 <= len(t.data["question"]) <= 3 for t in tasks)
    # a later step of a turn uses a value (symbol, price, user id, ticket id, folder, line)
    # shown in an earlier result of that turn and not in the user's request
    uses = 0
    for task in tasks[:60]:
        for turn, steps in enumerate(task.data["steps"]):
            request = task.data["question"][turn][0]["content"]
            expert_steps = ["[" + ", ".join(s) + "]" for s in steps]
            env = spec.make_env()
            env.reset(task)
            for prev in range(turn):  # replay the earlier turns
                for s in task.data["steps"][prev]:
                    env.step("[" + ", ".join(s) + "]")
                env.step("Final: " + ", ".join(task.data["answers"][prev]))
            shown = env.step(expert_steps[0]).observation
            later = " ".join(expert_steps[1:])
            values = re.findall(r"=('[^']+'|[0-9.]+)", later)
            uses += any(v.strip("'") in shown and v.strip("'") not in request for v in values)
    assert uses >= 100  # of about 150 turns: most turns read an earlier result
    # distractors: tools the task never calls are listed too
    task = tasks[0]
    used = {c.split("(")[0] for turn in task.data["ground_truth"] for c in turn}
    assert len(set(task.data["shown_functions"]) - used) == 4
    assert len(task.data["involved_classes"]) >= 2


def test_held_out_is_unseen_compositions_on_unseen_states():
    source = G.BFCLGenSource(num_train=600, num_test=100)
    train, test = source.tasks("train"), source.tasks("test")
    key = lambda t: G.composition_key(t.data["composition"])  # noqa: E731
    assert not {key(t) for t in train} & {key(t) for t in test}
    assert not {G.state_digest(t.data) for t in train} & {G.state_digest(t.data) for t in test}
    # every template is trained on: the held-out part is the composition and the state
    trained = {n for t in train for n in t.data["composition"]}
    assert {n for t in test for n in t.data["composition"]} <= trained == set(G.TEMPLATES)
    source.check_disjoint()
    # the split rests on the composition: another seed holds out other compositions
    other = G.BFCLGenSource(num_train=10, num_test=10, seed=1)
    assert set(other.combos["test"]) != set(source.combos["test"])
    # the same config draws the same tasks
    again = G.BFCLGenSource(num_train=600, num_test=100)
    assert [t.data["ground_truth"] for t in again.tasks("test")] == [
        t.data["ground_truth"] for t in test
    ]
    # the leakage check refuses a test task with a trained composition, state or requests
    for field in ("composition", "initial_config", "question"):
        leaky = G.BFCLGenSource(num_train=600, num_test=100)
        leaky.tasks("train")
        bad = dataclasses.replace(test[0], data={**test[0].data, field: train[0].data[field]})
        leaky._tasks["test"] = [bad] + test[1:]
        with pytest.raises(SplitLeakageError, match="also that of train task"):
            leaky.check_disjoint()


def test_ood_split_is_real_bfcl_entries(spec):
    ood = get_env_spec("bfcl_gen", {**SMALL, "ood_limit": 3}).make_source().tasks("ood")
    assert [t.id for t in ood] == [f"multi_turn_base_{i}" for i in range(3)]
    for task in ood:
        step, _ = _play(spec, task)  # the same env and expert play the shipped entries
        assert step.info["success"]


def test_options_errors():
    with pytest.raises(ValueError, match="test_fraction"):
        G.BFCLGenConfig(test_fraction=1.0)
    with pytest.raises(ValueError, match="min_calls"):
        G.BFCLGenConfig(min_calls=14, max_calls=15, max_templates=2)


def test_episode_defaults_survive_other_episode_options():
    # One episode option (max_steps_per_turn) must not bring back the base class's defaults
    # (JSON results, JSON tool docs): a run of the recipe once trained on JSON results so.
    for options in ({}, {"max_steps_per_turn": 4}):
        spec = get_env_spec("bfcl_gen", {**SMALL, **options})
        env = spec.make_env()
        task = spec.make_source().tasks("train")[0]
        first = env.reset(task)
        assert "(" in first.splitlines()[1] and "{" not in first  # compact signatures
        action = spec.make_expert(task, 0.0, None)._actions[0]
        shown = env.step(action).observation
        assert "{" not in shown and re.search(r"-> \w+=", shown), shown


def test_check_cli():
    code = (
        "import sys; from jaxagent.cli.main import main; "
        "sys.exit(main(['check', 'bfcl_gen', 'num_train=200', 'num_test=40', "
        "'--backend', 'thread', '--workers', '2']))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["expert_success"] == 1.0 and report["random_success"] < 0.05
    assert report["leakage"] == "ok" and report["ok"] and report["tasks"] == 40
    assert 5 <= report["calls_per_task"][0] and report["calls_per_task"][2] <= 15
    assert report["longest_result"] <= 300  # every result a task reads fits the env's cut


def test_recipe_shows_every_observation_whole(spec):
    # The rollout cuts observations at rollout.max_observation_chars: at 400 the recipe's
    # first run cut the middle of the tool list out of most first prompts (up to ~790 chars).
    from pathlib import Path

    import yaml

    with open(Path(__file__).parents[1] / "configs" / "loop_bfcl_gen.yaml") as f:
        recipe = yaml.safe_load(f)
    limit = recipe["rollout"]["max_observation_chars"]
    assert recipe["env"]["options"]["max_result_chars"] <= limit
    source = spec.make_source()
    for task in source.tasks("train")[:100] + source.tasks("test")[:50]:
        _, seen = _play(spec, task)
        assert max(len(o) for o in seen) <= limit, task.id


def test_values_are_read_and_written_after_the_same_tokens(spec):
    # The first runs' SFT policies called the right tools and wrote every number wrong (838
    # as 688). Two causes, both checked here. (1) The run's BPE (learned on the train split's
    # prompts, train/run.py) merged a space into the digit after it ("Ġ5"): a value read after
    # a space began with another token than the same value written after "=". Numbers are
    # left out of the prompts, so every digit is its own token everywhere. (2) A value read
    # as '"id": 838' and written as 'ticket_id=838' follows other tokens, which an induction
    # head (attend after an earlier match of the current token, copy) cannot bridge: results
    # are shown in call syntax ('id=838'), answers written as 'id=838' too.
    from jaxagent.train.tokenizer import build_tokenizer

    tasks = spec.make_source().tasks("train")
    tok = build_tokenizer([spec.system_prompt] + [t.prompt for t in tasks[:150]], 2048)
    digits = [p for p in tok.get_vocab() if any(c.isdigit() for c in p)]
    assert digits and all(len(p) == 1 for p in digits), [p for p in digits if len(p) > 1]
    pieces = lambda text: tok.convert_ids_to_tokens(tok(text)["input_ids"])  # noqa: E731
    assert pieces("Final: id=838")[-4:] == pieces("ticket_id=838")[-4:] == ["=", "8", "3", "8"]
    copied = 0
    for task in tasks[:30]:
        _, seen = _play(spec, task)
        asked = " ".join(m["content"] for turn in task.data["question"] for m in turn)
        for i, action in enumerate(spec.make_expert(task, 0.0, None)._actions):
            read = "\n".join(seen[: i + 1])  # what the agent had read when it wrote action i
            for value in re.findall(r"(?<==)(-?\d+(?:\.\d+)?)(?![\d.])", action):
                if value in read and value not in asked:
                    assert "=" + value in read, (task.id, action, value)
                    copied += 1
    assert copied >= 30  # ids, prices, counts and results copied from earlier results
