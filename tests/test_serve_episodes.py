"""Episodes out of the server: an ended session's episode is served
(``GET /v1/sessions/{id}/episode``: the tokens, masks and log-probs the session recorded, its
reward and messages), the newest ``keep`` are kept and the oldest evicted (memory stays
bounded), every one is appended to the ``--episodes`` file as a JSON line, and the reader in
docs/serve.md reads that file. The conversations go through the real ``openai`` client."""

# ruff: noqa: F811 -- the shared fixtures (serve_fixtures) are parameters of the tests

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from serve_fixtures import SYSTEM, client_of, policy, start_server  # noqa: F401

try:  # the HTTP client the openai package depends on (httpx2 in its recent releases)
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx


ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def served(policy, tmp_path_factory):
    out = tmp_path_factory.mktemp("episodes") / "episodes.jsonl"
    srv = start_server(policy, episodes=str(out))
    srv.state.store.keep = 2
    yield srv, out
    srv.close()


def _converse(srv, sid: str, turns: int = 2) -> list[dict]:
    client, head = client_of(srv), {"X-Session-Id": sid}
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "one two"}]
    for _ in range(turns):
        r = client.chat.completions.create(
            model="tiny", messages=messages, seed=1, max_tokens=4, extra_headers=head
        )
        messages.append(r.choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "user", "content": "two one"})
    return messages[:-1]


def test_ended_sessions_are_served_kept_under_a_bound_and_written(served, tmp_path):
    srv, out = served
    url = f"{srv.base_url}/sessions"
    sent = _converse(srv, "a")
    live = httpx.get(f"{url}/a").json()
    r = httpx.get(f"{url}/a/episode")  # still open: not an episode yet
    assert r.status_code == 409 and r.json()["error"]["code"] == "session_not_ended", r.text
    assert httpx.post(f"{url}/a/reward", json={"reward": 0.5}).status_code == 200
    ep = httpx.get(f"{url}/a/episode").json()
    for field in ("tokens", "loss_mask", "logprobs"):
        assert ep[field] == live[field], field
    assert ep["reward"] == 0.5 and ep["success"] and ep["session"] == "a"
    assert [m["content"] for m in ep["messages"]] == [m["content"] for m in sent]
    assert sum(ep["loss_mask"]) > 0 and len(ep["versions"]) == len(ep["tokens"])
    assert {v for v, m in zip(ep["versions"], ep["loss_mask"]) if m} == {0}
    # The live route now points to the episode.
    gone = httpx.get(f"{url}/a").json()["error"]
    assert gone["code"] == "session_ended" and "/episode" in gone["message"]

    # Two more: the store keeps the newest two, the first is evicted (the file keeps all).
    for sid in ("b", "c"):
        _converse(srv, sid, turns=1)
        assert httpx.post(f"{url}/{sid}/end", json={"reward": 0}).status_code == 200
    r = httpx.get(f"{url}/a/episode")
    assert r.status_code == 404 and "--episodes" in r.json()["error"]["message"]
    assert httpx.get(f"{url}/c/episode").json()["reward"] == 0.0
    stats = httpx.get(f"{srv.base_url}/stats").json()
    assert (stats["episodes"], stats["episodes_ended"], stats["episodes_evicted"]) == (2, 3, 1)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [e["session"] for e in lines] == ["a", "b", "c"]
    assert lines[0] == ep

    # The reader in docs/serve.md, run on the file.
    doc = (ROOT / "docs/serve.md").read_text()
    (code,) = re.findall(r"A reader:\n\n```python\n(.*?)```", doc, re.S)
    assert len(code.strip().splitlines()) <= 6  # a five-line reader (and a blank)
    shown = subprocess.run(
        [sys.executable, "-c", code.replace('"episodes.jsonl"', repr(str(out)))],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert shown[0] == f"a 0.5 {sum(ep['loss_mask'])} sampled tokens", shown
    assert len(shown) == 3


def test_end_takes_a_task_and_rejects_a_malformed_one(served):
    srv, _ = served
    url = f"{srv.base_url}/sessions"
    _converse(srv, "t", turns=1)
    r = httpx.post(f"{url}/t/end", json={"reward": 1, "task": {"bonus": 1}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "task", r.text
    assert "'bonus'" in r.json()["error"]["message"]
    task = {"id": "train-3", "prompt": "p", "data": {"target": 2}}
    assert httpx.post(f"{url}/t/end", json={"reward": 1, "task": task}).status_code == 200
    ep = httpx.get(f"{url}/t/episode").json()
    assert ep["task"] == {**task, "split": "serve"}


def test_serve_command_wires_the_episodes_file(monkeypatch, tmp_path, capsys):
    """``jaxagent serve CONFIG --episodes FILE --keep-episodes N`` (and
    ``harness.episodes_out`` as the default of ``--episodes``)."""
    import jaxagent.serve.server as server_mod
    from jaxagent.cli.main import main

    seen = []

    def serve(state, host, port):
        seen.append((state.store.keep, state.store.out and str(state.store.out.path)))
        state.backend.close()

    monkeypatch.setattr(server_mod, "serve", serve)
    config = str(ROOT / "configs/quickstart.yaml")
    out = tmp_path / "eps.jsonl"
    argv = ["serve", config, "--slots", "1", "model.num_layers=1"]
    assert main([*argv, "--episodes", str(out), "--keep-episodes", "5"]) == 0
    assert main([*argv, f"harness.episodes_out={tmp_path / 'h.jsonl'}"]) == 0
    assert seen == [(5, str(out)), (1024, str(tmp_path / "h.jsonl"))]
    assert f"episodes to {out}" in capsys.readouterr().err
    assert main([*argv, "--keep-episodes", "0"]) == 2
    assert "--keep-episodes 0 must be >= 1" in capsys.readouterr().err
