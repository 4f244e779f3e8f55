"""The policy server under concurrent conversations, against the built-in driver on the same work.

``--conversations`` harnesses (the ``openai`` client's ``AsyncOpenAI``, one session each) talk
to ``jaxagent serve``'s app on localhost at once, ``--turns`` turns each: the quickstart world's
first observation as the user message, then a fixed user message ("ok") after every answer,
sampling at the config's temperature (no seed: one admit call a round), ``max_tokens`` = ``rollout.max_new_tokens``. The
built-in driver (``collect_episodes`` with the rollout engine, ``--slots`` slots) then runs the
same conversations (the same prompts, turns and budget through an environment that answers
"ok" for ``--turns`` turns). Both are timed after a warm-up pass of the same work (compiles).

Reported: requests/s, completion tokens/s, p50 / p95 request latency, the KV reuse rate (the
share of context tokens already in the cache: ``session_kv_reuse_rate`` counts only a
session's own earlier turns in the slot it kept; ``kv_reuse_rate`` also prompts shared with an
ended conversation whose slot was reused), mean decode batch and evictions, the
driver's tokens/s and the ratio server / driver (the HTTP path's cost). The last line is one
JSON object.

    python benchmarks/serve.py [--checkpoint RUN_DIR] [--conversations 64] [--turns 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import jax
import numpy as np

from jaxagent.agents.engine import SlotEngine
from jaxagent.agents.rollout import Budget, RolloutSpec, collect_episodes
from jaxagent.agents.runner import InlineRunner
from jaxagent.envs.base import StepResult
from jaxagent.serve.server import ServerThread, state_for_run
from jaxagent.train.config import load_config
from jaxagent.train.run import build_run

ROOT = os.path.join(os.path.dirname(__file__), "..")
REPLY = "ok"


class FixedTurns:
    """The quickstart world's first observation, then ``REPLY`` for ``turns`` turns."""

    def __init__(self, make_env, turns: int):
        self.env, self.turns, self.t = make_env(), turns, 0

    def reset(self, task):
        self.t = 0
        return self.env.reset(task)

    def step(self, action):
        self.t += 1
        return StepResult(REPLY, reward=0.0, done=self.t >= self.turns, info={})

    def close(self):
        self.env.close()


async def _conversation(client, model, system, first, turns, max_tokens, sid, lat):
    messages = [{"role": "system", "content": system}, {"role": "user", "content": first}]
    tokens = 0
    for _ in range(turns):
        t0 = time.perf_counter()
        r = await client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=max_tokens,
            extra_headers={"X-Session-Id": sid},
        )
        lat.append(time.perf_counter() - t0)
        tokens += r.usage.completion_tokens
        messages.append(r.choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "user", "content": REPLY})
    # The conversation ends: its session becomes an episode and frees its slot.
    await client.post(f"/sessions/{sid}/reward", body={"reward": 0.0}, cast_to=object)
    return tokens


async def _harnesses(url, model, system, firsts, turns, max_tokens, tag):
    import openai

    client = openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)
    lat: list[float] = []
    t0 = time.perf_counter()
    counts = await asyncio.gather(
        *[
            _conversation(client, model, system, f, turns, max_tokens, f"{tag}-{i}", lat)
            for i, f in enumerate(firsts)
        ]
    )
    wall = time.perf_counter() - t0
    await client.close()
    return sum(counts), wall, lat


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=os.path.join(ROOT, "configs/quickstart.yaml"))
    p.add_argument("--checkpoint", default=None, help="a run directory (default: untrained)")
    p.add_argument("--conversations", type=int, default=64)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--slots", type=int, default=0, help="KV slots (0: one per conversation)")
    p.add_argument("--decode-steps", type=int, default=8)
    args = p.parse_args()

    config = load_config(args.config)
    policy = None
    if args.checkpoint:
        from jaxagent.train.session import load_policy

        policy = load_policy(args.checkpoint)
    run = build_run(config, policy=policy)
    run.close()
    r = config.rollout
    sampling = run.sampler.sampling  # the rollout's own settings (the server samples the same)
    slots = args.slots or args.conversations
    tasks = list(run.env.make_source().tasks(config.env.eval_split))[: args.conversations]
    env = run.env.make_env()
    firsts = [env.reset(t) for t in tasks]
    state = state_for_run(run, model_id="policy", slots=slots, decode_steps=args.decode_steps)
    server = ServerThread(state)
    state.backend.wait_ready()
    n, system = r.max_new_tokens, run.env.system_prompt
    try:
        go = lambda tag: asyncio.run(
            _harnesses(server.base_url, "policy", system, firsts, args.turns, n, tag)
        )
        compiled = lambda: sum(d.num_compiles for d in state.backend._devs.values())
        for i in range(4):  # warm-up passes until one compiles nothing new
            compiles = compiled()
            go(f"warm{i}")
            if compiled() == compiles:
                break
        compiles = compiled()
        before = state.backend.stats.as_dict()
        tokens, wall, lat = go("timed")
        after = state.backend.stats.as_dict()
        compiles = compiled() - compiles
    finally:
        server.close()
    keys = ("prompt_tokens", "reused_tokens", "session_reused_tokens", "evictions", "device_s")
    delta = {k: after[k] - before[k] for k in keys}
    delta["decode_rows"] = after["decode_rows"] - before["decode_rows"]
    delta["decode_calls"] = after["decode_calls"] - before["decode_calls"]

    budget = Budget(
        max_turns=args.turns, max_new_tokens=n, max_total_tokens=run.budget.max_total_tokens
    )
    spec = RolloutSpec(
        run.chat, system, budget, InlineRunner(lambda: FixedTurns(run.env.make_env, args.turns))
    )
    engine = SlotEngine(
        run.graphdef,
        sampling,
        run.max_len,
        run.chat.pad_id,
        slots=slots,
        decode_steps=args.decode_steps,
    )
    key = jax.random.key(0)
    best = None
    for _ in range(2):  # warm-up, then timed
        t0 = time.perf_counter()
        eps, _ = collect_episodes(engine, run.params, tasks, samples_per_task=1, spec=spec, key=key)
        best = (sum(ep.num_policy_tokens for ep in eps), time.perf_counter() - t0, eps)
    d_tokens, d_wall, eps = best
    requests = args.conversations * args.turns
    out = {
        "benchmark": "serve",
        "conversations": args.conversations,
        "turns": args.turns,
        "slots": slots,
        "checkpoint": args.checkpoint,
        "requests_per_s": requests / wall,
        "tokens_per_s": tokens / wall,
        "p50_latency_s": float(np.percentile(lat, 50)),
        "p95_latency_s": float(np.percentile(lat, 95)),
        "kv_reuse_rate": delta["reused_tokens"] / max(delta["prompt_tokens"], 1),
        "session_kv_reuse_rate": delta["session_reused_tokens"] / max(delta["prompt_tokens"], 1),
        "mean_decode_batch": delta["decode_rows"] / max(delta["decode_calls"], 1),
        "evictions": delta["evictions"],
        "timed_compiles": compiles,
        "server_wall_s": wall,
        "server_device_s": delta["device_s"],
        "driver_tokens_per_s": d_tokens / d_wall,
        "driver_turns": sum(len(ep.turns) for ep in eps),
        "server_over_driver": (tokens / wall) / (d_tokens / d_wall),
        "server_tokens": tokens,
        "driver_tokens": d_tokens,
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, {jax.default_backend()}",
    }
    print(
        f"server: {out['requests_per_s']:.1f} req/s, {out['tokens_per_s']:.0f} tok/s, "
        f"p50 {out['p50_latency_s']:.3f} s, p95 {out['p95_latency_s']:.3f} s, KV reuse "
        f"{out['kv_reuse_rate']:.2f}, mean decode batch {out['mean_decode_batch']:.1f}; "
        f"driver: {out['driver_tokens_per_s']:.0f} tok/s; server/driver "
        f"{out['server_over_driver']:.2f}"
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
