"""Regular expressions of a valid policy turn, for decoding constrained to the tools' schemas.

``turn_regex(tools, syntax)`` is the language of one policy turn that either calls one of
``tools`` (OpenAI-style function dicts) with arguments valid under its JSON Schema, in the
world's call syntax, or gives a final answer:

* ``react`` (the text worlds' own syntax, ``jaxagent.envs.actions``):
  ``Action: name(arg="value", n=3)`` or ``Final: <answer>``;
* ``hermes`` (Qwen2.5 / Hermes templates, ``jaxagent.envs.tool_calls``): free text, or free
  text then one ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` block.

``json_regex(schema)`` is the language of a whole response that is one JSON document valid
under ``schema`` (OpenAI's ``response_format: {"type": "json_schema"}``), from outlines-core's
schema compiler (``outlines_core.json_schema.build_regex_from_schema``).

The expressions are over the text a tokenizer decodes, where a word-level tokenizer puts one
space between tokens: every separator between lexical items (and the end) is an optional
space. Integer
arguments with a small ``minimum``..``maximum`` range are spelled out value by value so the
range itself is enforced (outlines' compiler checks only the type). Schemas outside the subset
``value_regex`` knows (objects nest; ``anyOf``, ``$ref`` ...) raise ``ValueError`` for the
react syntax and fall back to outlines' compiler for the JSON ones. This module never imports
JAX (``jaxagent.generate.grammar`` turns the expressions into token automata).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

_S = " ?"  # a separator: word-level tokenizers decode with one space between tokens
_MAX_SPELLED = 512  # integer ranges up to this many values are spelled out
JSON_STRING = r'"([^"\\\x00-\x1f]|\\["\\/bfnrt])*"'
CONSTRAINED_SYNTAXES = ("react", "hermes")


def _function(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    return tool.get("function", tool)


def _integer(schema: Mapping[str, Any]) -> str:
    lo, hi = schema.get("minimum"), schema.get("maximum")
    if isinstance(lo, int) and isinstance(hi, int) and 0 <= hi - lo < _MAX_SPELLED:
        return "(" + "|".join(str(v) for v in range(lo, hi + 1)) + ")"
    return "-?(0|[1-9][0-9]*)"


def value_regex(schema: Mapping[str, Any], syntax: str) -> str:
    """The expression of one argument value valid under ``schema`` in ``syntax``."""
    quote = (lambda s: f'"{_S}{re.escape(s)}{_S}"') if syntax == "react" else None
    if "const" in schema:
        values = [schema["const"]]
    else:
        values = schema.get("enum")
    if values is not None:
        alts = [
            quote(v) if quote and isinstance(v, str) else re.escape(json.dumps(v)) for v in values
        ]
        return "(" + "|".join(alts) + ")"
    kind = schema.get("type")
    if kind == "integer":
        return _integer(schema)
    if kind == "number":
        return r"-?(0|[1-9][0-9]*)(\.[0-9]+)?"
    if kind == "boolean":
        return "(True|False)" if syntax == "react" else "(true|false)"
    if kind == "string":
        return '"[^"\\n]*"' if syntax == "react" else JSON_STRING
    if kind == "object" and syntax != "react":
        return _json_object(schema)
    raise ValueError(f"no constrained form for the schema {json.dumps(schema)[:120]} ({syntax})")


def _json_object(schema: Mapping[str, Any]) -> str:
    props = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    parts, first = [], True
    for name, sub in props.items():
        try:
            value = value_regex(sub, "json")
        except ValueError:
            value = _outlines_value(sub)
        item = f'"{re.escape(name)}"[ ]?:[ ]?{value}'
        if name in required:
            parts.append(("" if first else "[ ]?,[ ]?") + item)
            first = False
        elif first:
            raise ValueError(f"an optional property {name!r} before any required one")
        else:
            parts.append(f"([ ]?,[ ]?{item})?")
    return r"\{[ ]?" + "".join(parts) + r"[ ]?\}"


def _outlines_value(schema: Mapping[str, Any]) -> str:
    from outlines_core.json_schema import build_regex_from_schema

    return build_regex_from_schema(json.dumps(schema), r"[ ]?")


def call_regex(tool: Mapping[str, Any], syntax: str) -> str:
    """One call of ``tool`` (an OpenAI-style function dict) with schema-valid arguments."""
    fn = _function(tool)
    name, params = fn["name"], fn.get("parameters") or {}
    if syntax == "react":
        props = params.get("properties") or {}
        required = set(params.get("required") or ())
        args, first = [], True
        for arg, sub in props.items():
            item = f"{_S}{re.escape(arg)}{_S}={_S}{value_regex(sub, 'react')}"
            if arg in required:
                args.append(("" if first else f"{_S},") + item)
                first = False
            elif not first:
                args.append(f"({_S},{item})?")
        return f"{_S}{re.escape(name)}{_S}\\(" + "".join(args) + f"{_S}\\)"
    if syntax == "hermes":
        args = _json_object(params) if params.get("properties") else r"\{[ ]?\}"
        return (
            r'<tool_call>\n?\{[ ]?"name"[ ]?:[ ]?"'
            + re.escape(name)
            + r'"[ ]?,[ ]?"arguments"[ ]?:[ ]?'
            + args
            + r"[ ]?\}\n?</tool_call>"
        )
    raise ValueError(
        f"constrained tool calls support the syntaxes {list(CONSTRAINED_SYNTAXES)}, not {syntax!r}"
    )


def turn_regex(tools: Sequence[Mapping[str, Any]], syntax: str, *, final: bool = True) -> str:
    """A whole policy turn: a schema-valid call to one of ``tools`` or (``final``) an answer."""
    if not tools:
        raise ValueError("constrained tool calls need at least one tool")
    calls = "(" + "|".join(call_regex(t, syntax) for t in tools) + ")"
    if syntax == "react":
        answer = f"|{_S}Final{_S}:[^\\n:]*" if final else ""
        return f"({_S}Action{_S}:{calls}{answer}){_S}"
    # hermes: an optional thought without tags, then one call; or a plain answer. A forced
    # call (no answer allowed) is the call alone: a thought could run to the token limit.
    if not final:
        return calls
    thought = "[^<]*"
    return f"({thought}{calls}|{thought})"


def json_regex(schema: Mapping[str, Any]) -> str:
    """One JSON document valid under ``schema``: ``value_regex``'s (integer ranges enforced)
    where it knows the schema, else outlines-core's compiler."""
    try:
        return value_regex(schema, "json")
    except ValueError:
        return _outlines_value(schema)
