"""The OpenAI chat-completions wire format: request checking, errors, responses and chunks.

Pure Python, no HTTP: ``parse_request`` turns a decoded JSON body into a ``ChatRequest`` or
raises ``APIError`` with OpenAI's status code and error body (``{"error": {"message", "type",
"param", "code"}}``, https://platform.openai.com/docs/guides/error-codes), so every malformed
request is answered the way the ``openai`` client expects (``BadRequestError``,
``NotFoundError``, ...) and nothing malformed reaches the device thread.

Assistant messages are compared by ``normal_message``: role, text and tool calls (name and
parsed arguments), not ids or the client's extra fields (``refusal``, ``annotations``), since
harnesses echo a returned message back in many shapes (a pydantic ``model_dump``, a hand-built
dict, ``content`` None or "").
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from typing import Any

ROLES = ("system", "developer", "user", "assistant", "tool")
# Parameters a request may carry that this server accepts and ignores: they do not change
# what is sampled (penalties of 0 and logit_bias {} are the defaults; anything else is
# refused below). ``user`` names the session when no X-Session-Id header does.
_IGNORED = {
    "user",
    "stream_options",
    "parallel_tool_calls",
    "metadata",
    "store",
    "service_tier",
    "top_logprobs",
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "reasoning_effort",
    "modalities",
}
_KNOWN = {
    "model",
    "messages",
    "tools",
    "tool_choice",
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "n",
    "seed",
    "logprobs",
    "stream",
    "response_format",
} | _IGNORED
MAX_N = 8
MAX_STOP = 4  # OpenAI's own limit on stop sequences


class APIError(Exception):
    """An OpenAI-style error: HTTP ``status`` and the JSON body of ``body()``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = (
            status,
            message,
            type,
            param,
            code,
        )

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


@dataclasses.dataclass(frozen=True)
class ChatRequest:
    """A checked chat-completions request (``parse_request``)."""

    model: str
    messages: tuple[dict, ...]  # normalised (``normal_message``)
    tools: tuple[dict, ...] | None  # OpenAI function tools, as sent
    tool_choice: Any
    temperature: float | None
    top_p: float | None
    max_tokens: int | None
    stop: tuple[str, ...]
    n: int
    seed: int | None
    logprobs: bool
    stream: bool
    include_usage: bool
    user: str | None
    # Constrained decoding: the schema of the whole answer (``response_format`` json_schema
    # or json_object), and whether tool calls are held to their schemas (a tool with
    # ``strict: true``, or ``tool_choice`` "required" / a named function).
    json_schema: dict | None = None
    strict_tools: bool = False

    def grammar(self, syntax: str) -> str | None:
        """The regular language this request's answer is decoded in (``jaxagent.envs.
        call_grammar``), or None. Strict tools hold every call of the request to its schema
        (a call to a non-strict tool of the same request too: still valid under it)."""
        from jaxagent.envs.call_grammar import CONSTRAINED_SYNTAXES, json_regex, turn_regex

        if self.json_schema is not None:
            return json_regex(self.json_schema)
        if not self.strict_tools:
            return None
        if syntax not in CONSTRAINED_SYNTAXES:
            raise bad(
                f"strict tool calls need a model whose tool-call syntax has a constrained "
                f"form ({list(CONSTRAINED_SYNTAXES)}); this model's is {syntax!r}",
                "tools",
                "unsupported_value",
            )
        tools = self.tools or ()
        if isinstance(self.tool_choice, dict):
            tools = tuple(t for t in tools if t["function"]["name"] == self.tool_choice["name"])
        try:
            return turn_regex(tools, syntax, final=self.tool_choice == "auto")
        except ValueError as err:
            raise bad(f"tools: {err}", "tools", "invalid_value") from None


def _number(body: dict, name: str, lo: float, hi: float) -> float | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise bad(f"{name}={v!r} must be a number", name, "invalid_type")
    if not lo <= v <= hi:
        raise bad(f"{name}={v!r} must be between {lo} and {hi}", name, "invalid_value")
    return float(v)


def _int(body: dict, name: str, lo: int) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad(f"{name}={v!r} must be an integer", name, "invalid_type")
    if v < lo:
        raise bad(f"{name}={v!r} must be >= {lo}", name, "invalid_value")
    return v


def text_of(content: Any, param: str) -> str:
    """The text of a message's ``content``: a string, or a list of ``{"type": "text"}``
    parts (joined); images and audio are refused (a text-only policy)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise bad(
                    f"{param}[{i}] is a {kind!r} part; this text-only policy accepts "
                    "{'type': 'text', 'text': ...} parts",
                    f"{param}[{i}]",
                    "invalid_content",
                )
            if not isinstance(part.get("text"), str):
                raise bad(f"{param}[{i}].text must be a string", f"{param}[{i}].text")
            out.append(part["text"])
        return "".join(out)
    raise bad(f"{param} must be a string or a list of text parts", param, "invalid_type")


def _arguments(raw: Any, param: str) -> Any:
    """Tool-call arguments as a JSON value (OpenAI sends them as a JSON string)."""
    if isinstance(raw, str):
        try:
            return json.loads(raw) if raw.strip() else {}
        except ValueError:
            raise bad(f"{param} is not valid JSON: {raw[:80]!r}", param, "invalid_json") from None
    if isinstance(raw, dict):
        return raw
    raise bad(f"{param} must be a JSON string", param, "invalid_type")


def normal_message(m: Any, i: int) -> dict:
    """A message reduced to what the policy sees: {"role", "content"[, "tool_calls"]}, with
    tool calls as [{"name", "arguments" (a JSON value)}]; malformed ones raise ``APIError``."""
    param = f"messages[{i}]"
    if not isinstance(m, dict):
        raise bad(f"{param} must be an object with a role", param, "invalid_type")
    role = m.get("role")
    if role not in ROLES:
        raise bad(f"{param}.role={role!r} must be one of {list(ROLES)}", f"{param}.role")
    if role == "developer":  # OpenAI's newer name for the system role
        role = "system"
    if "content" not in m and role != "assistant":
        raise bad(f"{param} ({role}) has no content", f"{param}.content", "missing_content")
    out: dict[str, Any] = {"role": role, "content": text_of(m.get("content"), f"{param}.content")}
    calls = m.get("tool_calls")
    if calls:
        if role != "assistant":
            raise bad(f"{param}: only assistant messages carry tool_calls", f"{param}.tool_calls")
        if not isinstance(calls, list):
            raise bad(f"{param}.tool_calls must be a list", f"{param}.tool_calls")
        norm = []
        for j, c in enumerate(calls):
            p = f"{param}.tool_calls[{j}]"
            fn = c.get("function") if isinstance(c, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise bad(f"{p} must be {{'type': 'function', 'function': {{'name', ...}}}}", p)
            norm.append(
                {"name": fn["name"], "arguments": _arguments(fn.get("arguments"), p + ".arguments")}
            )
        out["tool_calls"] = norm
    elif role == "assistant" and m.get("content") is None:
        raise bad(f"{param} (assistant) has neither content nor tool_calls", f"{param}.content")
    if role == "tool" and "tool_call_id" in m and not isinstance(m["tool_call_id"], str):
        raise bad(f"{param}.tool_call_id must be a string", f"{param}.tool_call_id")
    return out


def _check_tool_results(raw: list, messages: Sequence[dict]) -> None:
    """OpenAI's rules for a ``tool`` message (it answers 400 to each): it names the call it
    answers (``tool_call_id``), it follows an assistant message with ``tool_calls`` (other
    tool results between them), and its id is one of that message's call ids when they carry
    ids. A world's observation after an answer without calls goes back as a ``user``
    message."""
    calls_at = None  # the index of the assistant message whose calls are being answered
    for i, m in enumerate(messages):
        if m["role"] != "tool":
            calls_at = i if m["role"] == "assistant" and m.get("tool_calls") else None
            continue
        param = f"messages[{i}]"
        if "tool_call_id" not in raw[i]:
            raise bad(
                f"{param} (tool) has no tool_call_id: a tool message names the call it "
                "answers (the id of a call of the assistant message before it); after an "
                "answer without calls, send the observation as a user message",
                f"{param}.tool_call_id",
                "missing_tool_call_id",
            )
        if calls_at is None:
            raise bad(
                f"{param} (tool) does not answer a tool call: a tool message must follow an "
                "assistant message with tool_calls; send the world's observation after an "
                "answer without calls as a user message",
                f"{param}.role",
                "invalid_tool_message",
            )
        ids = [c.get("id") for c in raw[calls_at]["tool_calls"] if isinstance(c, dict)]
        if all(isinstance(x, str) for x in ids) and raw[i]["tool_call_id"] not in ids:
            raise bad(
                f"{param}.tool_call_id={raw[i]['tool_call_id']!r} is not the id of a call of "
                f"messages[{calls_at}].tool_calls ({ids}); answer one of those calls",
                f"{param}.tool_call_id",
                "invalid_tool_call_id",
            )


def _tools(raw: Any) -> tuple[dict, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise bad("tools must be a list of function tools", "tools", "invalid_type")
    for i, t in enumerate(raw):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function":
            raise bad(f"tools[{i}] must be {{'type': 'function', 'function': ...}}", f"tools[{i}]")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad(f"tools[{i}].function.name must be a non-empty string", f"tools[{i}]")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise bad(f"tools[{i}].function.parameters must be a JSON Schema object", f"tools[{i}]")
        if not isinstance(fn.get("strict", False), bool):
            raise bad(f"tools[{i}].function.strict must be a boolean", f"tools[{i}].function")
    return tuple(raw) or None


def _tool_choice(raw: Any, tools) -> Any:
    if raw is None or raw == "auto":
        return "auto"
    if raw == "none":
        return "none"
    if raw in ("required", "any") or isinstance(raw, dict):
        # Forcing a call is decoding constrained to the tools' calls (ChatRequest.grammar).
        if not tools:
            raise bad(f"tool_choice={raw!r} needs tools", "tool_choice", "invalid_value")
        if raw in ("required", "any"):
            return "required"
        name = (raw.get("function") or {}).get("name") if raw.get("type") == "function" else None
        if name not in {t["function"]["name"] for t in tools}:
            raise bad(
                f"tool_choice={raw!r} must name one of the request's tools as "
                "{'type': 'function', 'function': {'name': ...}}",
                "tool_choice",
                "invalid_value",
            )
        return {"name": name}
    raise bad(
        f"tool_choice={raw!r} must be 'auto', 'none', 'required' or a named function",
        "tool_choice",
        "invalid_value",
    )


def _response_format(raw: Any) -> dict | None:
    """The JSON Schema a ``response_format`` holds the answer to, or None for plain text."""
    if raw is None:
        return None
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        schema = (raw.get("json_schema") or {}).get("schema")
        if not isinstance(schema, dict):
            raise bad(
                "response_format.json_schema.schema must be a JSON Schema object",
                "response_format",
                "invalid_value",
            )
        return schema
    raise bad(
        "response_format.type must be 'text', 'json_object' or 'json_schema'",
        "response_format",
        "invalid_value",
    )


def parse_request(body: Any, max_new_tokens: int) -> ChatRequest:
    """Check a chat-completions body. ``max_new_tokens``: the server's longest turn."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object", None, "invalid_body")
    unknown = sorted(set(body) - _KNOWN)
    if unknown:
        raise bad(
            f"unsupported parameter {unknown[0]!r} (supported: {sorted(_KNOWN - _IGNORED)})",
            unknown[0],
            "unsupported_parameter",
        )
    for name, default in (("frequency_penalty", 0), ("presence_penalty", 0)):
        if body.get(name) not in (None, default, 0.0):
            raise bad(f"{name}={body[name]!r} is not supported (only 0)", name, "unsupported_value")
    if body.get("logit_bias") not in (None, {}):
        raise bad("logit_bias is not supported", "logit_bias", "unsupported_value")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model must be a non-empty string", "model", "missing_model")
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad("messages must be a non-empty list", "messages", "invalid_messages")
    messages = tuple(normal_message(m, i) for i, m in enumerate(msgs))
    _check_tool_results(msgs, messages)
    if all(m["role"] == "system" for m in messages):
        raise bad("messages hold no user turn", "messages", "invalid_messages")
    tools = _tools(body.get("tools"))
    tool_choice = _tool_choice(body.get("tool_choice"), tools)
    temperature = _number(body, "temperature", 0.0, 2.0)
    top_p = _number(body, "top_p", 0.0, 1.0)
    if top_p == 0.0:
        raise bad("top_p=0 keeps no token; use temperature=0 for greedy", "top_p", "invalid_value")
    mt = _int(body, "max_tokens", 1)
    mct = _int(body, "max_completion_tokens", 1)
    if mt is not None and mct is not None and mt != mct:
        raise bad("max_tokens and max_completion_tokens differ; send one", "max_tokens")
    max_tokens = mct if mct is not None else mt
    if max_tokens is not None:
        # A harness's generous limit (4096 is common) is served up to the policy's turn
        # length (rollout.max_new_tokens, what it was trained with); a turn cut there ends
        # with finish_reason "length", as OpenAI's does at max_tokens.
        max_tokens = min(max_tokens, max_new_tokens)
    stop = body.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = tuple(stop)
    else:
        raise bad("stop must be a string or a list of strings", "stop", "invalid_type")
    if len(stops) > MAX_STOP or any(not s for s in stops):
        raise bad(f"stop takes 1 to {MAX_STOP} non-empty strings", "stop", "invalid_value")
    n = _int(body, "n", 1) or 1
    if n > MAX_N:
        raise bad(f"n={n} must be <= {MAX_N}", "n", "invalid_value")
    seed = _int(body, "seed", -(2**63))
    logprobs = body.get("logprobs") or False
    if not isinstance(logprobs, bool):
        raise bad("logprobs must be a boolean", "logprobs", "invalid_type")
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise bad("stream must be a boolean", "stream", "invalid_type")
    so = body.get("stream_options") or {}
    if not isinstance(so, dict):
        raise bad("stream_options must be an object", "stream_options", "invalid_type")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise bad("user must be a string", "user", "invalid_type")
    json_schema = _response_format(body.get("response_format"))
    strict = tool_choice != "none" and (
        tool_choice != "auto" or any(t["function"].get("strict") for t in tools or ())
    )
    if json_schema is not None and strict:
        raise bad(
            "response_format json_schema and strict tool calls cannot combine; send one",
            "response_format",
            "invalid_value",
        )
    return ChatRequest(
        json_schema=json_schema,
        strict_tools=strict,
        model=model,
        messages=messages,
        tools=tools,
        tool_choice=tool_choice,
        temperature=temperature,
        top_p=top_p,
        max_tokens=max_tokens,
        stop=stops,
        n=n,
        seed=seed,
        logprobs=logprobs,
        stream=stream,
        include_usage=bool(so.get("include_usage")),
        user=user,
    )


# ---- responses ------------------------------------------------------------------------------


def openai_tool_calls(calls: Sequence[dict], ids: Sequence[str]) -> list[dict]:
    """Normalised calls ({"name", "arguments"}) in OpenAI's ``tool_calls`` format."""
    return [
        {
            "id": cid,
            "type": "function",
            "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])},
        }
        for c, cid in zip(calls, ids)
    ]


def logprobs_block(tokens: Sequence[str], logprobs: Sequence[float]) -> dict:
    """OpenAI's ``choices[i].logprobs``: one entry a sampled token (no alternatives)."""
    return {
        "content": [
            {
                "token": t,
                "logprob": float(lp),
                "bytes": list(t.encode("utf-8")),
                "top_logprobs": [],
            }
            for t, lp in zip(tokens, logprobs)
        ],
        "refusal": None,
    }


def completion(cid: str, model: str, choices: list[dict], usage: dict) -> dict:
    return {
        "id": cid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage,
        "system_fingerprint": None,
    }


def chunk(cid: str, model: str, choices: list[dict], usage: dict | None = None) -> dict:
    out = {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "system_fingerprint": None,
    }
    if usage is not None:
        out["usage"] = usage
    return out


def usage(prompt: int, completion_tokens: int, cached: int) -> dict:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
