"""Tool calls constrained to their schemas: every call the sampler draws validates, and the
learner's log-probs are those of the masked distribution the sampler drew from.

A random quickstart model (word-level tokenizer) under ``rollout.constrained_tool_calls``:
unconstrained, none of its turns is a valid call; constrained, every turn is a schema-valid
call or a final answer, the lock-step driver and the slot engine sample the same tokens, and
the learner's log-probs under the recorded masks equal the sampler's (fp32, 1e-4) while the
unmasked ones do not.
"""

import re

import jax
import numpy as np
import pytest
from episode_checks import assert_same_episodes

from jaxagent.agents.batch import pack_episodes
from jaxagent.agents.cached import CachedTurnSampler
from jaxagent.agents.chat import ChatFormat
from jaxagent.agents.constrained import tool_call_grammar
from jaxagent.agents.engine import SlotEngine
from jaxagent.agents.rollout import Budget, RolloutSpec, collect_episodes
from jaxagent.agents.runner import InlineRunner
from jaxagent.agents.task_tools import quickstart_tools
from jaxagent.envs.actions import resolve_action
from jaxagent.envs.call_grammar import turn_regex
from jaxagent.envs.registry import get_env_spec
from jaxagent.envs.tool_spec import ActionError
from jaxagent.envs.tools.quickstart.world import TOOL_SPECS
from jaxagent.errors import ConfigError
from jaxagent.generate import SamplingConfig
from jaxagent.generate.grammar import GrammarTable, token_texts
from jaxagent.models import ModelConfig, init_model
from jaxagent.rl.model_fns import model_logprob_fn
from jaxagent.train.tokenizer import build_word_tokenizer


@pytest.fixture(scope="module")
def world():
    spec = get_env_spec("quickstart", {})
    tok = build_word_tokenizer(spec.vocabulary())
    chat = ChatFormat(tok)
    cfg = ModelConfig.test(vocab_size=len(tok), max_seq_len=256)
    graphdef, params = init_model(cfg, jax.random.key(0))
    grammar = tool_call_grammar(tok, cfg.vocab_size, chat.stop_ids, "react", quickstart_tools)
    tasks = list(spec.make_source().tasks("train"))[:6]
    return spec, tok, chat, graphdef, params, grammar, tasks


def valid(action: str, task) -> bool:
    """The call validates against the task's tools (strings stripped, as the world does)."""
    text = re.sub(r'" ([^"]*?) "', r'"\1"', action)
    tools = {t: TOOL_SPECS[t] for t in task.data["tools"]}
    return not isinstance(resolve_action(text, tools, "react"), ActionError)


def test_the_turn_language_holds_the_experts_calls_and_no_invalid_one(world):
    spec, tok, *_ = world
    task = world[-1][0]
    regex = re.compile(turn_regex(quickstart_tools(task), "react"))
    expert = spec.make_expert(task, 0.0, np.random.default_rng(0))
    words = lambda text: " ".join(text.split()) + " "  # the word tokenizer's text of a turn
    action = expert.act(spec.make_env().reset(task))
    assert regex.fullmatch(words(action)), action
    name = task.data["tools"][0]
    arg = next(iter(TOOL_SPECS[name].parameters["properties"]))
    for bad in (
        f'Action : {name} ( {arg} = " nowhere " )',  # not in the enum / not an integer
        f"Action : {name} ( {arg} = 121 )",  # past the world's maximum
        "Action : unknown_tool ( )",
        "hello there",
    ):
        assert not regex.fullmatch(words(bad)), bad


def test_a_language_the_vocabulary_cannot_write_is_refused(world):
    _, tok, chat, *_ = world
    table = GrammarTable(token_texts(tok, len(tok)), chat.stop_ids)
    with pytest.raises(ConfigError, match="cannot write"):
        table.start(r"\{[ ]?\}")  # the word vocabulary has no braces


def _run(world, policy, constrained, turns=3):
    spec, tok, chat, graphdef, params, grammar, tasks = world
    budget = Budget(max_turns=turns, max_new_tokens=24, max_total_tokens=240)
    rollout = RolloutSpec(chat, spec.system_prompt, budget, InlineRunner(spec.make_env))
    policy.grammar = grammar if constrained else None
    return collect_episodes(
        policy, params, tasks, samples_per_task=2, spec=rollout, key=jax.random.key(1)
    )[0]


def _sampling(chat):
    return SamplingConfig(max_new_tokens=24, temperature=1.0, stop_token_ids=chat.stop_ids)


def test_constrained_calls_validate_and_learner_logprobs_are_the_masked_ones(world):
    _, _, chat, graphdef, params, *_ = world
    lock = _run(world, CachedTurnSampler(graphdef, _sampling(chat), 240, chat.pad_id), True)
    turns = [(t.action, ep.task) for ep in lock for t in ep.turns]
    calls = [(a, task) for a, task in turns if a.startswith("Action")]
    assert len(calls) >= 5
    assert all(valid(a, task) for a, task in calls)  # 100% of the drawn calls
    assert all(a.startswith(("Action", "Final")) for a, _ in turns)

    batch = pack_episodes(lock, pad_id=chat.pad_id, max_len=256, length_multiple=16)
    constraint = (batch.constraint_ids, batch.constraint_masks)
    mask = batch.loss_mask > 0
    assert ((batch.constraint_ids >= 0) == mask).all()  # every sampled token was constrained
    learner = model_logprob_fn(graphdef)
    masked = np.asarray(learner(params, *_rows(batch), constraint=constraint)[0])
    free_lp = np.asarray(learner(params, *_rows(batch))[0])
    np.testing.assert_allclose(masked[mask], batch.old_logprobs[mask], atol=1e-4, rtol=0)
    assert np.abs(free_lp[mask] - batch.old_logprobs[mask]).max() > 1.0


@pytest.mark.slow  # 25 s: two more rollouts (CI runs the lock-step case above)
def test_unconstrained_calls_fail_and_the_engine_samples_what_lockstep_does(world):
    _, _, chat, graphdef, params, *_ = world
    free = _run(world, CachedTurnSampler(graphdef, _sampling(chat), 240, chat.pad_id), False, 2)
    assert not any(valid(t.action, ep.task) for ep in free for t in ep.turns)
    assert not any(ep.constraint_masks for ep in free)
    lock = _run(world, CachedTurnSampler(graphdef, _sampling(chat), 240, chat.pad_id), True)
    engine = SlotEngine(graphdef, _sampling(chat), 240, chat.pad_id, slots=4, decode_steps=5)
    eps = _run(world, engine, True)
    assert_same_episodes(eps, lock)


def _rows(batch):
    return batch.tokens, batch.positions, batch.segment_ids


class _Renderer:
    """Each message is one id (its content's length), so cuts are easy to count."""

    def first(self, messages, tools):
        return [100 + len(m["content"]) for m in messages]

    def after_turn(self, messages):
        return [200 + len(m["content"]) for m in messages]


def test_a_divergence_cuts_a_sessions_constrained_masks_with_its_tokens():
    # The session keeps the driver's Episode record; a cut back past a constrained turn must
    # drop that turn's masks, or the learner would renormalise kept tokens by a dropped mask.
    from jaxagent.serve.sessions import Sampled, Session

    a, b, c = b"\x01", b"\x02", b"\x04"
    user = {"role": "user", "content": "hi"}

    def turn(text, masks):
        ids = list(range(len(masks)))
        message = {"role": "assistant", "content": text}
        return Sampled(ids, [-0.5] * len(ids), message, text, masks)

    s, r = Session(id="x"), _Renderer()
    first = turn("one", [a, None, b])
    s.commit(s.plan([user], None, r), None, first, version=3)
    tool = {"role": "user", "content": "more"}
    history = [user, first.message, tool]
    s.commit(s.plan(history, None, r), None, turn("two", [c, a]), version=4)
    ep = s.episode(1.0)
    assert ep.constraint_masks == [a, b, c]
    assert ep.constraint_ids == [-1, 0, -1, 1, -1, 2, 0]
    assert ep.versions == [-1, 3, 3, 3, -1, 4, 4]

    # the harness edits its second message: cut back to the first turn's end
    plan = s.plan([user, first.message, {"role": "user", "content": "else"}], None, r)
    assert plan.divergence["dropped_sampled_tokens"] == 2 and plan.cut_tokens == 4
    s.commit(plan, None, turn("three", [None]), version=5)
    ep = s.episode(0.0)
    assert ep.constraint_masks == [a, b]
    assert ep.constraint_ids == [-1, 0, -1, 1, -1, -1]
    assert ep.versions == [-1, 3, 3, 3, -1, 5] and ep.info["policy_versions"] == [3, 5]

    # cut back to the start: nothing constrained is left
    s.commit(s.plan([{"role": "user", "content": "new"}], None, r), None, turn("x", [None]), 6)
    ep = s.episode(0.0)
    assert ep.constraint_masks == [] and ep.constraint_ids == []
    assert len(ep.tokens) == len(ep.loss_mask) == len(ep.versions) == 2
