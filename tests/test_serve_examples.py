"""The BFCL example harness (``jaxagent.serve.examples:bfcl_harness``): the ``openai`` client
with the entry's functions as OpenAI ``tools``, the server's ``tool_calls`` executed against
the live BFCL apps, the results sent back as ``tool`` messages.

- Over a ChatML template with a scripted backend answering with BFCL's ground-truth calls in
  Hermes ``<tool_call>`` blocks: the calls come back as ``tool_calls``, run against the world,
  and solve the entry (reward 1: every turn passes BFCL's state and response checkers); the
  first context is the template's rendering with the tools block, later ones add the
  results through the template's tool role. The built-in driver writing the same answers
  records the same episode: tool role after the answers with calls, user role after those
  without.
- On a tiny random policy of ``configs/loop_bfcl.yaml`` with a ChatML tokenizer (slow): the
  conversations through ``collect_harness_episodes`` are recorded (no env error, sampled
  tokens) and equal the built-in driver's episodes for the same key. The random policy writes
  no calls, so this covers the prompt, the answers as actions and the observations as user
  turns; the scripted test covers the tool calls.
"""

import json
from pathlib import Path

import jax
import pytest
from episode_checks import assert_same_episodes
from serve_fixtures import ScriptedBackend

from jaxagent.agents.chat import TemplateChat
from jaxagent.agents.rollout import Budget, RolloutSpec, collect_episodes
from jaxagent.agents.runner import InlineRunner
from jaxagent.agents.task_tools import bfcl_tools
from jaxagent.agents.turn_policy import HostPolicy, TurnOutput
from jaxagent.envs import actions as A
from jaxagent.envs.registry import get_env_spec
from jaxagent.envs.tool_calls import render_calls
from jaxagent.serve.app import ServerState
from jaxagent.serve.harness import collect_harness_episodes, load_harness
from jaxagent.serve.render import Renderer
from jaxagent.serve.server import ServerThread
from jaxagent.train.tokenizer import build_chatml_tokenizer

ROOT = Path(__file__).resolve().parents[1]


def _bfcl_task():
    pytest.importorskip("bfcl_eval")
    return get_env_spec("bfcl", {"limit": 4}).make_source().tasks("train")[0]


def test_bfcl_harness_solves_an_entry_through_tool_calls():
    task = _bfcl_task()
    from jaxagent.envs.tools.bfcl import data as D

    # positional ground-truth arguments named as the world binds them (the method's order)
    specs = D.tool_specs(task.data, D.public_methods(D.make_instances(task.data)))
    texts, names = [], []
    for calls in task.data["ground_truth"]:
        if calls:
            parsed = A.parse_action("[" + ", ".join(calls) + "]").calls
            named = [
                (c.name, dict(c.kwargs, **dict(zip(specs[c.name].param_order, c.args))))
                for c in parsed
            ]
            texts.append(render_calls(named, "hermes"))
            names += [c.name for c in parsed]
        texts.append("done")  # a message without calls ends the user's request
    chat = TemplateChat(build_chatml_tokenizer(["cd ls mkdir folder name " + texts[0]] * 4, 400))
    assert chat.syntax == "hermes"
    backend = ScriptedBackend(chat, texts)
    backend.capacity = 10**6  # the untrained BPE spends many tokens on the tools block
    n_answers = len(texts)
    srv = ServerThread(ServerState(backend=backend, renderer=Renderer(chat), model_id="tiny"))
    try:
        harness = load_harness("jaxagent.serve.examples:bfcl_harness")
        (ep,) = collect_harness_episodes(
            srv, harness, [task], samples_per_task=1, key=jax.random.key(0)
        )
    finally:
        srv.close()
    assert not ep.env_failed, ep.error
    assert ep.reward == 1.0 and ep.success  # BFCL's checkers passed every turn
    assert len(ep.turns) == n_answers and not backend.texts
    assert ep.info["divergences"] == []  # the echoed tool calls match what was returned
    decode = chat.tokenizer.decode
    first = decode(backend.contexts[0])
    assert "<tools>" in first and all(f'"name": "{n}"' in first for n in names)
    # the first call's result comes back in the template's tool role, as a tool_response
    second = decode(backend.contexts[1][len(backend.contexts[0]) :])
    assert "<tool_response>" in second and "->" in second, second
    assert sum(ep.loss_mask) == sum(t.num_action_tokens for t in ep.turns)
    call = ep.turns[0].action.split("<tool_call>")[1].split("</tool_call>")[0]
    assert json.loads(call)["name"] == names[0]
    # The built-in driver writing the same answers (bfcl_harness's episode settings) records
    # the same episode: the harness's tool messages after calls, user messages after "done".
    driver_chat = TemplateChat(chat.tokenizer, tools_of=bfcl_tools)
    options = {"tool_format": "compact", "max_result_chars": 300, "max_steps_per_turn": 4}
    env = get_env_spec("bfcl", {"limit": 4, **options})
    budget = Budget(
        max_turns=16, max_new_tokens=128, max_total_tokens=10**6, max_observation_chars=300
    )
    spec = RolloutSpec(driver_chat, env.system_prompt, budget, InlineRunner(env.make_env))
    key = jax.random.key(0)
    (ref,), _ = collect_episodes(
        _Answers(driver_chat, texts), None, [task], samples_per_task=1, spec=spec, key=key
    )
    assert ref.reward == 1.0
    assert_same_episodes([ep], [ref], endings=False)
    stream = decode(ref.tokens)
    assert stream.count("<tool_response>") == sum(map(bool, task.data["ground_truth"]))


class _Answers(HostPolicy):
    """Writes ``texts`` in turn, as ``ScriptedBackend`` serves them (log-probs -0.5)."""

    recompiles = 0

    def __init__(self, chat, texts):
        self.chat, self.texts = chat, list(texts)

    def _next(self, n):
        tok = self.chat.tokenizer
        ids = [*tok.encode(self.texts.pop(0), add_special_tokens=False), self.chat.eot_id]
        return TurnOutput([ids] * n, [[-0.5] * len(ids)] * n, [True] * n)

    def start(self, params, prompts, key, **kw):
        return self._next(len(prompts))

    def resume(self, params, chunks, key, **kw):
        return self._next(len(chunks))


@pytest.mark.slow  # 33-36 s here: 3.2k-token BFCL prompts, the server's and the driver's compiles
def test_bfcl_harness_equals_the_driver_on_a_tiny_run():
    """``bfcl_harness`` through ``collect_harness_episodes`` on a tiny random policy of
    ``configs/loop_bfcl.yaml`` with a ChatML tokenizer: the conversations are recorded (no env
    error, sampled tokens on every turn, the tools block in the stream) and equal the built-in
    driver's episodes for the same key (tokens, masks, log-probs, rewards; the observations
    cut at 300 characters as the driver cuts them, the first one included)."""

    from jaxagent.agents.engine import SlotEngine
    from jaxagent.serve.server import state_for_run
    from jaxagent.train.config import load_config
    from jaxagent.train.run import build_run

    task = _bfcl_task()
    settings = [
        "tokenizer.kind=chatml",
        "tokenizer.vocab_size=1024",
        "tokenizer.num_corpus_demos=20",
        "model.hidden_size=32",
        "model.num_layers=1",
        "model.num_heads=2",
        "model.num_kv_heads=1",
        "model.intermediate_size=64",
        "model.max_seq_len=4096",  # the ChatML tools block of BFCL's schemas: ~3k tokens
        "env.options.limit=4",
        "env.pool.backend=inline",
        "rollout.max_new_tokens=16",
    ]
    run = build_run(load_config(ROOT / "configs/loop_bfcl.yaml", settings))
    key = jax.random.key(5)
    srv = ServerThread(state_for_run(run, model_id="loop_bfcl", slots=2))
    try:
        harness = load_harness("jaxagent.serve.examples:bfcl_harness")
        eps = collect_harness_episodes(
            srv, harness, [task], samples_per_task=2, key=key, timeout_s=300
        )
    finally:
        srv.close()
    engine = SlotEngine(run.graphdef, run.sampler.sampling, run.max_len, run.chat.pad_id, slots=2)
    # The random policy writes no calls: the harness sends each observation as a user message
    # (OpenAI's rule), and the driver renders an observation after an answer without calls as
    # a user turn too (after one with calls both use the tool role: the scripted test above).
    ref, _ = collect_episodes(
        engine, run.params, [task], samples_per_task=2, spec=run.rollout, key=key
    )
    run.close()
    for ep in eps:
        assert not ep.env_failed, ep.error
        assert ep.turns and sum(ep.loss_mask) >= len(ep.turns) and len(ep.tokens) > 1000
        assert "<tools>" in run.chat.tokenizer.decode(ep.tokens)
    assert not any(ep.env_failed for ep in ref)
    assert_same_episodes(eps, ref, endings=False)
