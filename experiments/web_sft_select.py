"""Choose the web recipe's SFT learning rate on validation starts, then report held-out once.

    python experiments/web_sft_select.py --report
    nice -n 10 python experiments/web_sft_select.py --seeds 0 1 2     # more cells

``configs/web_quickstart.yaml``'s ``sft.learning_rate`` (3e-3, was 6e-3) was chosen from the
SFT starts' held-out success (``docs/results/web.md``). Here the choice is made on the
config's validation tasks (``eval.val_tasks``: 50 tasks of the train layouts that SFT and RL
never see; SFT draws the same demonstrations with or without them): the learning rate with
the best mean validation start over the seeds every rate has is selected.

A start's validation success is in every committed run that evaluated validation at
iteration 0 with this config's SFT: the LOOP ablation's web cells (6e-3, pinned;
``loop_ablation.jsonl``, variant ``loop_token``), the shipped recipe's seeds
(3e-3; ``configs.jsonl``) and this runner's own SFT-only cells (``jaxagent train
configs/web_quickstart.yaml train.iterations=0 eval.every=0 eval.val_tasks=50 train.seed=S
sft.learning_rate=LR``, one line of ``web_sft_select.jsonl`` each, appended as it finishes).
The same seed gives the same validation tasks and the same demonstrations in all three. The
runs also tested their starts on the held-out split; the selection does not read it, and the
report gives it for the selected rate only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cells as C  # noqa: E402

RESULTS = C.ROOT / "docs" / "results" / "web_sft_select.jsonl"
CONFIG = "configs/web_quickstart.yaml"
CANDIDATES = (0.006, 0.003)
FIXED = ["train.iterations=0", "eval.every=0", "eval.val_tasks=50"]


def run_cell(lr: float, seed: int, runs: Path) -> dict:
    run_dir = runs / f"lr{lr}" / f"seed{seed}"
    overrides = [*FIXED, f"train.seed={seed}", f"sft.learning_rate={lr}"]
    load = C.load_average()
    if not (run_dir / "summary.json").exists():  # a finished run (its runner stopped) is kept
        C.run_train(
            CONFIG,
            [*overrides, f"train.out_dir={run_dir}", "train.progress=none"],
            run_dir.with_suffix(".log"),
        )
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "learning_rate": lr,
        "seed": seed,
        "command": " ".join(C.train_command(CONFIG, overrides)),
        "val_success": summary["val_curve"][0][1],
        "heldout_success": summary["success_before_rl"],
        "eval_episodes": summary["eval_episodes"],
        "summary": summary,
        "wall_s": summary["wall_s"],  # the training run's own (SFT and the evaluations)
        **C.provenance(load),
    }


def starts() -> list[dict]:
    """Every committed validation start: ``{lr, seed, val, heldout, commit, source}``."""
    out = []
    for r in C.read_cells(C.ROOT / "docs" / "results" / "loop_ablation.jsonl"):
        if r["world"] == "web" and r["variant"] == "loop_token" and r["curves"]["val"]:
            out.append(dict(lr=0.006, seed=r["seed"], val=r["curves"]["val"][0][1],
                            heldout=r["curves"]["test"][0][1], commit=r["commit"],
                            source="loop_ablation.jsonl"))  # fmt: skip
    for r in C.read_cells(C.ROOT / "docs" / "results" / "configs.jsonl"):
        if r["config"] == "web_quickstart" and r["curves"]["val"]:
            out.append(dict(lr=0.003, seed=r["seed"], val=r["curves"]["val"][0][1],
                            heldout=r["summary"]["success_before_rl"], commit=r["commit"],
                            source="configs.jsonl"))  # fmt: skip
    for r in C.read_cells(RESULTS):
        out.append(dict(lr=r["learning_rate"], seed=r["seed"], val=r["val_success"],
                        heldout=r["heldout_success"], commit=r["commit"],
                        source="web_sft_select.jsonl"))  # fmt: skip
    return out


def common_seeds(cells: list[dict]) -> list[int]:
    return sorted(
        set.intersection(*({c["seed"] for c in cells if c["lr"] == lr} for lr in CANDIDATES))
    )


def by_rate(cells: list[dict], seeds: list[int]) -> dict[float, list[dict]]:
    """Per rate, one start a seed (the newest commit's when a seed was measured twice)."""
    out = {}
    for lr in CANDIDATES:
        last = {c["seed"]: c for c in cells if c["lr"] == lr}  # later sources win
        out[lr] = [last[s] for s in seeds]
    return out


def selected(cells: list[dict]) -> float | None:
    """The rate with the best mean validation start over the seeds every rate has."""
    seeds = common_seeds(cells)
    if not seeds:
        return None
    rates = by_rate(cells, seeds)
    return max(CANDIDATES, key=lambda lr: sum(c["val"] for c in rates[lr]) / len(seeds))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--lrs", type=float, nargs="+", default=list(CANDIDATES))
    p.add_argument("--runs", type=Path, default=Path("runs/web_sft_select"))
    p.add_argument("--report", action="store_true", help="print the selection; run nothing")
    args = p.parse_args(argv)
    if args.report:
        cells = starts()
        print(json.dumps({"selected": selected(cells), "seeds": common_seeds(cells)}))
        return 0
    for seed in args.seeds:
        for lr in args.lrs:
            # re-read before each cell: runners on other seeds or rates may share the file
            done = {C.cell_key(r, ("learning_rate", "seed")) for r in C.read_cells(RESULTS)}
            if (lr, seed) in done:
                continue
            rec = run_cell(lr, seed, args.runs)
            C.append_cell(RESULTS, rec)
            print(
                f"lr {lr} seed {seed}: val {rec['val_success']:.2f} {rec['wall_s']} s", flush=True
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
