"""Strict tool calls on the quickstart world: how many calls of a freshly SFT'd model parse and
validate against their schemas, free and under ``rollout.constrained_tool_calls``.

    python experiments/strict_tool_calls.py [--tasks 200] [--sft-steps 800] [--seed 0]

The quickstart recipe's SFT warm start (its own config: 800 steps on the imperfect expert),
then one sample per held-out test task, free and constrained, with the same key: the share of
tool calls (turns that write ``Action :``) whose call validates against the task's tools
(strings stripped, as the world does), the share of turns that are a call or a final answer,
and held-out success. Then one RL iteration of the trainer with the constraint on: its
``mismatch/*`` metrics are the learner's first pass against the sampler's log-probs under
the recorded masks. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from jaxagent.agents.rollout import collect_episodes
from jaxagent.envs.actions import resolve_action
from jaxagent.envs.tool_spec import ActionError
from jaxagent.envs.tools.quickstart.world import TOOL_SPECS
from jaxagent.train.config import load_config
from jaxagent.train.trainer import Trainer

ROOT = Path(__file__).resolve().parent.parent


def _valid(action: str, task) -> bool:
    text = re.sub(r'" ([^"]*?) "', r'"\1"', action)
    tools = {t: TOOL_SPECS[t] for t in task.data["tools"]}
    return not isinstance(resolve_action(text, tools, "react"), ActionError)


def _rates(eps) -> dict:
    turns = [(t.action, ep.task) for ep in eps for t in ep.turns]
    calls = [(a, task) for a, task in turns if a.lstrip().startswith("Action")]
    ok = sum(_valid(a, task) for a, task in calls)
    well_formed = sum(a.lstrip().startswith(("Action", "Final")) for a, _ in turns)
    return {
        "calls": len(calls),
        "valid_calls": ok,
        "valid_call_rate": ok / max(len(calls), 1),
        "turns": len(turns),
        "call_or_answer_rate": well_formed / max(len(turns), 1),
        "success": float(np.mean([ep.success for ep in eps])),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--sft-steps", type=int, default=800)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    out = tempfile.mkdtemp(prefix="strict_")
    config = load_config(
        ROOT / "configs" / "quickstart.yaml",
        [
            "rollout.constrained_tool_calls=true",
            f"sft.steps={args.sft_steps}",
            f"train.seed={args.seed}",
            f"train.out_dir={out}",
            "train.iterations=1",
        ],
    )
    print(
        f"setup: configs/quickstart.yaml SFT {args.sft_steps} steps, seed {args.seed}, "
        f"{args.tasks} held-out tasks, one sample each"
    )
    t0 = time.perf_counter()
    trainer = Trainer(config, echo=lambda *_: None)
    params, _ = trainer.sft(trainer.take_initial_params())
    print(f"SFT done in {time.perf_counter() - t0:.0f} s")
    grammar = trainer.built.sampler.grammar
    tasks = list(trainer.built.tasks.eval)[: args.tasks]
    key = jax.random.key(args.seed + 1000)
    res = {}
    for name, g in (("free", None), ("constrained", grammar)):
        trainer.built.sampler.grammar = g
        eps, _ = collect_episodes(
            trainer.built.sampler,
            params,
            tasks,
            samples_per_task=1,
            spec=trainer.built.rollout,
            key=key,
        )
        res[name] = _rates(eps)
        r = res[name]
        print(
            f"{name:12s} calls {r['calls']:4d}  valid {r['valid_calls']:4d} "
            f"({100 * r['valid_call_rate']:.1f}%)  call-or-answer turns "
            f"{100 * r['call_or_answer_rate']:.1f}%  success {100 * r['success']:.1f}%"
        )
    trainer.built.sampler.grammar = grammar
    state = trainer.states.new(params)
    _, metrics = trainer.iteration(state, 0)
    mm = {k: float(v) for k, v in metrics.items() if k.startswith("mismatch/")}
    print("one constrained RL iteration, learner vs sampler log-probs under the masks:", mm)
    trainer.close()
    res["mismatch"] = mm
    print(json.dumps(res))


if __name__ == "__main__":
    main()
