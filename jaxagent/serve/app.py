"""The HTTP side: an ASGI app (Starlette) speaking OpenAI's chat-completions API.

Routes:

- ``POST /v1/chat/completions``: non-streaming, or streaming as server-sent events in
  OpenAI's ``chat.completion.chunk`` format ending with ``data: [DONE]``;
- ``GET /v1/models`` (and ``/v1/models/{id}``): the one policy served;
- ``POST /v1/sessions/{id}/reward`` (``{"reward": r[, "success": bool, "failure_mode":
  "wrong_answer" | ...]}``: the world's label of a failed episode): ends the session
  and stores it as a training ``Episode`` (``ServerState.store.pop_episodes()``);
- ``POST /v1/sessions/{id}/end`` (``{["reward": r, "success": bool, "task": <JSON>]}``, or
  no body): the same, scored without a reward by ``store.reward_fn(messages, task)``
  (``harness.reward``); 400 ``missing_reward`` when there is neither;
- ``GET /v1/sessions/{id}``: the session's stored trajectory (token ids, loss mask, log-probs,
  policy versions, divergences), for a harness or a test to inspect;
- ``GET /v1/sessions/{id}/episode``: an ended session's episode (``sessions.episode_record``:
  tokens, loss mask, log-probs, versions, reward, messages), the newest ``store.keep`` kept
  (``serve --episodes FILE`` writes every one as a JSON line);
- ``GET /v1/stats``: batching, KV reuse, eviction and divergence counters;
- ``/s/{id}/v1/...``: the same chat and models routes with the session named in the path.

The handlers are module-level functions over the app's ``ServerState``
(``request.app.state``: ``create_app`` makes a ``ServeApp`` whose state it is).

Errors are OpenAI's JSON bodies (``protocol.APIError``) with their status codes; a request
that fails leaves its session unchanged. A client that goes away mid-stream cancels its turn
(the slot stops at the next decode call) and its session is left as it was before the request.
Tool calls in the model's native syntax (``TemplateChat.syntax``) come back as OpenAI
``tool_calls``; the text before the first call is the message's content.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from jaxagent.envs.base import FailureMode, Task
from jaxagent.envs.tool_calls import native_calls
from jaxagent.errors import ConfigError
from jaxagent.serve.backend import Backend, Job, Result
from jaxagent.serve.protocol import (
    APIError,
    bad,
    chunk,
    completion,
    logprobs_block,
    openai_tool_calls,
    parse_request,
    usage,
)
from jaxagent.serve.render import Renderer
from jaxagent.serve.sessions import DIVERGENCE_HEADER, Sampled, SessionStore, episode_record

SESSION_HEADER = "x-session-id"
_MARKERS = ("<tool_call>", "[TOOL_CALLS]", "<|python_tag|>")


@dataclasses.dataclass
class ServerState:
    """What the app serves: the backend (``jaxagent.serve.backend.Backend``), the chat
    renderer, the sessions and the model's name and version."""

    backend: Backend
    renderer: Renderer
    model_id: str
    policy_version: int = 0
    store: SessionStore = dataclasses.field(default_factory=SessionStore)
    # The longest context + max_tokens a request may need (the rollout budget's
    # max_total_tokens, as the driver truncates episodes); None: the slots' capacity.
    max_context: int | None = None
    # session id -> (key, key name, row): the sampling stream of a harness run's episode
    # (``jaxagent.serve.harness``), used when its requests send no seed
    streams: dict = dataclasses.field(default_factory=dict)
    divergences: int = 0
    errors: int = 0
    disconnects: int = 0

    @property
    def chat(self):
        return self.renderer.chat

    def update_policy(self, params, version: int, timeout: float = 600.0) -> None:
        """Serve new weights as policy ``version`` (blocks until they are in place: turns
        under way end on the old weights and are recorded with the old version)."""
        if not self.backend.update(params, version).wait(timeout):
            raise TimeoutError(f"the policy update to version {version} did not complete")
        self.policy_version = version


_TASK_FIELDS = ("id", "split", "prompt", "data")
_FAILURES = {f.value for f in FailureMode} - {"env_error", "prompt_overflow"}


def task_of(value) -> Task | None:
    """The ``task`` of ``POST /v1/sessions/{id}/end`` as the ``Task`` a reward function gets
    in training (``harness.reward``): a JSON object of the Task's fields (``id`` required;
    ``prompt`` / ``split`` default to "" / "serve", ``data`` to {}), None without one."""
    if value is None:
        return None
    fix = 'send {"task": {"id": ..., "prompt": ..., "data": {...}}} (a Task\'s fields)'
    if not isinstance(value, dict):
        raise bad(f"task must be a JSON object; {fix}", "task", "invalid_type")
    unknown = sorted(set(value) - set(_TASK_FIELDS))
    if unknown or not isinstance(value.get("id"), str):
        what = f"unknown field(s) {unknown}" if unknown else "no string id"
        raise bad(f"task has {what}; {fix}", "task", "invalid_value")
    data = value.get("data", {})
    if not isinstance(data, dict):
        raise bad(f"task.data must be a JSON object; {fix}", "task", "invalid_type")
    return Task(
        id=value["id"],
        split=str(value.get("split", "serve")),
        prompt=str(value.get("prompt", "")),
        data=data,
    )


def _error(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status)


def visible_text(text: str, stops, markers, final: bool) -> str:
    """The part of a turn's text a client sees: cut at a stop string or a tool-call marker;
    while the turn runs (not ``final``), less any tail that may begin one."""
    cut = len(text)
    for s in (*stops, *markers):
        i = text.find(s)
        if i >= 0:
            cut = min(cut, i)
    out = text[:cut]
    if not final:
        for s in (*stops, *markers):
            for n in range(min(len(s) - 1, len(out)), 0, -1):
                if out.endswith(s[:n]):
                    out = out[: len(out) - n]
                    break
    return out


class _Turn:
    """Text and tool calls of one choice (shared by the streaming and plain answers)."""

    def __init__(self, state: ServerState, req, tokens: list[int]):
        chat = state.chat
        self.text = chat.decode(tokens)
        stops = req.stop
        text = visible_text(self.text, stops, (), final=True)
        self.calls: list[dict] = []
        self.content = text
        calls = native_calls(text, chat.syntax) if req.tools and req.tool_choice != "none" else ()
        if calls:
            self.calls = [{"name": c.name, "arguments": dict(c.kwargs)} for c in calls]
            self.content = visible_text(text, (), _MARKERS, final=True)
        self.markers = _MARKERS if req.tools and req.tool_choice != "none" else ()

    def message(self) -> dict:
        """The normalised message (what the next request must echo back)."""
        m: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.calls:
            m["tool_calls"] = self.calls
        return m

    def openai_message(self, ids: list[str]) -> dict:
        m: dict[str, Any] = {
            "role": "assistant",
            "content": self.content if (self.content or not self.calls) else None,
            "refusal": None,
        }
        if self.calls:
            m["tool_calls"] = openai_tool_calls(self.calls, ids)
        return m


def _finish(reason: str, turn: _Turn) -> str:
    return "tool_calls" if turn.calls and reason == "stop" else reason


def _token_texts(state: ServerState, ids: list[int]) -> list[str]:
    tok = state.renderer.tokenizer
    return [tok.decode([t], skip_special_tokens=False) for t in ids]


class ServeApp(Starlette):
    """The ASGI app over one policy: ``app.state`` is its ``ServerState``, which every
    handler reads through its request (``request.app.state``)."""

    state: ServerState


def _state(request: Request) -> ServerState:
    return request.app.state


def _model(state: ServerState) -> dict:
    return {"id": state.model_id, "object": "model", "created": 0, "owned_by": "jaxagent"}


async def models(request: Request):
    return JSONResponse({"object": "list", "data": [_model(_state(request))]})


async def model(request: Request):
    state = _state(request)
    name = request.path_params["model"]
    if name != state.model_id:
        msg = f"The model {name!r} does not exist; this server serves {state.model_id!r}"
        return _error(APIError(404, msg, param="model", code="model_not_found"))
    return JSONResponse(_model(state))


async def stats(request: Request):
    state = _state(request)
    return JSONResponse(
        {
            **state.backend.stats.as_dict(),
            "divergences": state.divergences,
            "errors": state.errors,
            "disconnects": state.disconnects,
            "sessions": len(state.store.sessions),
            "episodes": len(state.store.ended),
            "episodes_ended": state.store.ended_total,
            "episodes_evicted": state.store.evicted,
        }
    )


async def session_info(request: Request):
    state = _state(request)
    sid = request.path_params["sid"]
    s = state.store.sessions.get(sid)
    if s is None:
        return _error(_no_session(state, sid))
    return JSONResponse(
        {
            "id": sid,
            "tokens": s.record.tokens,
            "loss_mask": s.record.loss_mask,
            "logprobs": s.record.logprobs,
            "turn_ids": s.record.turn_ids,
            "policy_versions": s.versions,
            "divergences": s.divergences,
            "messages": s.messages,
        }
    )


def _no_session(state: ServerState, sid: str) -> APIError:
    if sid in state.store.ended:
        msg = f"session {sid!r} has ended; GET /v1/sessions/{sid}/episode returns its episode"
        return APIError(404, msg, code="session_ended")
    return APIError(404, f"no session {sid!r}", code="session_not_found")


async def session_episode(request: Request):
    """An ended session's episode (``sessions.episode_record``), while it is among the
    store's newest ``keep``."""
    state = _state(request)
    sid = request.path_params["sid"]
    ep = state.store.ended.get(sid)
    if ep is not None:
        return JSONResponse(episode_record(ep))
    if sid in state.store.sessions:
        msg = f"session {sid!r} has not ended; POST /v1/sessions/{sid}/reward (or /end) first"
        return _error(APIError(409, msg, code="session_not_ended"))
    msg = (
        f"no ended session {sid!r} (the server keeps the newest {state.store.keep} "
        "episodes; `jaxagent serve --episodes FILE` writes every one)"
    )
    return _error(APIError(404, msg, code="episode_not_found"))


async def _end_session(request: Request, needs_reward: bool):
    """``/reward`` (a reward is required) and ``/end`` (without one the session is scored
    by ``state.store.reward_fn``, ``harness.reward``, over its messages and ``task``)."""
    state = _state(request)
    sid = request.path_params["sid"]
    raw = await request.body()
    try:
        body = json.loads(raw) if raw.strip() or needs_reward else {}
    except ValueError:
        return _error(bad("the body must be JSON: {'reward': <number>}", None, "invalid_json"))
    if not isinstance(body, dict):
        return _error(bad("the body must be a JSON object", None, "invalid_type"))
    r = body.get("reward")
    if (needs_reward or r is not None) and (isinstance(r, bool) or not isinstance(r, (int, float))):
        return _error(bad("reward must be a number", "reward", "invalid_value"))
    fn = state.store.reward_fn
    if r is None and fn is None:
        msg = "no reward: send {'reward': <number>} or configure harness.reward"
        return _error(bad(msg, "reward", "missing_reward"))
    success = body.get("success")
    if success is not None and not isinstance(success, bool):
        return _error(bad("success must be a boolean", "success", "invalid_type"))
    try:
        task = task_of(body.get("task"))
    except APIError as err:
        return _error(err)
    failure = body.get("failure_mode")
    if failure is not None and failure not in _FAILURES:
        msg = f"failure_mode={failure!r} is not one of {sorted(_FAILURES)}"
        return _error(bad(msg, "failure_mode", "invalid_value"))
    s = state.store.sessions.get(sid)
    if s is None:
        return _error(_no_session(state, sid))
    async with s.lock:  # after a request of it still in flight
        if sid not in state.store.sessions:
            return _error(APIError(404, f"no session {sid!r}", code="session_not_found"))
        if r is None:
            try:  # the user's function, off the event loop; failing, the session stays
                r = await asyncio.to_thread(s.score, fn, task)
            except Exception as err:  # noqa: BLE001
                state.errors += 1
                msg = f"harness.reward failed on session {sid!r}: {type(err).__name__}: {err}"
                return _error(APIError(500, msg, type="server_error", code="reward_failed"))
        ep = state.store.end(sid, float(r), success, task=task, failure_mode=failure)
    state.backend.release(sid)
    return JSONResponse(
        {
            "session": sid,
            "tokens": len(ep.tokens),
            "policy_tokens": ep.num_policy_tokens,
            "turns": ep.num_turns,
            "reward": ep.reward,
            "divergences": len(ep.info["divergences"]),
        }
    )


async def reward(request: Request):
    return await _end_session(request, needs_reward=True)


async def end(request: Request):
    return await _end_session(request, needs_reward=False)


async def chat_completions(request: Request):
    state = _state(request)
    try:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            raise bad("the request body is not valid JSON", None, "invalid_json") from None
        req = parse_request(body, state.backend.max_new_tokens)
        if req.tools and not state.renderer.template:
            raise bad(
                "tools: this policy's word tokenizer has no tool format (its prompts and "
                "answers are its world's own action text), so the tools would be left out "
                "of the prompt and calls come back as plain text; serve a ChatML config "
                "for OpenAI tools and tool_calls (configs/quickstart_chatml.yaml, "
                "tokenizer.kind: chatml), or send no tools",
                "tools",
                "tools_unsupported",
            )
        if req.model != state.model_id:
            raise APIError(
                404,
                f"The model {req.model!r} does not exist; this server serves "
                f"{state.model_id!r} (GET /v1/models)",
                param="model",
                code="model_not_found",
            )
        return await _complete(state, request, req)
    except APIError as err:
        state.errors += 1
        return _error(err)


async def _complete(state: ServerState, request: Request, req):
    sid = request.path_params.get("sid") or request.headers.get(SESSION_HEADER) or req.user
    session = state.store.get(sid)
    await session.lock.acquire()
    try:
        jobs, plan, events = _submit(state, session, sid, req)
    except BaseException:
        session.lock.release()
        raise
    headers = {"X-Jaxagent-Session": session.id}
    if plan.divergence is not None:
        state.divergences += 1
        headers[DIVERGENCE_HEADER] = json.dumps(plan.divergence, separators=(",", ":"))
    cid = "chatcmpl-" + uuid.uuid4().hex[:24]
    # The turn is collected (and the session recorded, its lock released) by a task of
    # its own, whatever becomes of the HTTP response: a client gone before its stream
    # started still frees its session.
    out: asyncio.Queue = asyncio.Queue()
    collector = asyncio.create_task(_collect(state, session, sid, req, plan, events, out))
    if not req.stream:
        try:
            results, turns = await asyncio.shield(collector)
        except asyncio.CancelledError:
            for job in jobs:
                job.cancelled = True
            raise
        choices = []
        for c, (r, t) in enumerate(zip(results, turns)):
            lp = logprobs_block(_token_texts(state, r.tokens), r.logprobs)
            choices.append(
                {
                    "index": c,
                    "message": t.openai_message(_call_ids(cid, c, t)),
                    "finish_reason": _finish(r.finish_reason, t),
                    "logprobs": lp if req.logprobs else None,
                }
            )
        n_out = sum(len(r.tokens) for r in results)
        u = usage(len(plan.context), n_out, results[0].cached_tokens)
        return JSONResponse(completion(cid, state.model_id, choices, u), headers=headers)
    return StreamingResponse(
        _stream(state, req, cid, plan, jobs, out, collector),
        media_type="text/event-stream",
        headers=headers,
    )


def _submit(state: ServerState, session, sid, req):
    try:
        plan = session.plan(req.messages, req.tools, state.renderer)
    except APIError:
        raise
    except Exception as err:  # noqa: BLE001 -- a template rejecting messages (jinja)
        raise bad(f"the chat template cannot render these messages: {err}", "messages")
    max_tokens = req.max_tokens or state.backend.max_new_tokens
    need = len(plan.context) + max_tokens
    limit = min(state.max_context or state.backend.capacity, state.backend.capacity)
    if need > limit:
        raise bad(
            f"This model's maximum context length is {limit} tokens; "
            f"the messages take {len(plan.context)} and max_tokens {max_tokens} "
            f"({need} in all). Shorten the messages or max_tokens.",
            "messages",
            "context_length_exceeded",
        )
    loop = asyncio.get_running_loop()
    events: asyncio.Queue = asyncio.Queue()
    sampling = state.backend.sampling_for(req.temperature, req.top_p)
    turn = sum(session.sampled[: plan.cut])
    stream = state.streams.get(sid) if req.seed is None else None
    gstart = -1
    regex = req.grammar(state.renderer.chat.syntax)
    if regex is not None:
        try:
            gstart = state.backend.compile(regex)
        except ConfigError as err:
            raise bad(str(err), "response_format" if req.json_schema else "tools") from None
    jobs = []
    for c in range(req.n):

        def emit(kind, payload, c=c):
            loop.call_soon_threadsafe(events.put_nowait, (c, kind, payload))

        jobs.append(
            Job(
                session=sid if c == 0 else None,
                context=plan.context,
                sampling=sampling,
                max_tokens=max_tokens,
                stops=req.stop,
                seed=req.seed,
                row=c if req.seed is not None else state.backend.next_row(),
                turn=turn,
                emit=emit,
                stream=req.stream,
                gstart=gstart,
            )
        )
        if stream is not None and c == 0:  # the driver's (key, episode row, turn)
            jobs[-1].key, jobs[-1].key_id, jobs[-1].row = stream
    for job in jobs:
        state.backend.submit(job)
    return jobs, plan, events


async def _collect(state: ServerState, session, sid, req, plan, events, out):
    """Every choice's events (forwarded to ``out`` for a stream) until all are done;
    then the session records the first choice's turn. Releases the session's lock."""
    try:
        results: list[Result | None] = [None] * req.n
        while any(r is None for r in results):
            c, kind, payload = await events.get()
            out.put_nowait((c, kind, payload))
            if kind == "error":
                raise APIError(500, f"the policy failed: {payload!r}", type="server_error")
            if kind == "done":
                results[c] = payload
        turns = [_Turn(state, req, r.tokens) for r in results]
        if sid is not None and results[0].finish_reason != "cancelled":
            r, t = results[0], turns[0]
            choice = Sampled(r.tokens, r.logprobs, t.message(), t.text, r.masks)
            session.commit(plan, req.tools, choice, r.version)
        return results, turns
    finally:
        session.lock.release()


async def _stream(state: ServerState, req, cid, plan, jobs, out, collector):
    ids: list[list[int]] = [[] for _ in range(req.n)]
    shown = [""] * req.n
    done_ok = False
    markers = _MARKERS if req.tools and req.tool_choice != "none" else ()
    try:
        for c in range(req.n):
            first = {"index": c, "delta": {"role": "assistant", "content": ""}}
            first["logprobs"], first["finish_reason"] = None, None
            yield _sse(chunk(cid, state.model_id, [first]))
        ended = 0
        while ended < req.n:
            c, kind, payload = await out.get()
            if kind == "error":
                msg = f"the policy failed: {payload!r}"
                yield _sse({"error": {"message": msg, "type": "server_error"}})
                return
            if kind == "tokens":
                new_ids, new_lps = payload
                ids[c] += new_ids
                text = visible_text(state.chat.decode(ids[c]), req.stop, markers, False)
                if text.startswith(shown[c]) and len(text) > len(shown[c]):
                    ch = {"index": c, "delta": {"content": text[len(shown[c]) :]}}
                    ch["finish_reason"] = None
                    ch["logprobs"] = (
                        logprobs_block(_token_texts(state, new_ids), new_lps)
                        if req.logprobs
                        else None
                    )
                    shown[c] = text
                    yield _sse(chunk(cid, state.model_id, [ch]))
            elif kind == "done":
                ended += 1
                t = _Turn(state, req, payload.tokens)
                delta: dict[str, Any] = {}
                if t.content.startswith(shown[c]) and len(t.content) > len(shown[c]):
                    delta["content"] = t.content[len(shown[c]) :]
                if t.calls:
                    calls = openai_tool_calls(t.calls, _call_ids(cid, c, t))
                    delta["tool_calls"] = [{"index": i, **x} for i, x in enumerate(calls)]
                if delta:
                    ch = {"index": c, "delta": delta, "finish_reason": None, "logprobs": None}
                    yield _sse(chunk(cid, state.model_id, [ch]))
                end = {"index": c, "delta": {}, "logprobs": None}
                end["finish_reason"] = _finish(payload.finish_reason, t)
                yield _sse(chunk(cid, state.model_id, [end]))
        results, _ = await collector
        done_ok = True
        if req.include_usage:
            n_out = sum(len(r.tokens) for r in results)
            u = usage(len(plan.context), n_out, results[0].cached_tokens)
            yield _sse(chunk(cid, state.model_id, [], u))
        yield "data: [DONE]\n\n"
    finally:
        if not done_ok:
            state.disconnects += 1
            for job in jobs:
                job.cancelled = True


async def not_found(request: Request, exc: HTTPException):
    code = "not_found" if exc.status_code == 404 else "method_not_allowed"
    err = APIError(
        exc.status_code,
        f"{request.method} {request.url.path}: {exc.detail}",
        code=code,
    )
    return _error(err)


async def server_error(request: Request, exc: Exception):
    _state(request).errors += 1
    return _error(APIError(500, f"internal error: {exc!r}", type="server_error"))


ROUTES = [
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/v1/models", models, methods=["GET"]),
    Route("/v1/models/{model:path}", model, methods=["GET"]),
    # A session's own base URL (``/s/{id}/v1``): a harness that only takes a base_url
    # (``jaxagent.serve.harness``) names its session without headers.
    Route("/s/{sid}/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/s/{sid}/v1/models", models, methods=["GET"]),
    Route("/v1/stats", stats, methods=["GET"]),
    Route("/v1/sessions/{sid}", session_info, methods=["GET"]),
    Route("/v1/sessions/{sid}/episode", session_episode, methods=["GET"]),
    Route("/v1/sessions/{sid}/reward", reward, methods=["POST"]),
    Route("/v1/sessions/{sid}/end", end, methods=["POST"]),
]


def create_app(state: ServerState) -> ServeApp:
    """The app serving ``state`` (its ``app.state``)."""
    app = ServeApp(
        routes=ROUTES,
        exception_handlers={HTTPException: not_found, Exception: server_error},
    )
    app.state = state
    return app


def _call_ids(cid: str, c: int, turn: _Turn) -> list[str]:
    return [f"call_{cid[9:]}_{c}_{i}" for i in range(len(turn.calls))]


def _sse(obj: dict) -> str:
    return "data: " + json.dumps(obj, separators=(",", ":")) + "\n\n"
