"""Strict tool calls and ``response_format`` through the server, exactly.

A random tiny model over a ChatML tokenizer (Hermes ``<tool_call>`` blocks) behind the real
server and the real ``openai`` client: with ``tool_choice="required"`` and a ``strict`` tool
every answer is a call whose arguments validate against the tool's schema (an enum and an
integer range the model was never trained on), ``response_format`` json_schema answers
validate too, and the session's episode records each token's vocabulary mask so the
learner's log-probs under those masks are the sampler's (fp32, 1e-4).
"""

import json

import jax
import jsonschema
import numpy as np
import openai
import pytest
from serve_fixtures import client_of, start_server

from jaxagent.agents.batch import pack_episodes
from jaxagent.agents.chat import TemplateChat
from jaxagent.generate import SamplingConfig
from jaxagent.models import ModelConfig, init_model
from jaxagent.rl.model_fns import model_logprob_fn
from jaxagent.train.tokenizer import build_chatml_tokenizer

CALL = '<tool_call>\n{"name": "get_price", "arguments": {"ticker": "acme"}}\n</tool_call>'
PARAMS = {
    "type": "object",
    "properties": {
        "ticker": {"type": "string", "enum": ["acme", "bolt"]},
        "n": {"type": "integer", "minimum": 0, "maximum": 20},
    },
    "required": ["ticker", "n"],
}
TOOLS = [
    {"type": "function", "function": {"name": "get_price", "strict": True, "parameters": PARAMS}}
]
ANSWER = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 1, "maximum": 5}},
    "required": ["ok", "n"],
}
USER = [{"role": "user", "content": "what do 3 shares of acme cost?"}]


@pytest.fixture(scope="module")
def served():
    corpus = ["what do 3 shares of acme cost ? get_price ticker 12 36 " + CALL] * 4
    chat = TemplateChat(build_chatml_tokenizer(corpus, 400))
    cfg = ModelConfig.test(vocab_size=len(chat.tokenizer), max_seq_len=512)
    graphdef, params = init_model(cfg, jax.random.key(0))
    sampling = SamplingConfig(max_new_tokens=64, temperature=1.0, stop_token_ids=chat.stop_ids)
    srv = start_server(
        (chat, graphdef, params, sampling), max_total_tokens=480, max_seq_len=512, decode_steps=8
    )
    client = client_of(srv)
    yield srv, client, chat, graphdef, params
    srv.close()


def test_strict_calls_validate_and_the_learner_sees_the_masks(served):
    srv, client, chat, graphdef, params = served
    for seed in range(3):
        r = client.chat.completions.create(
            model="tiny",
            messages=USER,
            tools=TOOLS,
            tool_choice="required",
            seed=seed,
            extra_headers={"X-Session-Id": f"strict{seed}"},
        )
        assert r.choices[0].finish_reason == "tool_calls"
        (call,) = r.choices[0].message.tool_calls
        assert call.function.name == "get_price"
        jsonschema.validate(json.loads(call.function.arguments), PARAMS)
    r = client.chat.completions.create(
        model="tiny",
        messages=USER,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER}},
        seed=7,
        extra_headers={"X-Session-Id": "json"},
    )
    jsonschema.validate(json.loads(r.choices[0].message.content), ANSWER)

    sessions = srv.state.store.sessions
    eps = [sessions[s].episode(1.0) for s in ("strict0", "strict1", "strict2", "json")]
    assert all(ep.constraint_masks for ep in eps)
    batch = pack_episodes(eps, pad_id=chat.pad_id, max_len=512, length_multiple=16)
    mask = batch.loss_mask > 0
    assert ((batch.constraint_ids >= 0) == mask).all()
    lp = model_logprob_fn(graphdef)(
        params,
        batch.tokens,
        batch.positions,
        batch.segment_ids,
        constraint=(batch.constraint_ids, batch.constraint_masks),
    )[0]
    np.testing.assert_allclose(np.asarray(lp)[mask], batch.old_logprobs[mask], atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "kwargs, param",
    [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "required", "tools": None}, "tool_choice"),
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {}}}, "response_format"),
    ],
)
def test_bad_constrained_requests_are_refused(served, kwargs, param):
    srv, client, *_ = served
    kw = {"model": "tiny", "messages": USER, "tools": TOOLS, **kwargs}
    if kw["tools"] is None:
        del kw["tools"]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(**kw)
    assert err.value.status_code == 400 and err.value.body["param"] == param
    assert client.models.list().data[0].id == "tiny"  # still serving
