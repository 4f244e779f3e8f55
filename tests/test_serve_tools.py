"""A request the served policy cannot honour is refused, never silently changed: a
word-tokenizer policy (``configs/quickstart.yaml``'s kind) has no tool format, so OpenAI
``tools`` / ``tool_choice`` get one 400 that names the ChatML config instead of an answer with
the tools left out of the prompt. A tool message answers a call, as OpenAI requires: it names
the call (``tool_call_id``, one of the previous assistant message's call ids) and follows an
assistant message with ``tool_calls``; an observation after a plain answer is a user
message. Through the real ``openai`` client."""

# ruff: noqa: F811 -- the shared fixtures (serve_fixtures) are parameters of the tests

import openai
import pytest
from serve_fixtures import SYSTEM, client_of, policy, server  # noqa: F401

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "price",
            "description": "the price of an item",
            "parameters": {"type": "object", "properties": {"item": {"type": "string"}}},
        },
    }
]
ASK = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "one two"}]


@pytest.mark.parametrize("choice", [None, "auto", "required", {"name": "price"}])
def test_word_tokenizer_policy_refuses_tools_naming_the_chatml_config(server, choice):
    extra = {} if choice is None else {"tool_choice": _choice(choice)}
    with pytest.raises(openai.BadRequestError) as caught:
        client_of(server).chat.completions.create(
            model="tiny", messages=ASK, tools=TOOLS, max_tokens=3, **extra
        )
    err = caught.value.body
    assert err["code"] == "tools_unsupported" and err["param"] == "tools", err
    assert "configs/quickstart_chatml.yaml" in err["message"] and "\n" not in err["message"]
    # without tools the same request is served
    r = client_of(server).chat.completions.create(model="tiny", messages=ASK, max_tokens=3)
    assert r.choices[0].message.tool_calls is None


def _choice(choice):
    if isinstance(choice, dict):
        return {"type": "function", "function": choice}
    return choice


def test_a_tool_result_after_calls_needs_its_call_id(server):
    call = {"id": "call_1", "type": "function", "function": {"name": "price", "arguments": "{}"}}
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]}]
    with pytest.raises(openai.BadRequestError) as caught:
        client_of(server).chat.completions.create(
            model="tiny", messages=[*history, {"role": "tool", "content": "12"}], max_tokens=3
        )
    err = caught.value.body
    assert err["code"] == "missing_tool_call_id" and err["param"] == "messages[3].tool_call_id"
    answered = {"role": "tool", "tool_call_id": "call_1", "content": "12"}
    r = client_of(server).chat.completions.create(
        model="tiny", messages=[*history, answered], max_tokens=3
    )
    assert r.choices[0].finish_reason in ("stop", "length")


def test_a_tool_message_answers_a_call_or_is_refused(server):
    """After an answer without calls a tool message is refused (400, OpenAI's rule), with or
    without an id; after calls, an id that is not one of theirs is refused too. The same
    observation as a user message is served."""
    plain = [*ASK, {"role": "assistant", "content": "one"}]
    call = {"id": "call_1", "type": "function", "function": {"name": "price", "arguments": "{}"}}
    called = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]}]
    refused = [
        (plain, {}, "missing_tool_call_id", "messages[3].tool_call_id"),
        (plain, {"tool_call_id": "call_1"}, "invalid_tool_message", "messages[3].role"),
        (called, {"tool_call_id": "call_9"}, "invalid_tool_call_id", "messages[3].tool_call_id"),
    ]
    for history, extra, code, param in refused:
        with pytest.raises(openai.BadRequestError) as caught:
            client_of(server).chat.completions.create(
                model="tiny",
                messages=[*history, {"role": "tool", "content": "12", **extra}],
                max_tokens=3,
            )
        err = caught.value.body
        assert (err["code"], err["param"]) == (code, param), err
        assert "\n" not in err["message"]
        fix = "user message" if history is plain else "'call_1'"  # the way out, named
        assert fix in err["message"], err
    r = client_of(server).chat.completions.create(
        model="tiny", messages=[*plain, {"role": "user", "content": "12"}], max_tokens=3
    )
    assert r.choices[0].finish_reason in ("stop", "length")
