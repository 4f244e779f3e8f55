"""The web suites' own figures in ``jaxagent check shop|booking|miniwob``.

Embedded sites: the no-scroll expert and the fraction of tasks whose target starts outside
the first view (the bound a policy that never scrolls meets), and each policy's failure
modes. MiniWoB++: one browser's step latency (action + DOM read-back, the cost a policy pays
per turn), measured inline so the pool's queueing is not in it.
"""

from __future__ import annotations

import collections
import os
import time

import numpy as np

from jaxagent.envs.web.env import WebEnv, WebEnvConfig
from jaxagent.envs.base import run_episode
from jaxagent.envs.web.expert import ExpertPolicy
from jaxagent.envs.web.layout import Layout
from jaxagent.envs.web.site import Site, initial_state


def target_off_viewport(task, viewport: int) -> bool:
    """Whether the target's row is outside the first view at reset (or not on the page)."""
    data = task.data
    site = Site(data["site"], Layout.from_json(data["layout"]), data["catalog"]["items"])
    elements = site.page(initial_state(site.layout))
    target = data["catalog"]["target"]
    index = next((k for k, e in enumerate(elements) if e.target == ("item", target)), None)
    return index is None or index >= viewport


def embedded_extras(config: WebEnvConfig, tasks, runs) -> dict:
    """No-scroll expert success, off-viewport fraction and failure modes per policy."""
    env = WebEnv(config)
    no_scroll = [
        bool(run_episode(env, t, ExpertPolicy(t, scroll=False).act)[2].info["success"])
        for t in tasks
    ]
    off = float(np.mean([target_off_viewport(t, config.viewport) for t in tasks]))
    modes = {}
    for name, run in runs.items():
        counts = collections.Counter(
            e.final.info.get("failure_detail") or e.final.info.get("failure_mode") or "success"
            for e in run.episodes
        )
        modes[name] = dict(counts)
    return {
        "no_scroll_success": float(np.mean(no_scroll)),
        "off_viewport_fraction": off,
        "failure_modes": modes,
    }


def miniwob_extras(config, tasks, runs) -> dict:
    """Step latency p50/p95 of one browser (inline) over up to 10 of the checked tasks."""
    from jaxagent.envs.web.miniwob import MiniWoBEnv
    from jaxagent.envs.web.miniwob_solvers import MiniWoBSolver

    del runs
    env, latencies = MiniWoBEnv(config), []
    try:
        for task in list(tasks)[:10]:
            solver = MiniWoBSolver(task)
            obs, done = env.reset(task), False
            while not done:
                action = solver.act(obs)
                t0 = time.perf_counter()
                r = env.step(action)
                latencies.append(time.perf_counter() - t0)
                obs, done = r.observation, r.done
    finally:
        env.close()
    return {
        "step_latency_p50_ms": round(1e3 * float(np.percentile(latencies, 50)), 1),
        "step_latency_p95_ms": round(1e3 * float(np.percentile(latencies, 95)), 1),
        "load_average": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }
