"""Action parsing and argument validation: every malformed-call category gives a readable
error value (never an exception), and validation errors name the argument."""

import random

import pytest

from jaxagent.envs import actions as A
from jaxagent.envs.tool_spec import ActionError, ErrorKind, ParsedAction, ToolSpec
from jaxagent.envs.base import FailureMode

TOOLS = [
    ToolSpec(
        "mul",
        "a times b",
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    ),
    ToolSpec(
        "price",
        "price of a stock",
        {
            "properties": {
                "item": {"type": "string", "enum": ["acme", "bolt"]},
                "when": {"type": "string"},
            },
            "required": ["item"],
        },
    ),
    ToolSpec(
        "send",
        "send a message",
        {
            "properties": {
                "to": {"type": "string"},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["to"],
        },
        dangerous=True,
    ),
]


@pytest.mark.parametrize(
    "text",
    [
        "Action: mul(a=6, b=7)",
        "Thought: multiply\nAction: mul(6, 7)",
        "mul(a=6, b=7)",
        "Action: mul(6, b=7)",
        '{"name": "mul", "arguments": {"a": 6, "b": 7}}',
        '{"name": "mul", "arguments": "{\\"a\\": 6, \\"b\\": 7}"}',
        '{"function": {"name": "mul", "arguments": {"a": 6, "b": 7}}}',
        'Action: {"name": "mul", "arguments": {"a": 6, "b": 7}}',
    ],
)
def test_three_syntaxes_give_the_same_call(text):
    parsed = A.resolve_action(text, TOOLS)
    assert isinstance(parsed, ParsedAction), parsed
    assert [(c.name, dict(c.kwargs)) for c in parsed.calls] == [("mul", {"a": 6, "b": 7})]


def test_react_thought_final_and_lists():
    parsed = A.parse_action("Thought: I know it\nFinal: 42")
    assert parsed.is_final and parsed.final == "42" and parsed.thought == "I know it"
    assert A.parse_action("Final Answer: blue").final == "blue"
    many = A.resolve_action('[mul(a=1, b=2), price("acme")]', TOOLS)
    assert [c.name for c in many.calls] == ["mul", "price"]
    assert many.calls[1].kwargs == {"item": "acme"}  # positional matched by param order
    lines = A.resolve_action('mul(a=1, b=2)\nprice(item="bolt")', TOOLS)
    assert [c.name for c in lines.calls] == ["mul", "price"]
    js = A.resolve_action('[{"name": "price", "arguments": {"item": "bolt"}}]', TOOLS)
    assert js.calls[0].kwargs == {"item": "bolt"}


# (text, ErrorKind, FailureMode, words the message must contain, the argument named)
MALFORMED = [
    ("", ErrorKind.EMPTY, FailureMode.GAVE_UP, ["empty", "Action:"], None),
    ("   \n", ErrorKind.EMPTY, FailureMode.GAVE_UP, ["empty"], None),
    (
        "the answer is five",
        ErrorKind.NO_ACTION,
        FailureMode.INVALID_SYNTAX,
        ["no 'Action:'", "Final:"],
        None,
    ),
    ("Thought: hmm", ErrorKind.NO_ACTION, FailureMode.INVALID_SYNTAX, ["no 'Action:'"], None),
    (
        "Action: mul(a=1, b=2)\nFinal: 2",
        ErrorKind.ACTION_AND_FINAL,
        FailureMode.INVALID_SYNTAX,
        ["both"],
        None,
    ),
    ("Action:", ErrorKind.NOT_A_CALL, FailureMode.INVALID_SYNTAX, ["followed by nothing"], None),
    (
        "Action: mul(a=1, b=2",
        ErrorKind.PYTHON_SYNTAX,
        FailureMode.INVALID_SYNTAX,
        ["not valid syntax", "never closed"],
        None,
    ),
    (
        "Action: 3 + 4",
        ErrorKind.NOT_A_CALL,
        FailureMode.INVALID_SYNTAX,
        ["not a tool call"],
        None,
    ),
    (
        "Action: x = mul(a=1, b=2)",
        ErrorKind.NOT_A_CALL,
        FailureMode.INVALID_SYNTAX,
        ["statement"],
        None,
    ),
    (
        "Action: mul(a=__import__('os').getcwd(), b=2)",
        ErrorKind.NON_LITERAL_ARGUMENT,
        FailureMode.INVALID_SYNTAX,
        ["'a'", "not a literal"],
        "a",
    ),
    (
        "Action: mul(a=x, b=2)",
        ErrorKind.NON_LITERAL_ARGUMENT,
        FailureMode.INVALID_SYNTAX,
        ["not a literal"],
        "a",
    ),
    (
        "Action: mul(**kw)",
        ErrorKind.NON_LITERAL_ARGUMENT,
        FailureMode.INVALID_SYNTAX,
        ["name each argument"],
        None,
    ),
    (
        '{"name": "mul", "arguments": {"a": 1,',
        ErrorKind.JSON_SYNTAX,
        FailureMode.INVALID_SYNTAX,
        ["JSON", "does not parse"],
        None,
    ),
    (
        '{"name": "mul", "arguments": "{a: 1}"}',
        ErrorKind.JSON_SYNTAX,
        FailureMode.INVALID_SYNTAX,
        ['"arguments" string of mul'],
        None,
    ),
    ('{"tool": "mul"}', ErrorKind.JSON_SHAPE, FailureMode.INVALID_SYNTAX, ['"name"'], None),
    (
        '{"name": "mul", "arguments": [1, 2]}',
        ErrorKind.JSON_SHAPE,
        FailureMode.INVALID_SYNTAX,
        ["must be a JSON object"],
        None,
    ),
    ("[]", ErrorKind.NOT_A_CALL, FailureMode.INVALID_SYNTAX, ["no call"], None),
    (
        "Action: mult(a=1, b=2)",
        ErrorKind.UNKNOWN_TOOL,
        FailureMode.UNKNOWN_TOOL,
        ["unknown tool 'mult'", "Did you mean mul", "Available tools: mul, price, send"],
        None,
    ),
    (
        "Action: mul(1, 2, 3)",
        ErrorKind.TOO_MANY_POSITIONAL,
        FailureMode.BAD_ARGUMENTS,
        ["takes 2", "got 3", "mul(a: integer, b: integer)"],
        None,
    ),
    (
        "Action: mul(1, a=2)",
        ErrorKind.DUPLICATE_ARGUMENT,
        FailureMode.BAD_ARGUMENTS,
        ["'a'", "both by position and by name"],
        "a",
    ),
    (
        "Action: mul(a=1, a=2)",
        ErrorKind.DUPLICATE_ARGUMENT,
        FailureMode.BAD_ARGUMENTS,
        ["'a' twice"],
        "a",
    ),
    (
        "Action: mul(a=1)",
        ErrorKind.INVALID_ARGUMENTS,
        FailureMode.BAD_ARGUMENTS,
        ["missing required argument 'b'", "Expected: mul(a: integer, b: integer)"],
        "b",
    ),
    (
        "Action: mul(a='6', b=7)",
        ErrorKind.INVALID_ARGUMENTS,
        FailureMode.BAD_ARGUMENTS,
        ["argument 'a' must be of type integer", '"6"'],
        "a",
    ),
    (
        "Action: mul(a=1, b=2, c=3)",
        ErrorKind.INVALID_ARGUMENTS,
        FailureMode.BAD_ARGUMENTS,
        ["unexpected argument 'c'", "known arguments: a, b"],
        "c",
    ),
    (
        'Action: price(item="zeta")',
        ErrorKind.INVALID_ARGUMENTS,
        FailureMode.BAD_ARGUMENTS,
        ['argument \'item\' must be one of "acme", "bolt"', '"zeta"'],
        "item",
    ),
    (
        'Action: send(to="bob", tags=["a", 3])',
        ErrorKind.INVALID_ARGUMENTS,
        FailureMode.BAD_ARGUMENTS,
        ["argument 'tags'[1] must be of type string"],
        "tags",
    ),
]


@pytest.mark.parametrize(
    "text,kind,mode,phrases,argument",
    MALFORMED,
    ids=[f"{i}-{m[1].value}" for i, m in enumerate(MALFORMED)],
)
def test_malformed_call_gives_readable_error(text, kind, mode, phrases, argument):
    result = A.resolve_action(text, TOOLS)
    assert isinstance(result, ActionError), result
    assert result.kind == kind
    assert result.failure_mode == mode
    for phrase in phrases:
        assert phrase in result.message, (phrase, result.message)
    assert result.argument == argument
    assert result.message.startswith("error")


def test_every_error_kind_is_covered():
    assert {m[1] for m in MALFORMED} == set(ErrorKind)


def test_parser_never_raises_on_garbage():
    rng = random.Random(0)
    alphabet = "mul(a=1,b'\"[]{}):\n Action Final Thought \\ ** lambda x:0 #"
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) for _ in range(400)]
    good = 'Action: send(to="bob", tags=["x"])'
    texts += [good[:i] for i in range(len(good))] + ["(" * 500 + ")" * 500, "1" * 5000]
    for text in texts:
        result = A.resolve_action(text, TOOLS)
        assert isinstance(result, (ParsedAction, ActionError))


def test_nothing_is_evaluated(tmp_path):
    marker = tmp_path / "pwned"
    text = f"Action: mul(a=open({str(marker)!r}, 'w').write('x'), b=1)"
    assert isinstance(A.resolve_action(text, TOOLS), ActionError)
    assert not marker.exists()


def test_tool_spec_schema_normalisation_and_errors():
    bfcl_style = {
        "name": "move",
        "description": "move a file",
        "parameters": {
            "type": "dict",
            "properties": {
                "src": {"type": "string"},
                "ratio": {"type": "float"},
                "pair": {"type": "tuple", "items": {"type": "integer"}},
            },
            "required": ["src"],
        },
        "response": {"type": "dict", "properties": {}},
    }
    spec = ToolSpec.from_json(bfcl_style)
    assert spec.parameters["type"] == "object"
    assert spec.parameters["properties"]["ratio"]["type"] == "number"
    assert spec.parameters["properties"]["pair"]["type"] == "array"
    assert spec.returns["type"] == "object"
    schema = spec.to_json_schema()
    assert set(schema) == {"name", "description", "parameters", "returns"}
    assert spec.signature() == "move(src: string, ratio?: number, pair?: array)"
    assert A.validate_arguments(spec, {"src": "a", "ratio": 2}) is None  # int is a number
    with pytest.raises(ValueError, match="must be an identifier"):
        ToolSpec("bad name")
    with pytest.raises(ValueError, match="object schema"):
        ToolSpec("x", parameters={"type": "string"})
    with pytest.raises(Exception, match="not valid"):
        ToolSpec("x", parameters={"type": "object", "properties": {"a": {"type": 3}}})
    with pytest.raises(ValueError, match="duplicate tool name 'mul'"):
        A.tool_table(TOOLS + TOOLS[:1])


def test_param_order_override_for_positional_binding():
    spec = ToolSpec(
        "diff",
        parameters={"properties": {"x": {"type": "string"}, "y": {"type": "string"}}},
        param_order=("y", "x"),
    )
    parsed = A.resolve_action("diff('first', 'second')", [spec])
    assert parsed.calls[0].kwargs == {"y": "first", "x": "second"}
