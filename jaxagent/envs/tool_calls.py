"""Native tool-call syntaxes of instruction-tuned chat models, beside ``actions``' own.

Real checkpoints are trained to write tool calls in their template's format, not as ReAct
text. This module parses (and renders, for demonstrations) three of them:

* ``hermes`` (Hermes, Qwen2.5, most ChatML templates): one ``<tool_call>`` block a call,
  ``<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>``; text before the first
  block is the model's thought.
* ``llama3`` (Llama 3.1 / 3.2 JSON tool calling): a bare JSON object
  ``{"name": "f", "parameters": {...}}``, optionally after ``<|python_tag|>``, several
  separated by ``;``.
* ``mistral``: ``[TOOL_CALLS]`` followed by a JSON list ``[{"name": "f", "arguments": {...}}]``
  (v3 tokenizers) or by ``f[ARGS]{...}`` pairs (v11+ tokenizers).

``parse_action(text, syntax=...)`` in ``jaxagent.envs.actions`` calls ``parse_native``
first: with ``syntax="auto"`` (the default every environment uses) a native call is
recognised by its marker (``<tool_call>``, ``[TOOL_CALLS]``, ``<|python_tag|>``) and anything
else goes to the ReAct / JSON / Python-call parser; with an explicit native syntax, text
without a call is the model's final answer, as chat models answer in plain text. Malformed
calls give the same ``ErrorKind``s as the other syntaxes: an unclosed or unopened tag and
unparseable JSON are ``JSON_SYNTAX``, a call without a string ``"name"`` is ``JSON_SHAPE``, an
empty block is ``NOT_A_CALL``; unknown tools and bad arguments are found later by
``resolve_action`` / ``bind_call`` as for every syntax. This module never imports JAX.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping, Sequence

from jaxagent.envs.tool_spec import ActionError, ErrorKind, ParsedAction, ParseResult, ToolCall

SYNTAXES = ("auto", "react", "hermes", "llama3", "mistral")
NATIVE = ("hermes", "llama3", "mistral")

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_PYTHON_TAG = "<|python_tag|>"
_MISTRAL = "[TOOL_CALLS]"
_ARGS = "[ARGS]"

_HINT = {
    "hermes": 'write <tool_call>{"name": "tool_name", "arguments": {"arg": "value"}}</tool_call>',
    "llama3": 'write {"name": "tool_name", "parameters": {"arg": "value"}}',
    "mistral": 'write [TOOL_CALLS][{"name": "tool_name", "arguments": {"arg": "value"}}]',
}


SYNTAX_HINT = (
    'write one call like  Action: tool_name(arg="value")  or  Final: <answer>; '
    'JSON calls look like {"name": "tool_name", "arguments": {"arg": "value"}}'
)


def check_syntax(syntax: str) -> str:
    """Returns ``syntax`` or raises ``ValueError`` naming the allowed ones."""
    if syntax not in SYNTAXES:
        raise ValueError(f"tool-call syntax={syntax!r}; choose one of {list(SYNTAXES)}")
    return syntax


def detect_syntax(text: str) -> str | None:
    """The native syntax whose marker ``text`` carries, or None."""
    if _OPEN in text or _CLOSE in text:
        return "hermes"
    if _MISTRAL in text:
        return "mistral"
    if _PYTHON_TAG in text or (text.lstrip().startswith("{") and '"parameters"' in text):
        return "llama3"  # Llama 3.1's bare JSON (its "parameters" key; ";" between calls)
    return None


def syntax_of_template(template: str | None) -> str:
    """The tool-call syntax a chat template teaches its model ("react" when none is known).

    Hermes/Qwen templates describe ``<tool_call>`` blocks; Mistral's emit ``[TOOL_CALLS]``;
    Llama 3.1's describe JSON with ``"parameters"`` and have an ``ipython`` tool role.
    """
    template = template or ""
    if _OPEN in template:
        return "hermes"
    if _MISTRAL in template:
        return "mistral"
    if _PYTHON_TAG in template or ("ipython" in template and "parameters" in template):
        return "llama3"
    return "react"


def parse_native(text: str, syntax: str = "auto") -> ParseResult | None:
    """Parses a native tool call; None when ``text`` is not one (auto: no marker)."""
    check_syntax(syntax)
    if syntax == "react":
        return None
    found = detect_syntax(text)
    if syntax == "auto":
        if found is None:
            return None
        syntax = found
    if syntax == "hermes":
        return _parse_hermes(text)
    if syntax == "mistral":
        if _MISTRAL not in text:
            return _final(text, syntax)
        return _parse_mistral(text)
    return _parse_llama3(text)


def native_calls(text: str, syntax: str) -> tuple[ToolCall, ...]:
    """The tool calls ``text`` makes in the chat's native ``syntax``; none for a syntax that is
    not native (a ReAct action is text to an OpenAI client) or for text that is no call. The
    one rule for "this turn made calls": what the serve endpoint returns as ``tool_calls``,
    and so where the driver renders the next observation in the tool role."""
    if syntax not in NATIVE:
        return ()
    parsed = parse_native(text, syntax)
    return tuple(parsed.calls) if isinstance(parsed, ParsedAction) else ()


def _final(text: str, syntax: str) -> ParseResult | None:
    """Plain text in an explicit native syntax: the final answer (``Final:`` stripped)."""
    body = text.strip()
    if not body:
        return ActionError(ErrorKind.EMPTY, "error: the answer is empty. " + _HINT[syntax])
    if re.match(r"^\s*(final answer|final)\s*:", body, re.I):
        return None  # a ReAct final answer: ``actions.parse_action`` reads it
    return ParsedAction(final=body)


def _syntax_error(message: str, syntax: str) -> ActionError:
    return ActionError(ErrorKind.JSON_SYNTAX, f"error: {message}. {_HINT[syntax]}")


def _parse_hermes(text: str) -> ParseResult:
    if _OPEN not in text and _CLOSE not in text:
        return _final(text, "hermes")
    thought = text.split(_OPEN, 1)[0].strip() or None
    calls: list[ToolCall] = []
    rest = text
    while True:
        start, stop = rest.find(_OPEN), rest.find(_CLOSE)
        if start < 0 and stop < 0:
            break
        if start < 0 or (0 <= stop < start):
            return _syntax_error("a </tool_call> closes no <tool_call> tag", "hermes")
        stop = rest.find(_CLOSE, start)
        if stop < 0:
            return _syntax_error(
                f"the <tool_call> tag is not closed: {clip(rest[start:])!r}", "hermes"
            )
        body = rest[start + len(_OPEN) : stop].strip()
        if not body:
            return ActionError(
                ErrorKind.NOT_A_CALL, "error: an empty <tool_call> block. " + _HINT["hermes"]
            )
        parsed = _json_calls(body, "hermes")
        if isinstance(parsed, ActionError):
            return parsed
        calls.extend(parsed)
        rest = rest[stop + len(_CLOSE) :]
    if rest.strip():
        return ActionError(
            ErrorKind.NOT_A_CALL,
            f"error: text after the last </tool_call>: {clip(rest)!r}; end the turn "
            "after the tool calls. " + _HINT["hermes"],
        )
    return ParsedAction(calls=tuple(calls), thought=thought)


def _parse_llama3(text: str) -> ParseResult:
    body = text.strip()
    if body.startswith(_PYTHON_TAG):
        body = body[len(_PYTHON_TAG) :].strip()
    elif not body.startswith("{"):
        return _final(text, "llama3")
    if not body:
        return ActionError(ErrorKind.NOT_A_CALL, "error: no call found. " + _HINT["llama3"])
    calls: list[ToolCall] = []
    for piece in _split_top_level(body, ";"):
        parsed = _json_calls(piece, "llama3")
        if isinstance(parsed, ActionError):
            return parsed
        calls.extend(parsed)
    return ParsedAction(calls=tuple(calls))


def _parse_mistral(text: str) -> ParseResult:
    thought, body = text.split(_MISTRAL, 1)
    body = body.strip()
    if not body:
        return ActionError(
            ErrorKind.NOT_A_CALL,
            "error: [TOOL_CALLS] is followed by nothing. " + _HINT["mistral"],
        )
    calls: list[ToolCall] = []
    if body[0] in "[{":
        parsed = _json_calls(body, "mistral")
        if isinstance(parsed, ActionError):
            return parsed
        calls.extend(parsed)
    else:  # v11+: name[ARGS]{json}[TOOL_CALLS]name[ARGS]{json} ...
        for piece in body.split(_MISTRAL):
            name, sep, args = piece.partition(_ARGS)
            if not sep:
                return _syntax_error(f"[TOOL_CALLS]{clip(piece)} has no [ARGS]", "mistral")
            doc = f'{{"name": {json.dumps(name.strip())}, "arguments": {args.strip() or "{}"}}}'
            parsed = _json_calls(doc, "mistral", shown=args.strip())
            if isinstance(parsed, ActionError):
                return parsed
            calls.extend(parsed)
    return ParsedAction(calls=tuple(calls), thought=thought.strip() or None)


def _json_calls(body: str, syntax: str, shown: str | None = None) -> list[ToolCall] | ActionError:
    """The calls of one JSON body (an object or a list), via ``actions``' JSON rules."""
    try:
        json.loads(body)
    except json.JSONDecodeError as err:
        return _syntax_error(
            f"the tool call's JSON does not parse ({err.msg} at column {err.colno}): "
            f"{clip(shown if shown is not None else body)!r}",
            syntax,
        )
    parsed = parse_json_calls(body, thought=None)
    if isinstance(parsed, ActionError):
        return parsed
    return list(parsed.calls)


def _split_top_level(body: str, sep: str) -> list[str]:
    """``body`` split at ``sep`` outside JSON strings and brackets."""
    out, depth, start, quoted, escaped = [], 0, 0, False, False
    for i, ch in enumerate(body):
        if quoted:
            escaped, quoted = (not escaped and ch == "\\"), quoted and (escaped or ch != '"')
            continue
        if ch == '"':
            quoted = True
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == sep and depth == 0:
            out.append(body[start:i])
            start = i + 1
    out.append(body[start:])
    return [p.strip() for p in out if p.strip()]


def render_calls(calls: Sequence[tuple[str, Mapping[str, Any]]], syntax: str) -> str:
    """Text of ``(name, arguments)`` calls as a model of ``syntax`` writes them."""
    check_syntax(syntax)
    if syntax == "hermes":
        return "\n".join(
            f"{_OPEN}\n{json.dumps({'name': n, 'arguments': dict(a)})}\n{_CLOSE}" for n, a in calls
        )
    if syntax == "llama3":
        return "; ".join(json.dumps({"name": n, "parameters": dict(a)}) for n, a in calls)
    if syntax == "mistral":
        return _MISTRAL + json.dumps([{"name": n, "arguments": dict(a)} for n, a in calls])
    raise ValueError(f"render_calls: syntax={syntax!r} is not native; choose one of {NATIVE}")


def parse_json_calls(body: str, thought: str | None) -> ParseResult:
    """The calls of a JSON object or list (OpenAI's ``{"function": ...}`` wrapper accepted;
    ``arguments`` or Llama's ``parameters``, as an object or a JSON string)."""
    try:
        data = json.loads(body)
    except json.JSONDecodeError as err:
        return ActionError(
            ErrorKind.JSON_SYNTAX,
            f"error: the JSON call does not parse ({err.msg} at line {err.lineno} "
            f"column {err.colno}). " + SYNTAX_HINT,
        )
    items = data if isinstance(data, list) else [data]
    calls = []
    for item in items:
        if isinstance(item, Mapping) and isinstance(item.get("function"), Mapping):
            item = item["function"]
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            return ActionError(
                ErrorKind.JSON_SHAPE,
                'error: a JSON call must be an object with a string "name" and an '
                f'object "arguments"; got {clip(json.dumps(item))}',
            )
        args = item.get("arguments", item.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError as err:
                return ActionError(
                    ErrorKind.JSON_SYNTAX,
                    f'error: the "arguments" string of {item["name"]} is not valid '
                    f"JSON ({err.msg}).",
                    tool=item["name"],
                )
        if not isinstance(args, Mapping):
            return ActionError(
                ErrorKind.JSON_SHAPE,
                f'error: "arguments" of {item["name"]} must be a JSON object of '
                f"named arguments, got {type(args).__name__}",
                tool=item["name"],
            )
        calls.append(ToolCall(item["name"], dict(args), (), json.dumps(item)))
    if not calls:
        return ActionError(
            ErrorKind.NOT_A_CALL, "error: the JSON list holds no call. " + SYNTAX_HINT
        )
    return ParsedAction(calls=tuple(calls), thought=thought)


def clip(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
