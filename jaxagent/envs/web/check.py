"""The embedded sites' health check (``python -m jaxagent.envs.web --check shop``)."""

from __future__ import annotations

import collections

import numpy as np

from jaxagent.envs.web.env import WebEnv, WebEnvConfig
from jaxagent.envs.web.expert import ExpertPolicy, random_action, run_episode
from jaxagent.envs.web.site import Site
from jaxagent.envs.web.layout import Layout
from jaxagent.envs.web.tasks import WebWorld


def target_off_viewport(task, viewport: int) -> bool:
    """Whether the target's row is outside the first view at reset (or not on the page)."""
    data = task.data
    site = Site(data["site"], Layout.from_json(data["layout"]), data["catalog"]["items"])
    from jaxagent.envs.web.site import initial_state

    elements = site.page(initial_state(site.layout))
    target = data["catalog"]["target"]
    index = next((k for k, e in enumerate(elements) if e.target == ("item", target)), None)
    return index is None or index >= viewport


def check_embedded(site: str, num_tasks: int, config: WebEnvConfig | None = None) -> dict:
    config = config or WebEnvConfig()
    world = WebWorld(site, num_train=0, num_test=num_tasks)
    world.check_disjoint()
    tasks = world.tasks("test")
    env, rng = WebEnv(config), np.random.default_rng(0)
    policies = {
        "expert": lambda t: ExpertPolicy(t).act,
        "random": lambda t: lambda obs: random_action(obs, rng),
        "no_scroll": lambda t: ExpertPolicy(t, scroll=False).act,
    }
    success, per_layout, errors = {}, collections.defaultdict(list), []
    modes: dict = {}
    for name, make in policies.items():
        wins, counts = [], collections.Counter()
        for task in tasks:
            try:
                info = run_episode(env, task, make(task))[2].info
            except Exception as exc:  # a bug in the site: reported, never hidden
                errors.append(f"{task.id}: {type(exc).__name__}: {exc}")
                continue
            wins.append(bool(info["success"]))
            counts[info.get("failure_detail") or info["failure_mode"] or "success"] += 1
            if name == "expert":
                per_layout[task.data["layout_id"]].append(bool(info["success"]))
        success[name] = float(np.mean(wins)) if wins else 0.0
        modes[name] = dict(counts)
    off = float(np.mean([target_off_viewport(t, config.viewport) for t in tasks]))
    print(f"{site}: {len(tasks)} test tasks on {len(per_layout)} held-out layouts")
    for name, rate in success.items():
        print(f"  {name:10s} success {rate:.3f}  {modes[name]}")
    print(f"  target off-viewport at reset: {off:.3f} (no-scroll bound {1 - off:.3f})")
    return {
        "suite": site,
        "episodes": len(tasks),
        "expert_success": success["expert"],
        "per_task": {k: float(np.mean(v)) for k, v in sorted(per_layout.items())},
        "errors": errors,
        "random_success": success["random"],
        "no_scroll_success": success["no_scroll"],
        "off_viewport_fraction": off,
        "failure_modes": modes,
    }
