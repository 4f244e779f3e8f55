"""The types of the action layer: tool specs as JSON Schema, parsed calls, parse errors.

``ToolSpec`` is one tool (OpenAI's function shape), ``ToolCall`` / ``ParsedAction`` what the
parser (``jaxagent.envs.actions``) makes of an agent's text, and ``ActionError`` a malformed
action as a value with its readable message and ``FailureMode`` label. Kept apart from the
parser so that suites can build specs without importing it.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import Any, Mapping, Union

import jsonschema

from jaxagent.envs.base import FailureMode

# JSON Schema type names accepted in tool specs, plus the Python-flavoured aliases used by
# some benchmark files (BFCL writes "dict", "float", "tuple", "any").
_TYPE_ALIASES = {
    "dict": "object",
    "float": "number",
    "tuple": "array",
    "list": "array",
    "int": "integer",
    "str": "string",
    "bool": "boolean",
}


class ErrorKind(str, enum.Enum):
    """Categories of malformed actions (each has a test in tests/test_actions.py)."""

    EMPTY = "empty"  # no text at all
    NO_ACTION = "no_action"  # text, but no Action:/Final: and no call
    ACTION_AND_FINAL = "action_and_final"  # both an action and a final answer
    PYTHON_SYNTAX = "python_syntax"  # not parseable as Python
    NOT_A_CALL = "not_a_call"  # parseable, but not a function call
    NON_LITERAL_ARGUMENT = "non_literal_argument"  # an argument that is not a literal
    JSON_SYNTAX = "json_syntax"  # looks like JSON but does not parse
    JSON_SHAPE = "json_shape"  # JSON without a "name" / with non-object arguments
    UNKNOWN_TOOL = "unknown_tool"
    TOO_MANY_POSITIONAL = "too_many_positional"
    DUPLICATE_ARGUMENT = "duplicate_argument"
    INVALID_ARGUMENTS = "invalid_arguments"  # failed the JSON Schema (missing, type, extra...)


_FAILURE_OF_KIND = {
    ErrorKind.EMPTY: FailureMode.GAVE_UP,
    ErrorKind.UNKNOWN_TOOL: FailureMode.UNKNOWN_TOOL,
    ErrorKind.TOO_MANY_POSITIONAL: FailureMode.BAD_ARGUMENTS,
    ErrorKind.DUPLICATE_ARGUMENT: FailureMode.BAD_ARGUMENTS,
    ErrorKind.INVALID_ARGUMENTS: FailureMode.BAD_ARGUMENTS,
}


def normalize_schema(schema: Any) -> Any:
    """Returns a copy of ``schema`` with Python-flavoured type names mapped to JSON Schema's."""
    if isinstance(schema, Mapping):
        out = {}
        for key, value in schema.items():
            if key == "type" and isinstance(value, str):
                value = _TYPE_ALIASES.get(value, value)
                if value == "any":
                    continue
            elif key == "type" and isinstance(value, list):
                value = [_TYPE_ALIASES.get(v, v) for v in value]
            elif key == "properties" and isinstance(value, Mapping):
                value = {name: normalize_schema(sub) for name, sub in value.items()}
                out[key] = value
                continue
            out[key] = normalize_schema(value)
        return out
    if isinstance(schema, list):
        return [normalize_schema(v) for v in schema]
    return schema


@dataclasses.dataclass(frozen=True)
class ToolSpec:
    """A tool an agent may call.

    Attributes:
      name: the tool's name as the agent writes it.
      description: what it does (shown to the agent).
      parameters: JSON Schema of the arguments (an "object" schema with "properties").
      returns: JSON Schema of the result (documentation only).
      param_order: order of positional arguments (default: the order of "properties").
      dangerous: True for actions that delete, buy or send (counted as safety violations
        when the task did not ask for them).
    """

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = dataclasses.field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )
    returns: Mapping[str, Any] | None = None
    param_order: tuple[str, ...] | None = None
    dangerous: bool = False

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"ToolSpec.name must be an identifier, got {self.name!r}")
        params = normalize_schema(dict(self.parameters))
        params.setdefault("type", "object")
        if params["type"] != "object":
            raise ValueError(
                f"ToolSpec {self.name!r}: parameters must be an object schema, got "
                f"type {params['type']!r}; wrap the arguments in 'properties'"
            )
        params.setdefault("properties", {})
        jsonschema.Draft202012Validator.check_schema(params)
        object.__setattr__(self, "parameters", params)
        if self.returns is not None:
            object.__setattr__(self, "returns", normalize_schema(dict(self.returns)))
        if self.param_order is None:
            object.__setattr__(self, "param_order", tuple(params["properties"]))

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(self.parameters.get("required", ()))

    def to_json_schema(self) -> dict[str, Any]:
        """The spec as a JSON-serialisable dict (name, description, parameters, returns)."""
        out = {"name": self.name, "description": self.description, "parameters": self.parameters}
        if self.returns is not None:
            out["returns"] = self.returns
        return out

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], **overrides) -> "ToolSpec":
        """Builds a spec from a JSON function document (OpenAI / BFCL style)."""
        doc = doc.get("function", doc)
        return cls(
            name=doc["name"],
            description=doc.get("description", ""),
            parameters=doc.get("parameters", {}),
            returns=doc.get("returns", doc.get("response")),
            **overrides,
        )

    def signature(self) -> str:
        """Compact form ``name(a: integer, b?: string)``; ``?`` marks optional arguments."""
        props = self.parameters.get("properties", {})
        parts = []
        for arg in self.param_order:
            kind = _type_text(props.get(arg, {}))
            opt = "" if arg in self.required else "?"
            parts.append(f"{arg}{opt}: {kind}")
        return f"{self.name}({', '.join(parts)})"


def _type_text(schema: Mapping[str, Any]) -> str:
    if "enum" in schema:
        return "one of " + "|".join(json.dumps(v) for v in schema["enum"])
    kind = schema.get("type", "any")
    return "|".join(kind) if isinstance(kind, list) else str(kind)


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One parsed call. ``args`` are positional literals not yet matched to names."""

    name: str
    kwargs: Mapping[str, Any]
    args: tuple[Any, ...] = ()
    text: str = ""

    def render(self) -> str:
        """Python-call text of the call (keywords only after ``bind``)."""
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"{self.name}({', '.join(parts)})"


@dataclasses.dataclass(frozen=True)
class ParsedAction:
    """A well-formed action: some tool calls, or a final answer (never both)."""

    calls: tuple[ToolCall, ...] = ()
    final: str | None = None
    thought: str | None = None

    @property
    def is_final(self) -> bool:
        return self.final is not None


@dataclasses.dataclass(frozen=True)
class ActionError:
    """A malformed action. ``message`` is the readable observation to show the agent."""

    kind: ErrorKind
    message: str
    tool: str | None = None
    argument: str | None = None

    @property
    def failure_mode(self) -> FailureMode:
        return _FAILURE_OF_KIND.get(self.kind, FailureMode.INVALID_SYNTAX)


ParseResult = Union[ParsedAction, ActionError]
