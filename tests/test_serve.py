"""The OpenAI-compatible policy server, driven by the real ``openai`` client on localhost.

- A harness loop over the scripted world of ``test_rollout`` (sampled, a seed per request,
  streaming and plain turns alternating, three conversations at once on two KV slots, so
  requests share decode calls and a session is evicted and re-prefilled): every stored
  episode has exactly the tokens, loss mask and turn ids the built-in driver records for the
  same task and key, log-probs within float rounding, and the learner's teacher-forced
  log-probs agree with them to 1e-4 (fp32).
- A tool-calling conversation over a ChatML template (native ``<tool_call>`` blocks come back
  as OpenAI ``tool_calls``; tool results go back through the template's tool role), streaming
  and not: the session's token stream decodes to the template's rendering of the whole
  conversation.
- A harness that edits its history gets ``X-Jaxagent-Divergence`` and the episode records it.
- A sweep of malformed requests: each gets its status code and an OpenAI JSON error body, a
  client that drops a stream mid-way is survived, and the server answers afterwards.
"""

# ruff: noqa: F811 -- the shared fixtures (serve_fixtures) are parameters of the tests

import concurrent.futures
import json
import threading

import jax
import numpy as np
import openai
import pytest
from serve_fixtures import (  # noqa: F401 -- fixtures
    BUDGET,
    N,
    SYSTEM,
    ScriptedBackend,
    client_of,
    policy,
    server,
)
from test_rollout import ScriptedEnv

try:  # the HTTP client the openai package depends on (httpx2 in its recent releases)
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx

from episode_checks import assert_same_episodes

from jaxagent.agents.batch import pack_episodes
from jaxagent.agents.cached import CachedTurnSampler
from jaxagent.agents.chat import TemplateChat
from jaxagent.agents.engine import SlotEngine
from jaxagent.agents.rollout import RolloutSpec, collect_episodes
from jaxagent.agents.runner import InlineRunner
from jaxagent.envs.base import Task
from jaxagent.serve.app import ServerState
from jaxagent.serve.render import Renderer
from jaxagent.serve.server import ServerThread, state_for_run
from jaxagent.serve.sessions import DIVERGENCE_HEADER
from jaxagent.train.policy import make_logprob_fn
from jaxagent.train.tokenizer import build_chatml_tokenizer

TASKS = [
    Task(id="a", split="train", prompt="", data={"n": 2, "turns": 3}),
    Task(id="b", split="train", prompt="", data={"n": 5, "turns": 2}),
    Task(id="c", split="train", prompt="", data={"n": 3, "turns": 4}),
]
SEEDS = [3, 4, 5]


@pytest.fixture(scope="module")
def engine(policy):
    """The built-in driver with the rollout engine (same tokens as the lock-step one:
    tests/test_engine.py), one instance: its slot programs compile once."""
    chat, graphdef, _, sampling = policy
    return SlotEngine(graphdef, sampling, 256, chat.pad_id, slots=1, decode_steps=3)


def _harness(srv, task: Task, seed: int, sid: str, barrier=None) -> None:
    """A hand-written agent loop: the scripted world's observations as user messages, the
    model's answers echoed back as the client returned them; streams every other turn."""
    client, env = client_of(srv), ScriptedEnv()
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": env.reset(task)},
    ]
    for turn in range(BUDGET.max_turns):
        if barrier is not None and turn == 0:
            barrier.wait()
        kwargs = {
            "model": "tiny",
            "messages": messages,
            "seed": seed,
            "temperature": 1.0,
            "max_tokens": N,
            "extra_headers": {"X-Session-Id": sid},
        }
        if turn % 2:
            content = ""
            for ch in client.chat.completions.create(stream=True, **kwargs):
                if ch.choices and ch.choices[0].delta.content:
                    content += ch.choices[0].delta.content
            messages.append({"role": "assistant", "content": content})
        else:
            msg = client.chat.completions.create(**kwargs).choices[0].message
            messages.append(msg.model_dump(exclude_none=True))
            content = msg.content
        result = env.step(content)
        if result.done:
            break
        messages.append({"role": "user", "content": result.observation})
    r = httpx.post(f"{srv.base_url}/sessions/{sid}/reward", json={"reward": result.reward})
    assert r.status_code == 200, r.text


def _driver_episode(policy, sampler, task: Task, seed: int):
    chat, _, params, _ = policy
    spec = RolloutSpec(chat, SYSTEM, BUDGET, InlineRunner(ScriptedEnv))
    eps, _ = collect_episodes(
        sampler,
        params,
        [task],
        samples_per_task=1,
        spec=spec,
        key=jax.random.key(seed),
    )
    return eps[0]


# The lock-step driver's per-call compiles take a minute on 2 CPU cores: nightly.
@pytest.mark.parametrize("driver", ["engine", pytest.param("lockstep", marks=pytest.mark.slow)])
def test_episodes_equal_the_driver_and_the_learner(policy, server, engine, driver):
    store = server.state.store
    store.pop_episodes()
    barrier = threading.Barrier(len(TASKS))
    with concurrent.futures.ThreadPoolExecutor(len(TASKS)) as pool:
        futures = [
            pool.submit(_harness, server, t, s, f"eq-{t.id}", barrier) for t, s in zip(TASKS, SEEDS)
        ]
        for f in futures:
            f.result()
    served = {ep.task.id: ep for ep in store.pop_episodes()}
    stats = server.state.backend.stats
    assert stats.max_batch >= 2  # concurrent requests shared decode calls
    assert stats.evictions >= 1  # three sessions on two slots
    assert 0 < stats.reused_tokens < stats.prompt_tokens  # later turns reused their KV
    eps = []
    chat, graphdef, params, sampling = policy
    sampler = engine
    if driver == "lockstep":
        sampler = CachedTurnSampler(graphdef, sampling, 256, chat.pad_id)
    for task, seed in zip(TASKS, SEEDS):
        ref, ep = _driver_episode(policy, sampler, task, seed), served[f"eq-{task.id}"]
        assert len(ref.turns) >= 2
        assert_same_episodes([ep], [ref], endings=False)
        assert [t.action for t in ep.turns] == [t.action for t in ref.turns]
        assert ep.info["divergences"] == []
        eps.append(ep)
    batch = pack_episodes(eps, pad_id=chat.pad_id, max_len=256, length_multiple=16)
    learner, _ = make_logprob_fn(graphdef)(params, batch.tokens, batch.positions, batch.segment_ids)
    mask = batch.loss_mask > 0
    assert mask.sum() >= 6 * N
    np.testing.assert_allclose(
        np.asarray(learner)[mask], batch.old_logprobs[mask], atol=1e-4, rtol=0
    )


def test_edited_history_is_reported(server):
    client = client_of(server)
    sid = "edit"
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "look at the box red"},
    ]
    head = {"X-Session-Id": sid}
    first = client.chat.completions.with_raw_response.create(
        model="tiny", messages=messages, seed=1, extra_headers=head
    )
    assert first.headers.get(DIVERGENCE_HEADER) is None
    messages.append(first.parse().choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "user", "content": "one two three"})
    second = client.chat.completions.with_raw_response.create(
        model="tiny", messages=messages, seed=1, extra_headers=head
    )
    assert second.headers.get(DIVERGENCE_HEADER) is None
    before = server.state.divergences
    # The harness rewrites the model's first answer and a tool result.
    edited = [*messages[:2], {"role": "assistant", "content": "ok done"}, messages[3]]
    third = client.chat.completions.with_raw_response.create(
        model="tiny", messages=edited, seed=1, extra_headers=head
    )
    report = json.loads(third.headers[DIVERGENCE_HEADER])
    assert report["at_message"] == 2 and report["kept_messages"] == 0
    assert report["dropped_sampled_tokens"] >= 2
    assert server.state.divergences == before + 1
    stored = httpx.get(f"{server.base_url}/sessions/{sid}").json()
    # Re-rendered from the start: the edited answer is prompt (loss 0), one sampled turn.
    assert stored["turn_ids"].count(0) >= 1 and 1 not in stored["turn_ids"]
    assert sum(stored["loss_mask"]) == third.parse().usage.completion_tokens
    # The stream is the fresh rendering of the edited conversation plus the new turn.
    assert third.parse().usage.prompt_tokens == stored["loss_mask"].index(1)
    r = httpx.post(f"{server.base_url}/sessions/{sid}/reward", json={"reward": 0.0})
    assert r.json()["divergences"] == 1
    ep = server.state.store.pop_episodes()[-1]
    assert ep.info["divergences"][0]["at_message"] == 2


def test_turn_options(policy, server):
    """n, seed, logprobs, max_tokens, stop and per-request temperature on the real model: a
    turn cut by max_tokens rewinds its slot, and the next turn's stored log-probs are still
    the learner's."""
    client, url = client_of(server), server.base_url
    base = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "look at the box red"},
    ]

    def ask(sid, messages=base, **kw):
        kw.setdefault("seed", 7)
        return client.chat.completions.create(
            model="tiny", messages=messages, extra_headers={"X-Session-Id": sid}, **kw
        )

    one = ask("opt-1", logprobs=True)
    full = one.choices[0].message.content
    stored = httpx.get(f"{url}/sessions/opt-1").json()
    sampled = [lp for lp, m in zip(stored["logprobs"], stored["loss_mask"]) if m]
    assert [x.logprob for x in one.choices[0].logprobs.content] == pytest.approx(sampled)
    # a harness's generous max_tokens is served up to the policy's turn length
    big = ask("opt-6", max_tokens=4096)
    assert big.choices[0].message.content == full and big.usage.completion_tokens <= N
    two = ask("opt-2", n=2)
    assert len(two.choices) == 2 and two.choices[0].message.content == full
    assert two.choices[1].message.content != full  # its own stream (row 1)
    # max_tokens: the same stream's first two tokens; the slot keeps only those
    short = ask("opt-3", max_tokens=2)
    assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 2
    ids = [t for t, m in zip(stored["tokens"], stored["loss_mask"]) if m]
    ids3 = httpx.get(f"{url}/sessions/opt-3").json()["tokens"]
    assert ids3[-2:] == ids[:2]
    ask(
        "opt-3",
        [
            *base,
            short.choices[0].message.model_dump(exclude_none=True),
            {"role": "user", "content": "one two"},
        ],
    )
    httpx.post(f"{url}/sessions/opt-3/reward", json={"reward": 1.0})
    (ep,) = [e for e in server.state.store.pop_episodes() if e.task.id == "opt-3"]
    assert ep.num_policy_tokens > 2 and ep.info["divergences"] == []
    chat, graphdef, params, _ = policy
    batch = pack_episodes([ep], pad_id=chat.pad_id, max_len=256, length_multiple=16)
    learner, _ = make_logprob_fn(graphdef)(params, batch.tokens, batch.positions, batch.segment_ids)
    mask = batch.loss_mask > 0
    np.testing.assert_allclose(np.asarray(learner)[mask], batch.old_logprobs[mask], atol=1e-4)
    # stop strings: the text before the first one, streaming or not
    words = full.split()
    stop = next((w for w in words[1:] if full.find(w) > 0), None)
    if stop is not None:
        cut = ask("opt-4", stop=[stop])
        assert cut.choices[0].message.content == full[: full.find(stop)]
        assert cut.choices[0].finish_reason == "stop"
        streamed = "".join(
            ch.choices[0].delta.content or ""
            for ch in ask("opt-5", stop=[stop], stream=True)
            if ch.choices
        )
        assert streamed == full[: full.find(stop)]


@pytest.mark.slow  # two more device programs to compile (nightly)
def test_mixed_sampling_settings(server):
    """Greedy and sampled requests at once: one device program runs at a time, the other's
    requests wait for it (first come, first served), and greedy answers do not change."""
    client = client_of(server)
    base = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "look at the box"}]

    def ask(sid, **kw):
        return client.chat.completions.create(
            model="tiny", messages=base, extra_headers={"X-Session-Id": sid}, **kw
        )

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        g = pool.submit(ask, "mix-g1", temperature=0.0)
        t = pool.submit(ask, "mix-t1", temperature=0.7, seed=1)
        u = pool.submit(ask, "mix-u1", temperature=1.0, seed=1)
        greedy, warm, hot = g.result(), t.result(), u.result()
    assert warm.choices[0].finish_reason and hot.choices[0].finish_reason
    again = ask("mix-g2", temperature=0.0)
    assert again.choices[0].message.content == greedy.choices[0].message.content


def test_policy_update_between_turns(policy, server):
    """New weights mid-conversation: the turn before is recorded as version 0 and its log-probs
    are the old weights', the turn after as version 1 with the new weights' log-probs (the
    cached context was re-prefilled, not reused)."""
    _, graphdef, params, _ = policy
    state, client = server.state, client_of(server)
    newer = jax.tree.map(lambda x: x * 1.5, params)
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "look at the box"},
    ]
    head = {"X-Session-Id": "upd"}
    r = client.chat.completions.create(model="tiny", messages=messages, seed=2, extra_headers=head)
    messages += [
        r.choices[0].message.model_dump(exclude_none=True),
        {"role": "user", "content": "ok"},
    ]
    state.update_policy(newer, 1)
    try:
        client.chat.completions.create(model="tiny", messages=messages, seed=2, extra_headers=head)
    finally:
        state.update_policy(params, 0)
    httpx.post(f"{server.base_url}/sessions/upd/reward", json={"reward": 0.0})
    (ep,) = [e for e in state.store.pop_episodes() if e.task.id == "upd"]
    assert ep.info["policy_versions"] == [0, 1]
    assert {v for v, t in zip(ep.versions, ep.turn_ids) if t >= 0} == {0, 1}
    assert [v for v, t in zip(ep.versions, ep.turn_ids) if t < 0] == [-1] * ep.turn_ids.count(-1)
    tokens = np.asarray(ep.tokens)[None]
    positions, segments = np.arange(tokens.shape[1])[None], np.ones_like(tokens)
    fn = make_logprob_fn(graphdef)
    turn_ids, stored = np.asarray(ep.turn_ids), np.asarray(ep.logprobs)
    for version, weights in enumerate((params, newer)):
        learner = np.asarray(fn(weights, tokens, positions, segments)[0])[0]
        at = turn_ids == version
        assert at.sum() >= 1
        np.testing.assert_allclose(learner[at], stored[at], atol=1e-4, rtol=0)


def scripted_harness(task, base_url, api_key):
    """A harness entry point: the plain openai client, no session header, no seed."""
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)
    env = ScriptedEnv()
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": env.reset(task)},
    ]
    for _ in range(BUDGET.max_turns):
        r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=N)
        messages.append(r.choices[0].message.model_dump(exclude_none=True))
        result = env.step(r.choices[0].message.content)
        if result.done:
            return result.reward
        messages.append({"role": "user", "content": result.observation})
    return 0.0


def test_harness_path_samples_the_drivers_episodes(policy, server, engine):
    """``collect_harness_episodes``: a harness per (task, sample), four at once on two slots,
    gives the built-in driver's episodes for the same key (order, groups, tokens, masks,
    log-probs); the harness that crashes (the world raises) is an env_error episode with the
    tokens it had, as the driver's is."""
    from jaxagent.serve.harness import collect_harness_episodes

    chat, _, params, _ = policy
    tasks = [
        *TASKS[:2],
        Task(id="e", split="train", prompt="", data={"n": 4, "turns": 3, "crash_at": 2}),
    ]
    key = jax.random.key(11)
    eps = collect_harness_episodes(
        server, scripted_harness, tasks, samples_per_task=2, key=key, group_offset=5, concurrency=4
    )
    spec = RolloutSpec(chat, SYSTEM, BUDGET, InlineRunner(ScriptedEnv))
    ref, _ = collect_episodes(
        engine, params, tasks, samples_per_task=2, spec=spec, key=key, group_offset=5
    )
    assert [ep.task.id for ep in eps] == [ep.task.id for ep in ref]
    assert [ep.group for ep in eps] == [ep.group for ep in ref] == [5, 5, 6, 6, 7, 7]
    assert_same_episodes(eps, ref, rewards=False, endings=False)
    assert eps[0].tokens != eps[1].tokens  # the two samples of a task drew their own rows
    assert (
        [ep.env_failed for ep in eps] == [ep.env_failed for ep in ref] == [False] * 4 + [True] * 2
    )
    assert "tool server died" in eps[-1].error
    assert [ep.reward for ep in eps[:4]] == [ep.reward for ep in ref[:4]]


def test_harness_failures_are_env_errors(server):
    import time

    from jaxagent.serve.harness import collect_harness_episodes, load_harness

    def hangs(task, base_url, api_key):
        time.sleep(3)

    def no_reward(task, base_url, api_key):
        scripted_harness(task, base_url, api_key)
        return "done"

    for fn, why in [
        (hangs, "timeout"),
        (no_reward, "not a reward"),
        (lambda *a: 1.0, "no request"),
    ]:
        (ep,) = collect_harness_episodes(
            server, fn, TASKS[1:2], samples_per_task=1, key=jax.random.key(0), timeout_s=1.5
        )
        assert ep.env_failed and why in ep.error, ep.error
    assert load_harness("test_serve:scripted_harness") is scripted_harness
    from jaxagent.errors import ConfigError

    for bad_spec in ("no_colon", "test_serve:nothing_here", "no_such_module_x:f"):
        with pytest.raises(ConfigError, match="harness.entry="):
            load_harness(bad_spec)


def _bad_cases():
    ok = [{"role": "user", "content": "look"}]
    long = [{"role": "user", "content": " ".join(["look"] * 400)}]
    return [
        ("not json", b"{nope", 400, "invalid_json"),
        ("body is a list", [1, 2], 400, "invalid_body"),
        ("unknown model", {"model": "gpt-9", "messages": ok}, 404, "model_not_found"),
        ("no model", {"messages": ok}, 400, "missing_model"),
        ("no messages", {"model": "tiny"}, 400, "invalid_messages"),
        ("empty messages", {"model": "tiny", "messages": []}, 400, "invalid_messages"),
        ("bad role", {"model": "tiny", "messages": [{"role": "robot", "content": "x"}]}, 400, None),
        ("message not an object", {"model": "tiny", "messages": ["hi"]}, 400, "invalid_type"),
        ("no content", {"model": "tiny", "messages": [{"role": "user"}]}, 400, "missing_content"),
        (
            "image part",
            {"model": "tiny", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            400,
            "invalid_content",
        ),
        (
            "system only",
            {"model": "tiny", "messages": [{"role": "system", "content": "x"}]},
            400,
            None,
        ),
        ("tools not a list", {"model": "tiny", "messages": ok, "tools": {"a": 1}}, 400, None),
        (
            "tool without name",
            {"model": "tiny", "messages": ok, "tools": [{"type": "function", "function": {}}]},
            400,
            None,
        ),
        (
            "bad tool-call arguments",
            {
                "model": "tiny",
                "messages": [
                    *ok,
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "1",
                                "type": "function",
                                "function": {"name": "f", "arguments": "{x"},
                            }
                        ],
                    },
                ],
            },
            400,
            "invalid_json",
        ),
        ("temperature too high", {"model": "tiny", "messages": ok, "temperature": 5}, 400, None),
        (
            "temperature a string",
            {"model": "tiny", "messages": ok, "temperature": "hot"},
            400,
            None,
        ),
        ("stream not a boolean", {"model": "tiny", "messages": ok, "stream": "yes"}, 400, None),
        ("max_tokens zero", {"model": "tiny", "messages": ok, "max_tokens": 0}, 400, None),
        ("n too large", {"model": "tiny", "messages": ok, "n": 99}, 400, None),
        ("stop not strings", {"model": "tiny", "messages": ok, "stop": [1]}, 400, None),
        (
            "unknown parameter",
            {"model": "tiny", "messages": ok, "best_of": 2},
            400,
            "unsupported_parameter",
        ),
        (
            "tool_choice required without tools",
            {"model": "tiny", "messages": ok, "tool_choice": "required"},
            400,
            None,
        ),
        ("context too long", {"model": "tiny", "messages": long}, 400, "context_length_exceeded"),
    ]


def test_malformed_requests_get_openai_errors(server):
    url = f"{server.base_url}/chat/completions"
    cases = _bad_cases()
    assert len(cases) >= 15
    for name, body, status, code in cases:
        if isinstance(body, bytes):
            r = httpx.post(url, content=body, headers={"content-type": "application/json"})
        else:
            r = httpx.post(url, json=body)
        assert r.status_code == status, (name, r.text)
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}, name
        assert isinstance(err["message"], str) and err["message"], name
        if code is not None:
            assert err["code"] == code, (name, err)
    assert httpx.get(f"{server.base_url}/nowhere").status_code == 404
    assert httpx.get(url).status_code == 405
    # The openai client maps them to its own exceptions.
    client = client_of(server)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], n=99
        )
    # A client that drops a stream after its first chunk: the server keeps serving.
    body = {"model": "tiny", "messages": [{"role": "user", "content": "look"}], "stream": True}
    with httpx.stream("POST", url, json=body, headers={"X-Session-Id": "gone"}) as r:
        assert r.status_code == 200
        next(r.iter_lines())
    out = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "look"}],
        extra_headers={"X-Session-Id": "gone"},
    )
    assert out.choices[0].finish_reason in ("stop", "length")
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-9")


# ---- tool calls over a ChatML template ----------------------------------------------------


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_price",
            "description": "price of a share",
            "parameters": {"type": "object", "properties": {"ticker": {"type": "string"}}},
        },
    }
]
CALL = '<tool_call>\n{"name": "get_price", "arguments": {"ticker": "acme"}}\n</tool_call>'


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calling_conversation(stream):
    corpus = ["what do 3 shares of acme cost ? get_price ticker 12 36 " + CALL] * 4
    chat = TemplateChat(build_chatml_tokenizer(corpus, 400))
    assert chat.syntax == "hermes" and chat.observation_role == "tool"
    backend = ScriptedBackend(chat, ["let me look\n" + CALL, "36"])
    srv = ServerThread(ServerState(backend=backend, renderer=Renderer(chat), model_id="tiny"))
    try:
        client = client_of(srv)
        messages = [
            {"role": "system", "content": "you trade"},
            {"role": "user", "content": "what do 3 shares of acme cost?"},
        ]
        kw = {"model": "tiny", "tools": TOOLS, "extra_headers": {"X-Session-Id": "tools"}}

        def ask():
            if not stream:
                r = client.chat.completions.create(messages=messages, **kw)
                return r.choices[0].message, r.choices[0].finish_reason
            content, calls, finish = "", {}, None
            for ch in client.chat.completions.create(messages=messages, stream=True, **kw):
                d = ch.choices[0].delta
                content += d.content or ""
                for tc in d.tool_calls or []:
                    calls.setdefault(tc.index, tc)
                finish = ch.choices[0].finish_reason or finish
            msg = {"role": "assistant", "content": content or None}
            if calls:
                msg["tool_calls"] = [c.model_dump(exclude_none=True) for c in calls.values()]
                for c in msg["tool_calls"]:
                    c.pop("index")
            return openai.types.chat.ChatCompletionMessage(**msg), finish

        msg, finish = ask()
        assert finish == "tool_calls" and msg.content == "let me look\n"
        (call,) = msg.tool_calls
        assert call.function.name == "get_price"
        assert json.loads(call.function.arguments) == {"ticker": "acme"}
        messages.append(msg.model_dump(exclude_none=True))
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "12"})
        msg, finish = ask()
        assert finish == "stop" and msg.content == "36" and not msg.tool_calls
        # The first context is the template's rendering (tools block included); later ones
        # are the stored ids plus the tool turn's chunk only (the template's tool role): the
        # model's own ids are kept as sampled, never re-rendered.
        first, second = backend.contexts
        tok = chat.tokenizer
        head = tok.apply_chat_template(
            messages[:2], tools=TOOLS, add_generation_prompt=True, tokenize=False
        )
        assert first == tok.encode(head, add_special_tokens=False)
        turn1 = [*tok.encode("let me look\n" + CALL, add_special_tokens=False), chat.eot_id]
        assert second == first + turn1 + chat.observation("12")
        assert "<tool_response>\n12\n</tool_response>" in tok.decode(chat.observation("12"))
        stored = srv.state.store.sessions["tools"].record.tokens
        turn2 = [*tok.encode("36", add_special_tokens=False), chat.eot_id]
        assert stored == second + turn2
    finally:
        srv.close()


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--slots", "0"], "--slots 0"),
        (["--decode-steps", "0"], "--decode-steps 0"),
        (["--port", "70000"], "--port 70000"),
    ],
)
def test_serve_command_input_errors(argv, named, capsys):
    """``jaxagent serve`` refuses bad flags with status 2 and one line naming them."""
    from pathlib import Path

    from jaxagent.cli.main import main

    config = str(Path(__file__).resolve().parents[1] / "configs/quickstart.yaml")
    assert main(["serve", config, *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and named in err[0] and err[0].startswith("jaxagent serve:")


def test_serve_command_serves_the_config(monkeypatch):
    """``jaxagent serve CONFIG``: the config's policy, chat and budget behind the app (uvicorn
    replaced by a server thread answering one request)."""
    from pathlib import Path

    import jaxagent.serve.server as server_mod
    from jaxagent.cli.main import main

    seen = {}

    def serve(state, host, port):
        srv = ServerThread(state, host=host)
        try:
            client = client_of(srv)
            seen["models"] = [m.id for m in client.models.list().data]
            r = client.chat.completions.create(
                model="quickstart", messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
            seen["tokens"] = r.usage.completion_tokens
            seen["capacity"] = state.backend.capacity
        finally:
            srv.close()

    monkeypatch.setattr(server_mod, "serve", serve)
    config = str(Path(__file__).resolve().parents[1] / "configs/quickstart.yaml")
    assert main(["serve", config, "--slots", "2", "model.num_layers=1"]) == 0
    assert seen == {"models": ["quickstart"], "tokens": 2, "capacity": 192}


@pytest.mark.slow  # 28-42 s here (a second model, its compiles and the driver's): nightly
def test_quickstart_harness_equals_the_driver():
    """The example harness (``jaxagent.serve.examples:quickstart_harness``: the plain client, a
    hand-written loop over the quickstart world) against ``configs/quickstart.yaml``'s policy
    through ``collect_harness_episodes``: the built-in driver's episodes for the same key,
    budget truncations included."""
    from pathlib import Path

    from jaxagent.serve.harness import collect_harness_episodes, load_harness
    from jaxagent.train.config import load_config
    from jaxagent.train.run import build_run

    qs = str(Path(__file__).resolve().parents[1] / "configs/quickstart.yaml")
    run = build_run(load_config(qs, ["model.num_layers=1"]))
    sampling = run.sampler.sampling
    state = state_for_run(run, model_id="quickstart", slots=4)
    srv = ServerThread(state)
    tasks, key = run.tasks.eval[:3], jax.random.key(21)
    try:
        harness = load_harness("jaxagent.serve.examples:quickstart_harness")
        eps = collect_harness_episodes(srv, harness, tasks, samples_per_task=2, key=key)
    finally:
        srv.close()
    engine = SlotEngine(run.graphdef, sampling, run.max_len, run.chat.pad_id, slots=6)
    ref, _ = collect_episodes(
        engine, run.params, tasks, samples_per_task=2, spec=run.rollout, key=key
    )
    run.close()
    # The untrained model's answers run to max_new_tokens: every episode ends on the token
    # budget before its 6 turns (the server's context_length_exceeded, the driver's truncation).
    assert all(ep.failure_mode == "step_budget" and len(ep.turns) < 6 for ep in ref)
    assert not any(ep.env_failed for ep in eps)
    assert [len(ep.turns) for ep in eps] == [len(ep.turns) for ep in ref]
    assert_same_episodes(eps, ref, endings=False)
    # The harness returns the world's verdict (an Outcome): the episodes keep the world's
    # failure modes and endings, as the driver records them, not a generic label.
    assert [(ep.termination, ep.failure_mode, ep.success) for ep in eps] == [
        (ep.termination, ep.failure_mode, ep.success) for ep in ref
    ]


def test_trainer_trains_through_a_harness(tmp_path):
    """``harness.entry``: the trainer serves its policy and runs the harness (the example
    openai-client loop over the quickstart world) for every (task, sample); its sessions are
    the iteration's episodes, and a bad entry point is refused before anything runs."""
    from test_train import ROOT, TINY, _by_step

    from jaxagent.errors import ConfigError
    from jaxagent.train.config import load_config
    from jaxagent.train.trainer import Trainer

    qs = ROOT / "configs/quickstart.yaml"
    settings = [
        *TINY,
        f"train.out_dir={tmp_path / 'run'}",
        "train.iterations=1",
        "sft.steps=1",
        "eval.every=0",
        "eval.val_tasks=0",
        f"harness.episodes_out={tmp_path / 'episodes.jsonl'}",
        "harness.entry=jaxagent.serve.examples:quickstart_harness",
        "harness.slots=4",
    ]
    said = []
    Trainer(load_config(qs, settings), echo=said.append).run()
    assert any(s.startswith("[harness] jaxagent.serve.examples:quickstart_harness") for s in said)
    m = _by_step(tmp_path / "run" / "metrics.jsonl")[1]
    assert m["train/episodes"] == 4 and m["train/env_errors"] == 0
    # harness.episodes_out: the iteration's episodes, one JSON line each, with their tasks
    lines = [json.loads(x) for x in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    assert len(lines) == 4 and all(e["task"]["split"] == "train" for e in lines)
    assert all(len(e["loss_mask"]) == len(e["tokens"]) > sum(e["loss_mask"]) > 0 for e in lines)
    assert all(e["failure_mode"] != "harness_reward" for e in lines)
    assert m["tokens/sampled"] > 0 and np.isfinite(m["loss/policy"])
    bad = [*settings[:-3], f"train.out_dir={tmp_path / 'bad'}", "harness.entry=nope:missing"]
    with pytest.raises(ConfigError, match="harness.entry='nope:missing' cannot be loaded"):
        Trainer(load_config(qs, bad), echo=print)
    assert not (tmp_path / "bad").exists()  # refused before anything was written
