"""A reward function named in the config (``harness.reward``) scores a session from the server.

- ``POST /v1/sessions/{id}/end`` without a reward: the configured function is called on the
  session's recorded messages and the client's ``task``, and its value is the episode's
  reward; a reward in the body still wins; without either, a 400 JSON error; a function that
  raises or returns no number, a 500 JSON error and the session left open.
- The trainer's harness path (``collect_harness_episodes(reward_fn=...)``): a harness
  returning None is scored by the function; without one, or when it raises, an env_error.
- A bad entry point stops the config with a ``ConfigError`` naming ``harness.reward``.
"""

# ruff: noqa: F811 -- the shared fixtures (serve_fixtures) are parameters of the tests

from pathlib import Path

import jax
import pytest
from serve_fixtures import SYSTEM, client_of, policy, server  # noqa: F401
from test_serve import TASKS, scripted_harness

try:  # the HTTP client the openai package depends on (httpx2 in its recent releases)
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx

from jaxagent.envs.base import Task
from jaxagent.errors import ConfigError
from jaxagent.serve.harness import HarnessConfig, collect_harness_episodes

SEEN = []


def count_reward(messages, task):
    """A reward function entry point: the number of answers, plus the task's bonus."""
    SEEN.append((messages, task))
    bonus = task.data.get("bonus", 0) if task is not None else 0
    return sum(m["role"] == "assistant" for m in messages) + bonus


def _converse(srv, sid: str, turns: int = 2) -> list[dict]:
    client, head = client_of(srv), {"X-Session-Id": sid}
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "look at the box red"},
    ]
    for _ in range(turns):
        r = client.chat.completions.create(
            model="tiny", messages=messages, seed=2, max_tokens=3, extra_headers=head
        )
        messages.append(r.choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "user", "content": "one two"})
    return messages[:-1]


@pytest.fixture
def store(server):
    store = server.state.store
    yield store
    store.reward_fn = None
    store.pop_episodes()


def test_the_configured_function_scores_an_ended_session(server, store):
    store.reward_fn = HarnessConfig(reward="test_serve_reward:count_reward").reward_fn()
    assert store.reward_fn is count_reward
    SEEN.clear()
    sent = _converse(server, "scored")
    task = {"id": "t1", "prompt": "look", "data": {"bonus": 0.5}}
    r = httpx.post(f"{server.base_url}/sessions/scored/end", json={"task": task})
    assert r.status_code == 200, r.text
    assert r.json()["reward"] == 2.5 and r.json()["turns"] == 2
    ((messages, task),) = SEEN
    # the Task the function receives in training, not the JSON
    assert task == Task(id="t1", split="serve", prompt="look", data={"bonus": 0.5})
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert [m["content"] for m in messages] == [m["content"] for m in sent]
    (ep,) = store.pop_episodes()
    assert ep.reward == 2.5 and ep.success and ep.num_policy_tokens > 0
    assert "scored" not in store.sessions
    # No body at all: task None; a reward sent to /end wins over the function.
    _converse(server, "bare", turns=1)
    assert httpx.post(f"{server.base_url}/sessions/bare/end").json()["reward"] == 1.0
    assert SEEN[-1][1] is None
    _converse(server, "sent", turns=1)
    r = httpx.post(f"{server.base_url}/sessions/sent/end", json={"reward": -1})
    assert r.json()["reward"] == -1.0 and len(SEEN) == 2


def test_ending_errors(server, store):
    _converse(server, "open", turns=1)
    url = f"{server.base_url}/sessions"

    def err(path, status, code, **kw):
        r = httpx.post(f"{url}/{path}", **kw)
        assert r.status_code == status, r.text
        assert r.json()["error"]["code"] == code, r.text
        return r.json()["error"]

    # No reward and no function configured: a 400 naming both ways out.
    e = err("open/end", 400, "missing_reward")
    assert "harness.reward" in e["message"] and e["param"] == "reward"
    err("open/end", 400, "missing_reward", json={"task": "t"})
    err("open/end", 400, "invalid_json", content=b"{nope")
    err("open/end", 400, "invalid_type", json=[1])
    err("open/end", 400, "invalid_value", json={"reward": "high"})
    err("open/reward", 400, "invalid_json")  # /reward still needs one
    store.reward_fn = count_reward
    err("nobody/end", 404, "session_not_found")
    for broken, why in [(lambda m, t: 1 / 0, "ZeroDivisionError"), (lambda m, t: "ok", "'ok'")]:
        store.reward_fn = broken
        e = err("open/end", 500, "reward_failed")
        assert why in e["message"] and "open" in store.sessions  # the session stays open
    r = httpx.post(f"{url}/open/end", json={"reward": 1})  # and can still be ended
    assert r.status_code == 200 and "open" not in store.sessions


def _returns_none(task, base_url, api_key):
    scripted_harness(task, base_url, api_key)


def test_harness_path_scores_with_the_function(server):
    """A harness returning None: scored by ``reward_fn`` over its session's messages and its
    task; without a function, or when it raises, an env_error episode."""
    SEEN.clear()
    key = jax.random.key(3)
    run = {"samples_per_task": 1, "key": key, "timeout_s": 60}
    eps = collect_harness_episodes(server, _returns_none, TASKS[:2], reward_fn=count_reward, **run)
    assert not any(ep.env_failed for ep in eps)
    assert [ep.reward for ep in eps] == [len(ep.turns) for ep in eps]
    assert [t for _, t in SEEN] == TASKS[:2]
    (ep,) = collect_harness_episodes(server, _returns_none, TASKS[:1], **run)
    assert ep.env_failed and "not a reward" in ep.error
    (ep,) = collect_harness_episodes(
        server, _returns_none, TASKS[:1], reward_fn=lambda m, t: None, **run
    )
    assert ep.env_failed and "harness.reward: TypeError" in ep.error and ep.tokens


def test_bad_reward_entry_points_stop_the_config():
    from jaxagent.train.config import load_config

    for spec in (
        "no_colon",
        "test_serve_reward:nothing_here",
        "no_such_module_x:f",
        "json:__doc__",
    ):
        with pytest.raises(ConfigError, match="harness.reward="):
            HarnessConfig(reward=spec)
    qs = str(Path(__file__).resolve().parents[1] / "configs/quickstart.yaml")
    with pytest.raises(ConfigError, match="harness.reward='nope:missing' cannot be loaded"):
        load_config(qs, ["harness.reward=nope:missing"])
    ok = load_config(qs, ["harness.reward=test_serve_reward:count_reward"])
    assert ok.harness.reward_fn() is count_reward


def test_serve_command_wires_the_function(monkeypatch):
    """``jaxagent serve CONFIG harness.reward=...``: the served state scores with it."""
    import jaxagent.serve.server as server_mod
    from jaxagent.cli.main import main

    seen = {}

    def serve(state, host, port):
        seen["fn"] = state.store.reward_fn
        state.backend.close()

    monkeypatch.setattr(server_mod, "serve", serve)
    config = str(Path(__file__).resolve().parents[1] / "configs/quickstart.yaml")
    settings = ["model.num_layers=1", "harness.reward=test_serve_reward:count_reward"]
    assert main(["serve", config, "--slots", "1", *settings]) == 0
    assert seen == {"fn": count_reward}
