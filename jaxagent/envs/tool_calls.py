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

from jaxagent.envs import actions as A

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


def parse_native(text: str, syntax: str = "auto") -> A.ParseResult | None:
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


def _final(text: str, syntax: str) -> A.ParseResult:
    """Plain text in an explicit native syntax: the final answer (``Final:`` stripped)."""
    body = text.strip()
    if not body:
        return A.ActionError(A.ErrorKind.EMPTY, "error: the answer is empty. " + _HINT[syntax])
    if re.match(r"^\s*(final answer|final)\s*:", body, re.I):
        return A.parse_action(body)
    return A.ParsedAction(final=body)


def _syntax_error(message: str, syntax: str) -> A.ActionError:
    return A.ActionError(A.ErrorKind.JSON_SYNTAX, f"error: {message}. {_HINT[syntax]}")


def _parse_hermes(text: str) -> A.ParseResult:
    if _OPEN not in text and _CLOSE not in text:
        return _final(text, "hermes")
    thought = text.split(_OPEN, 1)[0].strip() or None
    calls: list[A.ToolCall] = []
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
                f"the <tool_call> tag is not closed: {A._clip(rest[start:])!r}", "hermes"
            )
        body = rest[start + len(_OPEN) : stop].strip()
        if not body:
            return A.ActionError(
                A.ErrorKind.NOT_A_CALL, "error: an empty <tool_call> block. " + _HINT["hermes"]
            )
        parsed = _json_calls(body, "hermes")
        if isinstance(parsed, A.ActionError):
            return parsed
        calls.extend(parsed)
        rest = rest[stop + len(_CLOSE) :]
    if rest.strip():
        return A.ActionError(
            A.ErrorKind.NOT_A_CALL,
            f"error: text after the last </tool_call>: {A._clip(rest)!r}; end the turn "
            "after the tool calls. " + _HINT["hermes"],
        )
    return A.ParsedAction(calls=tuple(calls), thought=thought)


def _parse_llama3(text: str) -> A.ParseResult:
    body = text.strip()
    if body.startswith(_PYTHON_TAG):
        body = body[len(_PYTHON_TAG) :].strip()
    elif not body.startswith("{"):
        return _final(text, "llama3")
    if not body:
        return A.ActionError(A.ErrorKind.NOT_A_CALL, "error: no call found. " + _HINT["llama3"])
    calls: list[A.ToolCall] = []
    for piece in _split_top_level(body, ";"):
        parsed = _json_calls(piece, "llama3")
        if isinstance(parsed, A.ActionError):
            return parsed
        calls.extend(parsed)
    return A.ParsedAction(calls=tuple(calls))


def _parse_mistral(text: str) -> A.ParseResult:
    thought, body = text.split(_MISTRAL, 1)
    body = body.strip()
    if not body:
        return A.ActionError(
            A.ErrorKind.NOT_A_CALL,
            "error: [TOOL_CALLS] is followed by nothing. " + _HINT["mistral"],
        )
    calls: list[A.ToolCall] = []
    if body[0] in "[{":
        parsed = _json_calls(body, "mistral")
        if isinstance(parsed, A.ActionError):
            return parsed
        calls.extend(parsed)
    else:  # v11+: name[ARGS]{json}[TOOL_CALLS]name[ARGS]{json} ...
        for piece in body.split(_MISTRAL):
            name, sep, args = piece.partition(_ARGS)
            if not sep:
                return _syntax_error(f"[TOOL_CALLS]{A._clip(piece)} has no [ARGS]", "mistral")
            doc = f'{{"name": {json.dumps(name.strip())}, "arguments": {args.strip() or "{}"}}}'
            parsed = _json_calls(doc, "mistral", shown=args.strip())
            if isinstance(parsed, A.ActionError):
                return parsed
            calls.extend(parsed)
    return A.ParsedAction(calls=tuple(calls), thought=thought.strip() or None)


def _json_calls(
    body: str, syntax: str, shown: str | None = None
) -> list[A.ToolCall] | A.ActionError:
    """The calls of one JSON body (an object or a list), via ``actions``' JSON rules."""
    try:
        json.loads(body)
    except json.JSONDecodeError as err:
        return _syntax_error(
            f"the tool call's JSON does not parse ({err.msg} at column {err.colno}): "
            f"{A._clip(shown if shown is not None else body)!r}",
            syntax,
        )
    parsed = A._parse_json_calls(body, thought=None)
    if isinstance(parsed, A.ActionError):
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


def to_native(text: str, syntax: str) -> str:
    """A demonstrator's action (ReAct / Python-call / JSON text) in the native ``syntax``.

    Well-formed calls with named arguments are rewritten (string values stripped: the
    word-level demonstrators pad quotes with spaces); a final answer, a malformed action (a
    demonstrator's deliberate mistake) or a call with positional arguments stays as written,
    so the environment judges the same action either way.
    """
    if syntax not in NATIVE:
        return text
    parsed = A.parse_action(text)
    if isinstance(parsed, A.ActionError) or parsed.is_final or any(c.args for c in parsed.calls):
        return text
    calls = [
        (c.name, {k: v.strip() if isinstance(v, str) else v for k, v in c.kwargs.items()})
        for c in parsed.calls
    ]
    return render_calls(calls, syntax)
