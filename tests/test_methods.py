"""Reflexion, Self-Refine and ReAct around scripted-but-imperfect quickstart policies.

The policies (``jaxagent/envs/tools/quickstart/scripted.py``) make one systematic, stateable
mistake each: ``LookalikeExpert`` calls ``quote`` where the plan says ``price`` (and back)
whenever both are listed, and heeds a lesson naming the failed call; ``ArgNameExpert`` names
every string argument ``arg`` and repeats the call on the error. Reflexion's lesson is
written from the failed transcript (``TranscriptReflector``), Self-Refine's critique from the
draft and the task's tool listing (``SignatureCritic``): each must lift success to 1 on the
tasks its policy fails, within its cap, at a measured token cost.
"""

import jax
import pytest

from jaxagent.agents.chat import ChatFormat
from jaxagent.agents.expert import ExpertTurnPolicy
from jaxagent.agents.methods import (
    MemoryRunner,
    ReAct,
    Reflexion,
    SelfRefine,
    SignatureCritic,
    SignatureReviser,
    TranscriptReflector,
    merge_attempts,
    method_tokens,
)
from jaxagent.envs.tools.quickstart.scripted import ArgNameExpert, LookalikeExpert, failed_tools
from jaxagent.agents.rollout import Budget, RolloutSpec, collect_episodes
from jaxagent.agents.runner import InlineRunner
from jaxagent.envs.tools.quickstart import QuickstartConfig, QuickstartEnv, QuickstartWorld
from jaxagent.envs.tools.quickstart import vocabulary
from jaxagent.eval.protocol import EvalGroup, build_record
from jaxagent.train.tokenizer import build_word_tokenizer

EXTRA = "lesson memory attempt failed after calls final none critique takes not listed name"


@pytest.fixture(scope="module")
def setup():
    chat = ChatFormat(build_word_tokenizer(vocabulary() + EXTRA.split()))
    tasks = QuickstartWorld(QuickstartConfig(num_train=0, num_test=40)).tasks("test")
    budget = Budget(max_turns=6, max_new_tokens=64, max_total_tokens=4096)
    spec = RolloutSpec(chat, "", budget, InlineRunner(QuickstartEnv))
    return chat, tasks, spec


def _policy(chat, make):
    return ExpertTurnPolicy(make, chat, error_rate=0.0, seed=0)


def _record(eps):
    return build_record([EvalGroup(eps)], reps=200)


def _lookalike_tasks(tasks):
    return [t for t in tasks if {"price", "quote"} <= set(t.data["tools"])]


def test_reflexion_learns_the_lookalike_lesson(setup):
    chat, tasks, spec = setup
    key = jax.random.key(0)
    base, _ = collect_episodes(
        _policy(chat, LookalikeExpert), None, tasks, samples_per_task=2, spec=spec, key=key
    )
    confusable = {t.id for t in _lookalike_tasks(tasks)}
    assert confusable and all(not ep.success for ep in base if ep.task.id in confusable)
    assert all(ep.success for ep in base if ep.task.id not in confusable)
    method = Reflexion(TranscriptReflector(chat), max_attempts=3)
    eps = method.run(
        _policy(chat, LookalikeExpert), None, tasks, samples_per_task=2, spec=spec, key=key
    )
    assert [ep.task.id for ep in eps] == [ep.task.id for ep in base]
    assert all(ep.success for ep in eps)
    for ep in eps:
        m = ep.info["method"]
        if ep.task.id in confusable:
            # one failure, one lesson naming the failed look-alike call, then success
            assert m["attempt_success"] == [False, True]
            assert len(m["lessons"]) == 1 and failed_tools("memory : " + m["lessons"][0])
            assert "wrong_answer" in m["lessons"][0]
        else:
            assert m["attempt_success"] == [True] and m["lessons"] == []
    b, r = _record(base), _record(eps)
    assert b["success"]["mean"] <= 0.8 and r["success"]["mean"] == 1.0
    # the extra cost: every attempt's tokens plus the reflections, in the eval record
    assert r["tokens"]["generated"] > b["tokens"]["generated"]
    assert r["tokens"]["input"] > b["tokens"]["input"]
    assert sum(method_tokens(ep)["generated"] for ep in eps) > 0
    assert r["avg_steps"] > b["avg_steps"]  # the retries' steps count


def test_reflexion_caps_attempts_and_one_attempt_is_the_policy(setup):
    chat, tasks, spec = setup
    key = jax.random.key(1)
    never = Reflexion(TranscriptReflector(chat), max_attempts=3).run(
        _policy(chat, ArgNameExpert), None, tasks[:8], samples_per_task=1, spec=spec, key=key
    )
    assert all(not ep.success for ep in never)  # the lesson does not fix this mistake
    assert [ep.info["method"]["attempts"] for ep in never] == [3] * 8
    assert all(len(ep.info["method"]["lessons"]) == 2 for ep in never)  # none after the last
    single = Reflexion(TranscriptReflector(chat), max_attempts=1).run(
        _policy(chat, LookalikeExpert), None, tasks, samples_per_task=1, spec=spec, key=key
    )
    base, _ = collect_episodes(
        _policy(chat, LookalikeExpert), None, tasks, samples_per_task=1, spec=spec, key=key
    )
    assert [e.tokens for e in single] == [e.tokens for e in base]
    assert [e.success for e in single] == [e.success for e in base]
    with pytest.raises(ValueError, match="max_attempts=0"):
        Reflexion(TranscriptReflector(chat), max_attempts=0)


def test_self_refine_fixes_argument_names_within_its_cap(setup):
    chat, tasks, spec = setup
    key = jax.random.key(2)
    base, _ = collect_episodes(
        _policy(chat, ArgNameExpert), None, tasks, samples_per_task=1, spec=spec, key=key
    )
    # every task has a string argument somewhere; the repeated bad call never succeeds
    assert sum(ep.success for ep in base) == 0
    assert all(ep.failure_mode == "step_budget" for ep in base)
    eps = SelfRefine(chat, SignatureCritic(), SignatureReviser(), max_rounds=2).run(
        _policy(chat, ArgNameExpert), None, tasks, samples_per_task=1, spec=spec, key=key
    )
    assert all(ep.success for ep in eps)
    assert all('arg = "' not in t.action for ep in eps for t in ep.turns)
    b, r = _record(base), _record(eps)
    assert r["success"]["mean"] == 1.0 and b["success"]["mean"] == 0.0
    assert all(ep.info["method"]["revisions"] >= 1 for ep in eps)
    assert all(method_tokens(ep)["generated"] > 0 for ep in eps)
    assert r["avg_steps"] < b["avg_steps"]  # revisions cost tokens, not steps


class _Nagging:
    """A critic that is never satisfied: only the cap stops the rounds."""

    def critique(self, first_observation, draft):
        return "critique : not name"


class _Echo:
    def revise(self, first_observation, draft, critique):
        return draft


def test_self_refine_respects_max_rounds(setup):
    chat, tasks, spec = setup
    for cap in (1, 3):
        eps = SelfRefine(chat, _Nagging(), _Echo(), max_rounds=cap).run(
            _policy(chat, LookalikeExpert),
            None,
            tasks[:6],
            samples_per_task=1,
            spec=spec,
            key=jax.random.key(0),
        )
        assert [ep.info["method"]["revisions"] for ep in eps] == [cap * ep.num_turns for ep in eps]
    with pytest.raises(ValueError, match="max_rounds=0"):
        from jaxagent.agents.methods import SelfRefinePolicy

        SelfRefinePolicy(_policy(chat, LookalikeExpert), chat, _Nagging(), _Echo(), 0)


def test_signature_critic_and_reviser():
    obs = "task : what is the price of acme ? tools : price ( item ) book ( day , event )"
    assert SignatureCritic().critique(obs, 'Action : price ( item = " acme " )') is None
    assert SignatureCritic().critique(obs, "Final : 12") is None
    fb = SignatureCritic().critique(obs, 'Action : book ( name = " mon " , event = " gym " )')
    assert fb == "critique : book takes ( day , event ) not name"
    fixed = SignatureReviser().revise(obs, 'Action : book ( name = " mon " , event = " gym " )', fb)
    assert fixed == 'Action : book ( day = " mon " , event = " gym " )'
    assert "not listed" in SignatureCritic().critique(obs, "Action : quote ( item = 1 )")


def test_react_adds_thoughts_keeps_success_and_costs_tokens(setup):
    chat, tasks, spec = setup
    key = jax.random.key(3)
    base, _ = collect_episodes(
        _policy(chat, LookalikeExpert), None, tasks, samples_per_task=1, spec=spec, key=key
    )
    eps = ReAct(chat).run(
        _policy(chat, LookalikeExpert), None, tasks, samples_per_task=1, spec=spec, key=key
    )
    assert all(t.action.startswith("Thought : ") for ep in eps for t in ep.turns)
    assert [e.success for e in eps] == [e.success for e in base]
    assert _record(eps)["tokens"]["generated"] > _record(base)["tokens"]["generated"]


def test_memory_runner_and_merge(setup):
    chat, tasks, spec = setup
    runner = MemoryRunner(spec.runner, ["memory : lesson : x", ""])
    replies = runner.reset([0, 1], tasks[:2])
    assert replies[0].observation.startswith("memory : lesson : x task : ")
    assert replies[1].observation.startswith("task : ")
    eps, _ = collect_episodes(
        _policy(chat, LookalikeExpert),
        None,
        tasks[:2],
        samples_per_task=1,
        spec=spec,
        key=jax.random.key(0),
    )
    merged = merge_attempts(eps)
    assert merged.tokens == eps[0].tokens + eps[1].tokens
    assert merged.num_turns == eps[0].num_turns + eps[1].num_turns
    assert merged.success == eps[1].success and merged.info["method"]["attempts"] == 2
    with pytest.raises(ValueError, match="at least one"):
        merge_attempts([])
