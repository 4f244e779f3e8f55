"""Native tool-call syntaxes (Hermes/Qwen2.5, Llama 3.1 JSON, Mistral): parsing, errors, rendering."""

import pytest

from jaxagent.envs import actions as A
from jaxagent.envs.tool_spec import ActionError, ErrorKind, ParsedAction, ToolSpec
from jaxagent.envs import tool_calls as T

TOOLS = [
    ToolSpec(
        "price",
        parameters={
            "type": "object",
            "properties": {"item": {"type": "string"}},
            "required": ["item"],
        },
    ),
    ToolSpec(
        "mul",
        parameters={
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        },
    ),
]


def _calls(result):
    assert isinstance(result, ParsedAction), result
    return [(c.name, dict(c.kwargs)) for c in result.calls]


@pytest.mark.parametrize("syntax", ["auto", "hermes"])
def test_hermes_blocks_parse_with_thought(syntax):
    text = (
        "I need the price first.\n<tool_call>\n"
        '{"name": "price", "arguments": {"item": "acme"}}\n</tool_call>\n'
        '<tool_call>{"name": "mul", "arguments": "{\\"a\\": 2, \\"b\\": 3}"}</tool_call>'
    )
    out = A.resolve_action(text, TOOLS, syntax)
    assert _calls(out) == [("price", {"item": "acme"}), ("mul", {"a": 2, "b": 3})]
    assert out.thought == "I need the price first."


def test_llama3_json_and_python_tag():
    text = '<|python_tag|>{"name": "price", "parameters": {"item": "a;b"}}; {"name": "mul", "parameters": {"a": 1, "b": 2}}'
    for syntax in ("auto", "llama3"):
        assert _calls(A.resolve_action(text, TOOLS, syntax)) == [
            ("price", {"item": "a;b"}),
            ("mul", {"a": 1, "b": 2}),
        ]
    # Without the tag, the bare JSON object is Llama's call too (and the JSON syntax's).
    bare = '{"name": "price", "parameters": {"item": "x"}}'
    assert _calls(A.resolve_action(bare, TOOLS, "llama3")) == [("price", {"item": "x"})]
    assert _calls(A.resolve_action(bare, TOOLS)) == [("price", {"item": "x"})]


def test_mistral_v3_list_and_v11_args():
    v3 = '[TOOL_CALLS] [{"name": "price", "arguments": {"item": "acme"}}]'
    v11 = '[TOOL_CALLS]price[ARGS]{"item": "acme"}[TOOL_CALLS]mul[ARGS]{"a": 1, "b": 2}'
    for syntax in ("auto", "mistral"):
        assert _calls(A.resolve_action(v3, TOOLS, syntax)) == [("price", {"item": "acme"})]
        assert _calls(A.resolve_action(v11, TOOLS, syntax)) == [
            ("price", {"item": "acme"}),
            ("mul", {"a": 1, "b": 2}),
        ]


@pytest.mark.parametrize(
    "syntax, text, kind, needle",
    [
        ("hermes", '<tool_call>{"name": "price", "arguments": {}}', "json_syntax", "not closed"),
        ("hermes", '{"name": "price"}</tool_call>', "json_syntax", "closes no <tool_call>"),
        ("hermes", '<tool_call>{"name": "price", </tool_call>', "json_syntax", "does not parse"),
        ("hermes", "<tool_call> </tool_call>", "not_a_call", "empty <tool_call>"),
        ("hermes", '<tool_call>{"arguments": {}}</tool_call>', "json_shape", 'string "name"'),
        (
            "hermes",
            '<tool_call>{"name": "price", "arguments": [1]}</tool_call>',
            "json_shape",
            "object",
        ),
        (
            "hermes",
            '<tool_call>{"name": "price"}</tool_call> and more',
            "not_a_call",
            "after the last",
        ),
        (
            "llama3",
            '<|python_tag|>{"name": "price", "parameters": {',
            "json_syntax",
            "does not parse",
        ),
        ("llama3", "<|python_tag|>", "not_a_call", "no call"),
        ("mistral", "[TOOL_CALLS]", "not_a_call", "followed by nothing"),
        (
            "mistral",
            '[TOOL_CALLS] [{"name": "price", "arguments": ',
            "json_syntax",
            "does not parse",
        ),
        ("mistral", '[TOOL_CALLS]price{"item": 1}', "json_syntax", "no [ARGS]"),
        ("mistral", "[TOOL_CALLS]price[ARGS]{item}", "json_syntax", "{item}"),
    ],
)
def test_malformed_native_calls_give_readable_error_kinds(syntax, text, kind, needle):
    for s in ("auto", syntax):
        out = A.parse_action(text, s)
        assert isinstance(out, ActionError), (s, out)
        assert out.kind.value == kind and needle in out.message, (s, out.message)
        assert out.failure_mode.value == "invalid_syntax"


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>{"name": "pric", "arguments": {"item": "x"}}</tool_call>',
        '<|python_tag|>{"name": "pric", "parameters": {"item": "x"}}',
        '[TOOL_CALLS][{"name": "pric", "arguments": {"item": "x"}}]',
    ],
)
def test_unknown_tool_and_bad_arguments_like_every_syntax(text):
    out = A.resolve_action(text, TOOLS)
    assert isinstance(out, ActionError) and out.kind == ErrorKind.UNKNOWN_TOOL
    assert "Did you mean price?" in out.message and out.failure_mode.value == "unknown_tool"
    bad = A.resolve_action(
        '<tool_call>{"name": "mul", "arguments": {"a": "x", "b": 1}}</tool_call>', TOOLS
    )
    assert bad.kind == ErrorKind.INVALID_ARGUMENTS and bad.argument == "a"
    assert "must be of type number" in bad.message


def test_plain_text_is_the_final_answer_only_in_an_explicit_native_syntax():
    assert A.parse_action("the answer is 36", "hermes").final == "the answer is 36"
    assert A.parse_action("Final: 36", "mistral").final == "36"
    assert A.parse_action("   ", "llama3").kind == ErrorKind.EMPTY
    assert A.parse_action("the answer is 36").kind == ErrorKind.NO_ACTION  # auto: unchanged
    # "react" never reads native markers: a <tool_call> is not Python.
    assert A.parse_action('<tool_call>{"name": "x"}</tool_call>', "react").kind in (
        ErrorKind.PYTHON_SYNTAX,
        ErrorKind.NO_ACTION,
    )
    with pytest.raises(ValueError, match="choose one of"):
        A.parse_action("x", "harmony")


@pytest.mark.parametrize("syntax", T.NATIVE)
def test_render_round_trips_and_demonstrations_convert(syntax):
    calls = [("price", {"item": "acme"}), ("mul", {"a": 2, "b": 3.5})]
    text = T.render_calls(calls, syntax)
    assert _calls(A.parse_action(text, syntax)) == calls
    assert _calls(A.parse_action(text)) == calls  # auto detects it
    demo = A.to_native('Action : price ( item = " acme " )', syntax)
    assert _calls(A.resolve_action(demo, TOOLS, syntax)) == [("price", {"item": "acme"})]
    # Final answers and deliberate mistakes stay as the demonstrator wrote them.
    assert A.to_native("Final : 36", syntax) == "Final : 36"
    assert A.to_native("Action : price ( item = ", syntax) == "Action : price ( item = "


def test_syntax_of_template():
    assert T.syntax_of_template("... <tool_call>\n{{ tool_call | tojson }} ...") == "hermes"
    assert T.syntax_of_template("{{ '[TOOL_CALLS]' }}") == "mistral"
    assert T.syntax_of_template("<|python_tag|>{{ x }}") == "llama3"
    assert T.syntax_of_template('ipython ... "parameters"') == "llama3"
    assert T.syntax_of_template("<|user|>{{ m }}") == "react"
    assert T.syntax_of_template(None) == "react"
