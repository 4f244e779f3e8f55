"""Tool specs as JSON Schema, action parsing, and argument validation.

An agent's action is text. This module turns it into structured tool calls or a final answer,
in three accepted syntaxes:

* ReAct: ``Thought: ...`` (optional) then ``Action: tool(arg=1)`` or ``Final: answer``;
  the text after ``Action:`` may itself be a Python call or a JSON call.
* JSON function calls: ``{"name": "tool", "arguments": {...}}`` or a list of them
  (``"arguments"`` may also be a JSON-encoded string, as OpenAI-style APIs send it).
* Python-call syntax: ``tool(1, b="x")``, or a list ``[f(a=1), g(b=2)]``, or one call a line.
  Parsed with ``ast``; arguments must be literals (``ast.literal_eval``). Nothing is evaluated.

Every malformed action yields an ``ActionError`` (a value, never an exception): its
``message`` says what was wrong and what the tool's schema expects, and its ``failure_mode``
is the ``FailureMode`` label to report. Argument validation uses the ``jsonschema`` library;
its errors are rewritten to name the offending argument.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import json
import re
from typing import Any, Iterable, Mapping, Sequence

import jsonschema

from jaxagent.envs.tool_calls import (
    NATIVE,
    SYNTAX_HINT,
    clip,
    parse_json_calls,
    parse_native,
    render_calls,
)
from jaxagent.envs.tool_spec import (
    ActionError,
    ErrorKind,
    ParsedAction,
    ParseResult,
    ToolCall,
    ToolSpec,
)


_REACT_KEY = re.compile(r"^\s*(Thought|Action|Final Answer|Final)\s*:\s?", re.I | re.M)


def parse_action(text: str, syntax: str = "auto") -> ParseResult:
    """Parses action text (ReAct, JSON or Python-call syntax) without checking tool names.

    ``syntax``: "auto" also recognises the native chat-model formats by their markers
    (``jaxagent.envs.tool_calls``: Hermes ``<tool_call>``, Mistral ``[TOOL_CALLS]``, Llama
    ``<|python_tag|>``); "hermes" / "llama3" / "mistral" parse that format only (plain text is
    the final answer); "react" only the syntaxes above.

    Returns a ``ParsedAction`` or an ``ActionError``; never raises on any input string.
    """
    if not isinstance(text, str) or not text.strip():
        return ActionError(ErrorKind.EMPTY, "error: the action is empty. " + SYNTAX_HINT)
    native = parse_native(text, syntax)
    if native is not None:
        return native
    sections = _react_sections(text)
    if sections is None:  # no ReAct keywords: the whole text is a JSON or Python call
        if not re.search(r"[(\[{]", text):
            return ActionError(
                ErrorKind.NO_ACTION,
                f"error: {clip(text)!r} holds no 'Action:', no 'Final:' and no "
                "tool call. " + SYNTAX_HINT,
            )
        return _parse_calls(text.strip(), thought=None)
    thought = sections["thought"].strip() if "thought" in sections else None
    has_action, has_final = "action" in sections, "final" in sections
    if has_action and has_final:
        return ActionError(
            ErrorKind.ACTION_AND_FINAL,
            "error: the action has both 'Action:' and 'Final:'. Either call a "
            "tool and wait for its result, or give the final answer, not both.",
        )
    if has_final:
        return ParsedAction(final=sections["final"].strip(), thought=thought)
    if has_action:
        body = sections["action"].strip()
        if not body:
            return ActionError(
                ErrorKind.NOT_A_CALL, "error: 'Action:' is followed by nothing. " + SYNTAX_HINT
            )
        return _parse_calls(body, thought=thought)
    return ActionError(
        ErrorKind.NO_ACTION,
        "error: found a 'Thought:' but no 'Action:' or 'Final:'. " + SYNTAX_HINT,
    )


def _react_sections(text: str) -> dict[str, str] | None:
    matches = list(_REACT_KEY.finditer(text))
    if not matches:
        return None
    out: dict[str, str] = {}
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        key = match.group(1).lower().split()[0]  # "final answer" -> "final"
        out.setdefault(key, text[match.end() : end])
    return out


def _parse_calls(body: str, thought: str | None) -> ParseResult:
    if body[0] in "{[" and not re.match(r"^\[\s*[A-Za-z_]", body):
        return parse_json_calls(body, thought)
    return _parse_python_calls(body, thought)


def _parse_python_calls(body: str, thought: str | None) -> ParseResult:
    try:
        module = ast.parse(body, mode="exec")
    except SyntaxError as err:
        return ActionError(
            ErrorKind.PYTHON_SYNTAX,
            f"error: the call is not valid syntax ({err.msg}, column "
            f"{err.offset}): {clip(body)}. " + SYNTAX_HINT,
        )
    nodes: list[ast.AST] = []
    for stmt in module.body:
        if not isinstance(stmt, ast.Expr):
            return ActionError(
                ErrorKind.NOT_A_CALL,
                f"error: {clip(ast.unparse(stmt))} is a statement, not a tool call. " + SYNTAX_HINT,
            )
        value = stmt.value
        nodes.extend(value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value])
    if not nodes:
        return ActionError(ErrorKind.NOT_A_CALL, "error: no call found. " + SYNTAX_HINT)
    calls = []
    for node in nodes:
        call = _call_from_node(node)
        if isinstance(call, ActionError):
            return call
        calls.append(call)
    return ParsedAction(calls=tuple(calls), thought=thought)


def _call_from_node(node: ast.AST) -> ToolCall | ActionError:
    src = ast.unparse(node)
    if not isinstance(node, ast.Call) or not isinstance(node.func, (ast.Name, ast.Attribute)):
        return ActionError(
            ErrorKind.NOT_A_CALL, f"error: {clip(src)} is not a tool call. " + SYNTAX_HINT
        )
    name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
    args, kwargs = [], {}
    for i, arg in enumerate(node.args):
        value = _literal(arg)
        if isinstance(value, _NotLiteral):
            return _non_literal(name, f"positional argument {i + 1}", arg)
        args.append(value)
    for kw in node.keywords:
        if kw.arg is None:
            return ActionError(
                ErrorKind.NON_LITERAL_ARGUMENT,
                f"error: {name}(**...) is not allowed; name each argument.",
                tool=name,
            )
        value = _literal(kw.value)
        if isinstance(value, _NotLiteral):
            return _non_literal(name, f"argument {kw.arg!r}", kw.value, kw.arg)
        if kw.arg in kwargs:
            return ActionError(
                ErrorKind.DUPLICATE_ARGUMENT,
                f"error: {name} got argument {kw.arg!r} twice.",
                name,
                kw.arg,
            )
        kwargs[kw.arg] = value
    return ToolCall(name, kwargs, tuple(args), src)


class _NotLiteral:
    pass


def _literal(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _NotLiteral()


def _non_literal(name: str, where: str, node: ast.AST, arg: str | None = None) -> ActionError:
    return ActionError(
        ErrorKind.NON_LITERAL_ARGUMENT,
        f"error: {where} of {name} is {clip(ast.unparse(node))}, which is not a "
        "literal. Arguments must be plain values (numbers, quoted strings, "
        "lists, dicts, True/False/None); expressions and variables are not "
        "evaluated.",
        tool=name,
        argument=arg,
    )


def tool_table(tools: Mapping[str, ToolSpec] | Sequence[ToolSpec]) -> dict[str, ToolSpec]:
    """Returns ``{name: spec}``; raises ``ValueError`` on duplicate names."""
    if isinstance(tools, Mapping):
        return dict(tools)
    table: dict[str, ToolSpec] = {}
    for spec in tools:
        if spec.name in table:
            raise ValueError(f"duplicate tool name {spec.name!r}; tool names must be unique")
        table[spec.name] = spec
    return table


def bind_call(call: ToolCall, spec: ToolSpec) -> ToolCall | ActionError:
    """Matches positional arguments to names and validates against ``spec.parameters``.

    Returns the call with all arguments as keywords, or an ``ActionError`` naming the argument.
    """
    kwargs = dict(call.kwargs)
    if len(call.args) > len(spec.param_order):
        return ActionError(
            ErrorKind.TOO_MANY_POSITIONAL,
            f"error: {spec.name} takes {len(spec.param_order)} argument(s) but "
            f"got {len(call.args)} positional. Expected: {spec.signature()}",
            tool=spec.name,
        )
    for name, value in zip(spec.param_order, call.args):
        if name in kwargs:
            return ActionError(
                ErrorKind.DUPLICATE_ARGUMENT,
                f"error: {spec.name} got argument {name!r} both by position and "
                f"by name. Expected: {spec.signature()}",
                spec.name,
                name,
            )
        kwargs[name] = value
    error = validate_arguments(spec, kwargs)
    if error is not None:
        return error
    return ToolCall(call.name, kwargs, (), call.text)


def validate_arguments(spec: ToolSpec, kwargs: Mapping[str, Any]) -> ActionError | None:
    """Validates named arguments with ``jsonschema``; returns None when they are valid."""
    schema = dict(spec.parameters)
    schema.setdefault("additionalProperties", False)
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(dict(kwargs)), key=lambda e: (len(e.path), e.path))
    if not errors:
        return None
    err = errors[0]
    arg, problem = _describe(err, spec, kwargs)
    return ActionError(
        ErrorKind.INVALID_ARGUMENTS,
        f"error: bad arguments for {spec.name}: {problem}. Expected: {spec.signature()}",
        tool=spec.name,
        argument=arg,
    )


def _describe(
    err: jsonschema.ValidationError, spec: ToolSpec, kwargs: Mapping[str, Any]
) -> tuple[str | None, str]:
    """Rewrites a jsonschema error so that it names the argument and what it should be."""
    if err.validator == "required":
        missing = [r for r in err.validator_value if r not in (err.instance or {})]
        arg = missing[0] if missing else None
        return arg, f"missing required argument {arg!r}"
    if err.validator == "additionalProperties" and not err.path:
        extra = sorted(set(kwargs) - set(spec.parameters.get("properties", {})))
        arg = extra[0] if extra else None
        known = ", ".join(spec.param_order) or "none"
        return arg, f"unexpected argument {arg!r} (known arguments: {known})"
    path = list(err.absolute_path)
    arg = str(path[0]) if path else None
    where = "argument " + repr(arg) + "".join(f"[{p!r}]" for p in path[1:])
    got = clip(json.dumps(err.instance, default=repr), 40)
    if err.validator == "type":
        return arg, f"{where} must be of type {err.validator_value}, got {got}"
    if err.validator == "enum":
        allowed = ", ".join(json.dumps(v) for v in err.validator_value)
        return arg, f"{where} must be one of {allowed}, got {got}"
    return arg, f"{where} is invalid: {err.message}"


def resolve_action(
    text: str, tools: Mapping[str, ToolSpec] | Sequence[ToolSpec], syntax: str = "auto"
) -> ParseResult:
    """Parses ``text`` (``parse_action``'s ``syntax``) and validates every call against ``tools``.

    Returns a ``ParsedAction`` whose calls carry only named, schema-valid arguments, or the
    first ``ActionError`` (unknown tool, bad arguments, or a syntax error).
    """
    table = tool_table(tools)
    parsed = parse_action(text, syntax)
    if isinstance(parsed, ActionError) or parsed.is_final:
        return parsed
    bound = []
    for call in parsed.calls:
        spec = table.get(call.name)
        if spec is None:
            return unknown_tool_error(call.name, table)
        result = bind_call(call, spec)
        if isinstance(result, ActionError):
            return result
        bound.append(result)
    return dataclasses.replace(parsed, calls=tuple(bound))


def unknown_tool_error(name: str, names: Iterable[str]) -> ActionError:
    """A readable error for a call to a tool that does not exist, with close matches."""
    names = sorted(names)
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    listing = ", ".join(names) if len(names) <= 40 else ", ".join(names[:40]) + ", ..."
    return ActionError(
        ErrorKind.UNKNOWN_TOOL,
        f"error: unknown tool {name!r}.{hint} Available tools: {listing}",
        tool=name,
    )


def to_native(text: str, syntax: str) -> str:
    """A demonstrator's action (ReAct / Python-call / JSON text) in the native ``syntax``.

    Well-formed calls with named arguments are rewritten (string values stripped: the
    word-level demonstrators pad quotes with spaces); a final answer, a malformed action (a
    demonstrator's deliberate mistake) or a call with positional arguments stays as written,
    so the environment judges the same action either way.
    """
    if syntax not in NATIVE:
        return text
    parsed = parse_action(text)
    if isinstance(parsed, ActionError) or parsed.is_final or any(c.args for c in parsed.calls):
        return text
    calls = [
        (c.name, {k: v.strip() if isinstance(v, str) else v for k, v in c.kwargs.items()})
        for c in parsed.calls
    ]
    return render_calls(calls, syntax)
