"""Choose the dialogue DQN recipe on validation goals, then report held-out once.

    nice -n 10 python experiments/dqn_select.py --seeds 0 1 2 3 4 5 6 7 8 9
    nice -n 10 python experiments/dqn_select.py --heldout --seeds 0 1 2 3 4 5 6 7 8 9

The recipes in ``docs/results/dqn_dialogue.md`` were compared on the held-out goals, the
split that also reports the claim. Here the same candidates are trained (the shipped
learner, ``jaxagent.learners.dqn_dialogue.train.train_seed``, unchanged) on the training
goals of 75% of the training routes and compared on goals of the other 25% (validation: routes
no training goal uses, the training simulator; nothing of the test split is read). The
candidate with the best validation mean is then trained on the whole training split and
evaluated on the held-out goals (``--heldout``): the figure a user reproduces with
``jaxagent train configs/dqn_dialogue.yaml`` plus that candidate's overrides.

Each (stage, candidate, seed) is one line of ``docs/results/dqn_select.jsonl``, appended as
it finishes (command, commit, machine, load, figures); a re-run skips the lines already there.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cells as C  # noqa: E402

RESULTS = C.ROOT / "docs" / "results" / "dqn_select.jsonl"
CONFIG = "configs/dqn_dialogue.yaml"
PREVIOUS = [
    "train.total_steps=60000",
    "train.updates_per_step=1",
    "dqn.learning_rate=0.001",
    "dqn.target_every=250",
    "dqn.eps_decay_steps=15000",
]
# The three rows of docs/results/dqn_dialogue.md, as overrides of the shipped config.
CANDIDATES = {
    "shipped": [],
    "previous": PREVIOUS,
    "previous_4upd_target1000": [
        *PREVIOUS[:1],
        "dqn.learning_rate=0.001",
        "dqn.eps_decay_steps=15000",
        "train.updates_per_step=4",
        "dqn.target_every=1000",
    ],
}
VAL_ROUTE_FRAC = 0.25
VAL_GOALS = 200  # as many as the held-out split


class _Source:
    def __init__(self, splits: dict):
        self._splits = splits

    def splits(self):
        return tuple(self._splits)

    def tasks(self, split: str):
        return list(self._splits[split])


class _SplitSpec:
    """The dialogue spec with another task source ("train" and "test" as given)."""

    def __init__(self, spec, splits: dict):
        self._spec, self._splits = spec, splits

    def make_env(self):
        return self._spec.make_env()

    def make_source(self):
        return _Source(self._splits)


def validation_split(train_tasks) -> tuple[list, list]:
    """(train', val): the training goals of 75% of the training routes, and up to VAL_GOALS
    goals of the other routes (fixed seed, independent of the training seed)."""
    import numpy as np

    def route(t):
        return (t.data["goal"]["origin"], t.data["goal"]["destination"])

    routes = sorted({route(t) for t in train_tasks})
    rng = np.random.default_rng([0, 7])
    k = max(1, int(round(VAL_ROUTE_FRAC * len(routes))))
    held = {routes[i] for i in rng.choice(len(routes), size=k, replace=False)}
    fit = [t for t in train_tasks if route(t) not in held]
    val = [t for t in train_tasks if route(t) in held][:VAL_GOALS]
    return fit, val


def run_cell(stage: str, name: str, seed: int) -> dict:
    from jaxagent.envs.dialogue import policies as P
    from jaxagent.envs.registry import get_env_spec
    from jaxagent.learners.dqn_dialogue.train import evaluate, load_dqn_config, train_seed

    overrides = [*CANDIDATES[name], f"train.seed={seed}", "train.num_seeds=1", "train.plot=false"]
    config = load_dqn_config(C.ROOT / CONFIG, overrides)
    base = get_env_spec("dialogue", dict(config.env.options))
    source = base.make_source()
    train_tasks = source.tasks("train")
    if stage == "val":
        fit, val = validation_split(train_tasks)
        spec = _SplitSpec(base, {"train": fit, "test": val})
        eval_tasks, split = val, "validation (25% of training routes, training simulator)"
    else:
        spec, eval_tasks, split = base, source.tasks("test"), "held-out (test split)"
        fit = train_tasks
    max_turns = base.make_env().config.max_turns

    def policy(choose):
        return lambda trackers, feats: __import__("numpy").array([choose(t) for t in trackers])

    rule_return, rule_success = evaluate(spec, eval_tasks, policy(P.rule_policy), max_turns)
    load, t0 = C.load_average(), time.time()
    ret, succ, curve = train_seed(config, seed, spec, rule_return, echo=lambda *_: None)
    return {
        "stage": stage,
        "candidate": name,
        "seed": seed,
        "overrides": CANDIDATES[name],
        "command": f"python experiments/dqn_select.py {'--heldout ' if stage == 'heldout' else ''}"
        f"--candidates {name} --seeds {seed}",
        "eval_split": split,
        "train_goals": len(fit),
        "eval_goals": len(eval_tasks),
        "dqn_return": ret,
        "dqn_success": succ,
        "rule_return": rule_return,
        "rule_success": rule_success,
        "curve": curve,
        "wall_s": round(time.time() - t0, 1),
        **C.provenance(load),
    }


def selected(records: list[dict]) -> str | None:
    """The candidate with the best mean validation return (every candidate over the same
    seeds), or None while the validation cells are incomplete."""
    val = [r for r in records if r["stage"] == "val"]
    seeds = {n: {r["seed"] for r in val if r["candidate"] == n} for n in CANDIDATES}
    common = set.intersection(*seeds.values())
    if not common:
        return None
    means = {
        n: sum(r["dqn_return"] for r in val if r["candidate"] == n and r["seed"] in common)
        / len(common)
        for n in CANDIDATES
    }
    return max(means, key=means.get)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    p.add_argument("--candidates", nargs="+", default=list(CANDIDATES), choices=list(CANDIDATES))
    p.add_argument("--heldout", action="store_true", help="held-out cells of the selection")
    args = p.parse_args(argv)
    records = C.read_cells(RESULTS)
    stage = "heldout" if args.heldout else "val"
    names = args.candidates
    if args.heldout:
        pick = selected(records)
        if pick is None:
            print("no complete validation comparison in", RESULTS, file=sys.stderr)
            return 2
        names = [pick]
    done = {C.cell_key(r, ("stage", "candidate", "seed")) for r in records}
    for seed in args.seeds:  # seed-major: every candidate has the same seeds when stopped
        for name in names:
            if (stage, name, seed) in done:
                continue
            rec = run_cell(stage, name, seed)
            C.append_cell(RESULTS, rec)
            print(f"{stage} {name} seed {seed}: {rec['dqn_return']:.3f} "
                  f"(rule {rec['rule_return']:.3f}) {rec['wall_s']} s", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
