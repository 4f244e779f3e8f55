"""The LOOP paper's comparison (Chen et al. 2025, arXiv 2502.01600, Table 1) in miniature.

    nice -n 19 python experiments/loop_ablation.py --worlds quickstart [--seeds 0 1 2]
    python experiments/loop_ablation.py --report          # tables and plots from the file

Ten variants, each a set of ``key=value`` overrides of one world's LOOP config, are trained
over seeds (one ``jaxagent train`` per cell, one cell at a time), so every variant differs
from LOOP (token) in one named respect and shares its world, SFT start, sample budget (tasks x
K per iteration), learning rate, schedule, epochs and minibatches:

    loop_token       LOOP: leave-one-out advantages, per-token PPO ratio (the world's config)
    loop_turn        per-turn importance ratio (the product of a turn's token ratios)
    loop_trajectory  per-trajectory importance ratio
    loop_std         advantages divided by the group's std (group-normalised, as GRPO)
    loop_kl          + k3 KL to the SFT policy in the loss (beta 0.04)
    rloo             REINFORCE with the leave-one-out baseline, strictly on-policy: one
                     gradient step on the whole batch an iteration (no ratio)
    grpo             the ``grpo`` recipe: group-normalised advantages, clip 0.2, KL 0.04
    ppo              the ``ppo`` recipe: a learned critic (value head), GAE, KL in the reward
    rft              rejection-sampling fine-tuning: SFT on the successful samples
    gigpo            ``grpo`` plus GiGPO's step-level (anchor-state) advantages

Every cell's record (the command that reproduces it, held-out success before and after RL,
a per-task evaluation of the final checkpoint with k samples a task, the learning curves,
wall time, machine and load) is appended to ``docs/results/loop_ablation.jsonl`` as the cell
finishes; a killed or later run on a machine with the same CPU model skips the cells in the
file and resumes a half-trained cell from its checkpoints (figures move with the CPU model, so
a world's cells from another one form a table of their own and are never paired with these). SFT is shared by the variants of a seed
(``sft.cache_dir``: the same fit, computed once). ``--report`` writes
``docs/results/loop_ablation.md`` (the Table-1 layout per world: mean ± 95% t-interval over
seeds, IQM with its stratified bootstrap interval, pass@k, gain over the SFT start; then the
paper's orderings with paired intervals), ``loop_ablation.json`` and
``loop_ablation_<table>.png`` (train success per iteration, mean ± 95% t-interval over seeds).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cells as C  # noqa: E402
import numpy as np  # noqa: E402

from jaxagent.eval import passk, stats  # noqa: E402

RESULTS = C.ROOT / "docs" / "results"


@dataclasses.dataclass(frozen=True)
class Variant:
    label: str  # the row name, as the paper's table names it
    overrides: tuple[str, ...]  # may use {batch}: the world's trajectories an iteration


VARIANTS = {
    "loop_token": Variant("LOOP (token)", ()),
    "loop_turn": Variant("LOOP (turn)", ("rl.loss.ratio_level=turn",)),
    "loop_trajectory": Variant("LOOP (trajectory)", ("rl.loss.ratio_level=trajectory",)),
    "loop_std": Variant(
        "LOOP + std normalisation",
        ("rl.advantage.estimator=group_normalized", "rl.advantage.std_mode=population"),
    ),
    "loop_kl": Variant(
        "LOOP + KL penalty",
        ("rl.kl.mode=loss", "rl.kl.estimator=k3", "rl.kl.beta=0.04"),
    ),
    "rloo": Variant(
        "RLOO (on-policy)",
        ("rl.recipe=rloo", "rl.update.num_epochs=1", "rl.update.minibatch_size={batch}"),
    ),
    "grpo": Variant("GRPO", ("rl.recipe=grpo",)),
    "ppo": Variant("PPO (learned critic)", ("rl.recipe=ppo", "model.value_head=true")),
    "rft": Variant("RFT (rejection sampling FT)", ("rl.recipe=rft",)),
    "gigpo": Variant(
        "GiGPO (GRPO + step-level)",
        ("rl.recipe=grpo", "rl.advantage.estimator=gigpo", "rl.advantage.discount=0.95"),
    ),
}


@dataclasses.dataclass(frozen=True)
class World:
    config: str  # relative to the repository root
    overrides: tuple[str, ...]  # the reduced size
    batch: int  # trajectories an iteration (tasks_per_iteration x samples_per_task)
    eval_samples: int  # k samples a held-out task in the final evaluation (pass@k)


WORLDS = {
    # configs/quickstart.yaml with 20 RL iterations instead of 60 (cosine decay over 20),
    # validation every 5 iterations: LOOP gains ~30 points within 10 iterations here.
    "quickstart": World(
        "configs/quickstart.yaml",
        ("train.iterations=20", "eval.every=5", "train.checkpoint_every=5"),
        batch=32 * 6,
        eval_samples=4,
    ),
    # configs/web_quickstart.yaml with 24 RL iterations instead of 32, and the SFT learning
    # rate its 30 committed cells were measured with (6e-3; the config now ships 3e-3), so
    # that a continued or repeated table stays one experiment.
    "web": World(
        "configs/web_quickstart.yaml",
        (
            "train.iterations=24",
            "eval.every=6",
            "train.checkpoint_every=6",
            "sft.learning_rate=0.006",
        ),
        batch=16 * 4,
        eval_samples=2,
    ),
    # configs/loop_bfcl_gen.yaml as shipped (SFT 2,000 steps, 30 LOOP iterations of 16 tasks
    # x 4 samples), validation every 10 iterations instead of 5 and one sample a held-out task
    # in the final evaluation: a cell costs about 9 minutes of RL on a 2-core CPU after the
    # seed's SFT (cached), so the evaluations are kept few.
    "bfcl_gen": World(
        "configs/loop_bfcl_gen.yaml",
        ("eval.every=10", "train.checkpoint_every=10"),
        batch=16 * 4,
        eval_samples=1,
    ),
}

# The paper's findings as orderings (better, worse): token > turn > trajectory importance
# ratios, no std normalisation better than with it, a KL penalty brings nothing, and LOOP above
# RLOO, GRPO, PPO and RFT; GiGPO's paper reports it above GRPO.
ORDERINGS = [
    ("loop_token", "loop_turn", "LOOP 2502.01600 Table 1"),
    ("loop_turn", "loop_trajectory", "LOOP 2502.01600 Table 1"),
    ("loop_token", "loop_trajectory", "LOOP 2502.01600 Table 1"),
    ("loop_token", "loop_std", "LOOP 2502.01600 Table 1"),
    ("loop_token", "loop_kl", "LOOP 2502.01600 (no benefit from KL)"),
    ("loop_token", "rloo", "LOOP 2502.01600 Table 1"),
    ("loop_token", "grpo", "LOOP 2502.01600 Table 1"),
    ("loop_token", "ppo", "LOOP 2502.01600 Table 1"),
    ("loop_token", "rft", "LOOP 2502.01600 Table 1"),
    ("gigpo", "grpo", "GiGPO 2505.10978 Tables 1-2"),
]
KEY = ("world", "variant", "seed")


def machine_kind(record: dict) -> str:
    """The CPU model a cell ran on. Learning figures move with it (its vector units change
    the order of float reductions, and RL amplifies the difference), so cells are paired,
    tabulated and counted as done only within one CPU model."""
    return record["machine"]["cpu"]


def tables(records: list[dict]) -> dict[str, tuple[str, str]]:
    """Table name -> (world, CPU model): one table a world, or one a world and CPU model
    when the world's cells come from more than one (in the order they first appear)."""
    out = {}
    for world in WORLDS:
        cpus = list(dict.fromkeys(machine_kind(r) for r in records if r["world"] == world))
        for cpu in cpus:
            out[world if len(cpus) == 1 else f"{world} on {cpu}"] = (world, cpu)
    return out


def slug(name: str) -> str:
    """A table name as a file-name part: ``bfcl_gen on Intel(R) Xeon(R) Processor`` ->
    ``bfcl_gen_intel_xeon``."""
    name = re.sub(r"\(r\)|\(tm\)|processor|\bon\b", " ", name.lower())
    return re.sub(r"[^a-z0-9]+", "_", name).strip("_")


def todo_cells(
    records: list[dict], worlds: list[str], seeds: list[int], variants: list[str], cpu: str
) -> list[tuple[str, str, int]]:
    """The cells still to run on a machine with this CPU model, seed-major (a partial file
    holds every variant of the first seeds). A cell recorded on another CPU model is not
    done here: its figures are not this machine's."""
    done = {C.cell_key(r, KEY) for r in records if machine_kind(r) == cpu}
    return [(w, v, s) for w in worlds for s in seeds for v in variants if (w, v, s) not in done]


def cell_overrides(world: World, variant: Variant, seed: int, runs: Path, name: str) -> list[str]:
    out = [o.format(batch=world.batch) for o in world.overrides + variant.overrides]
    return out + [
        f"train.seed={seed}",
        f"train.out_dir={runs}/{name}/seed{seed}",
        f"sft.cache_dir={runs}/sft_cache",
        "train.keep_checkpoints=8",  # step 0 (the SFT start) stays for the per-task evaluation
        "train.progress=none",
    ]


def run_cell(world_name: str, variant_name: str, seed: int, runs: Path) -> dict:
    world, variant = WORLDS[world_name], VARIANTS[variant_name]
    name = f"{world_name}/{variant_name}"
    overrides = cell_overrides(world, variant, seed, runs, name)
    run_dir = runs / name / f"seed{seed}"
    load_start, t0 = C.load_average(), time.time()
    log = runs / name / f"seed{seed}.log"
    summary = C.run_train(world.config, overrides, log)
    train_s = time.time() - t0
    # A cell killed after some of its iterations resumes from its last checkpoint: its time is
    # then only the rest, so the time figures leave it out.
    resumed = re.search(r"^\[resume\] from checkpoint (\d+)", log.read_text(), re.M)
    final = C.evaluate_checkpoint(run_dir, "latest", world.eval_samples)
    record = {
        "world": world_name,
        "variant": variant_name,
        "seed": seed,
        "command": " ".join(C.train_command(world.config, overrides)),
        "summary": {
            k: summary.get(k)
            for k in (
                "success_before_rl",
                "success_after_rl",
                "success_best_val",
                "best_val_iteration",
                "avg_steps",
                "wall_s",
                "env_errors_after_rl",
            )
        },
        "eval": final,
        "curves": C.curves(run_dir),
        "train_s": round(train_s, 1),
        "resumed_from": int(resumed.group(1)) if resumed else None,
        **C.provenance(load_start),
    }
    if variant_name == "loop_token":  # the SFT start, per task (shared by the LOOP variants)
        record["eval_sft"] = C.evaluate_checkpoint(run_dir, 0, world.eval_samples)
    return record


# ----------------------------------------------------------------------------- report


def _per_seed(cells: list[dict], key) -> list[float]:
    return [key(c) for c in sorted(cells, key=lambda c: c["seed"])]


def _paired(a: list[dict], b: list[dict]) -> dict:
    """Mean of per-seed differences (same seed, same SFT start) with a 95% t-interval."""
    sa, sb = {c["seed"]: c for c in a}, {c["seed"]: c for c in b}
    seeds = sorted(set(sa) & set(sb))
    diffs = [sa[s]["eval"]["success"] - sb[s]["eval"]["success"] for s in seeds]
    return C.t_interval(diffs) if diffs else {"mean": math.nan, "ci95": math.nan, "n": 0}


def summarise_world(records: list[dict], world: str) -> dict:
    out = {"variants": {}, "orderings": []}
    by_variant = {}
    for r in records:
        if r["world"] == world:
            by_variant.setdefault(r["variant"], []).append(r)
    for name in VARIANTS:
        cells = by_variant.get(name)
        if not cells:
            continue
        n, c = C.task_matrix(cells)
        scores = c / np.maximum(n, 1)
        k = int(n.min())
        row = {
            "label": VARIANTS[name].label,
            "seeds": sorted(x["seed"] for x in cells),
            "success": C.t_interval(_per_seed(cells, lambda x: x["eval"]["success"])),
            "iqm": stats.stratified_bootstrap_ci(scores, stat="iqm"),
            "pass_at_k": {
                f"pass@{j}": float(np.mean(passk.pass_at_k(n, c, j))) for j in (1, k) if j <= k
            },
            "gain": C.t_interval(
                _per_seed(
                    cells,
                    lambda x: x["summary"]["success_after_rl"] - x["summary"]["success_before_rl"],
                )
            ),
            "before_rl": C.t_interval(
                _per_seed(cells, lambda x: x["summary"]["success_before_rl"])
            ),
            "after_rl_trainer": C.t_interval(
                _per_seed(cells, lambda x: x["summary"]["success_after_rl"])
            ),
            "train_s": C.t_interval([c["train_s"] for c in cells if not c.get("resumed_from")]),
            "eval_s": C.t_interval(_per_seed(cells, lambda x: x["eval"]["seconds"])),
            "eval_samples": k,
        }
        sft = [x for x in cells if "eval_sft" in x]
        if sft:
            row["sft_success"] = C.t_interval(_per_seed(sft, lambda x: x["eval_sft"]["success"]))
        out["variants"][name] = row
    for better, worse, source in ORDERINGS:
        a, b = by_variant.get(better), by_variant.get(worse)
        if not a or not b:
            continue
        d = _paired(a, b)
        na, ca = C.task_matrix(a)
        nb, cb = C.task_matrix(b)
        common = min(na.shape[1], nb.shape[1])
        poi = stats.probability_of_improvement(
            (ca / np.maximum(na, 1))[:, :common], (cb / np.maximum(nb, 1))[:, :common]
        )
        # Both intervals must agree: over few seeds the per-seed differences can agree by
        # chance (three 1-point differences give a zero-width t-interval), while P(better >
        # worse) is computed over the tasks of every run.
        above, below = d["mean"] - d["ci95"] > 0, d["mean"] + d["ci95"] < 0
        if d["n"] < 2 or not math.isfinite(d["ci95"]):
            verdict = "too few seeds"
        elif above and poi["ci_low"] > 0.5:
            verdict = "reproduced (interval above 0)"
        elif below and poi["ci_high"] < 0.5:
            verdict = "reversed (interval below 0)"
        elif above or below:
            verdict = "same sign" if above else "opposite sign"
            verdict += ", seeds agree but P(better > worse) contains 0.5"
        else:
            verdict = "same sign" if d["mean"] > 0 else "opposite sign"
            verdict += ", interval contains 0"
        out["orderings"].append(
            {
                "better": better,
                "worse": worse,
                "source": source,
                "difference": d,
                "prob_improvement": poi,
                "verdict": verdict,
            }
        )
    return out


def summarise(records: list[dict]) -> dict:
    """Every table's summary (``summarise_world`` over the cells of one world and CPU model),
    with the world and CPU model it covers."""
    out = {}
    for name, (world, cpu) in tables(records).items():
        mine = [r for r in records if machine_kind(r) == cpu]
        out[name] = {"world": world, "cpu": cpu, **summarise_world(mine, world)}
    return out


def side_by_side(cells: list[dict]) -> str:
    """How many cells ran at once, from each record's end (``date``, to the minute) and
    training time: the runner runs one at a time, but one runner a seed may run in parallel.
    Overlaps of 2 minutes or less are the dates' rounding, not cells side by side."""
    spans = []
    for c in cells:
        end = time.mktime(time.strptime(c["date"], "%Y-%m-%d %H:%M"))
        spans.append((end - c["train_s"], end))
    most = max(sum(a <= s + 120 < b for a, b in spans) for s, _ in spans)
    return "one cell at a time" if most <= 1 else f"up to {most} cells side by side"


def markdown(summary: dict, records: list[dict]) -> str:
    lines = [
        "# The LOOP ablation family in miniature",
        "",
        "Generated by `python experiments/loop_ablation.py --report` from "
        "`docs/results/loop_ablation.jsonl` (one line a cell: variant, world, seed, with the "
        "command that reproduces it). Success is on the held-out test split, k samples a task "
        "at temperature 1, of the last checkpoint; ± is the 95% Student-t half-width over "
        "seeds; IQM is over (seed, task) success rates with rliable's stratified bootstrap "
        "interval; the gain is the trainer's held-out success after RL minus before (the SFT "
        "start), per seed. Orderings compare variants seed by seed (same SFT start): the mean "
        "difference in success with its 95% t-interval, and P(better > worse) over tasks.",
        "",
    ]
    machines = sorted({f"{r['machine']['cpu']} ({r['machine']['cores']} cores)" for r in records})
    lines.append(f"Machine(s): {'; '.join(machines)}.")
    lines.append("")
    for table, s in summary.items():
        world, cpu = s["world"], s["cpu"]
        wc = WORLDS[world]
        lines += [
            f"## {table} (`{wc.config}` + `{' '.join(wc.overrides)}`)",
            "",
            f"Machine: {cpu}; every cell of this table ran on it, and orderings pair only "
            "its cells.",
            "",
            "| method | seeds | success (± 95%) | IQM [95% CI] | pass@1 | pass@k | gain over SFT "
            "(± 95%) | train s / cell (mean) | command (all seeds) |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        mine = [r for r in records if r["world"] == world and machine_kind(r) == cpu]
        whole = [r for r in mine if "train_s" in r and not r.get("resumed_from")]
        secs = sorted(r["train_s"] for r in whole)
        loads = [r["load_start"][0] for r in whole if r.get("load_start")]
        if secs and loads:
            lines[-2:-2] = [
                f"Cells in the file: {len(mine)} of {len(VARIANTS) * 3} (ten variants x 3 "
                f"seeds); training time a cell (SFT shared): median {secs[len(secs) // 2]:.0f} s, "
                f"{secs[0]:.0f}-{secs[-1]:.0f} s, {side_by_side(whole)} at a 1-minute load "
                f"average of {min(loads):.1f}-{max(loads):.1f} at its start (other jobs on the "
                "machine); "
                f"{len(mine) - len(whole)} cell(s) resumed from a checkpoint left out of the times.",
                "",
            ]

        def command(variant: str) -> str:
            seeds = " ".join(str(x) for x in s["variants"][variant]["seeds"])
            return (
                f"`python experiments/loop_ablation.py --worlds {world} --variants {variant} "
                f"--seeds {seeds}`"
            )

        sft_rows = [(n, v) for n, v in s["variants"].items() if "sft_success" in v]
        if sft_rows:
            n, v = sft_rows[0]
            lines.append(
                f"| SFT start (before RL) | {len(v['seeds'])} | "
                f"{C.fmt_interval(v['sft_success'])} | | | | | | {command(n)} (step 0) |"
            )
        for name, v in s["variants"].items():
            iqm = v["iqm"]
            pk = v["pass_at_k"]
            kmax = max(pk, key=lambda x: int(x.split("@")[1]))
            lines.append(
                f"| {v['label']} | {len(v['seeds'])} | {C.fmt_interval(v['success'])} | "
                f"{iqm['value']:.3f} [{iqm['ci_low']:.3f}, {iqm['ci_high']:.3f}] | "
                f"{pk['pass@1']:.3f} | {kmax} {pk[kmax]:.3f} | "
                f"{C.fmt_interval(v['gain'], 100, 1, signed=True)} pts | {v['train_s']['mean']:.0f} | "
                f"{command(name)} |"
            )
        lines += [
            "",
            "| ordering (paper) | difference in success (± 95%, paired by seed) | "
            "P(better > worse) [95% CI] | verdict |",
            "|---|---|---|---|",
        ]
        for o in s["orderings"]:
            d, p = o["difference"], o["prob_improvement"]
            lines.append(
                f"| {VARIANTS[o['better']].label} > {VARIANTS[o['worse']].label} "
                f"({o['source']}) | {C.fmt_interval(d, 100, 1, signed=True)} pts | {p['value']:.2f} "
                f"[{p['ci_low']:.2f}, {p['ci_high']:.2f}] | {o['verdict']} |"
            )
        lines.append("")
        lines.append(f"Learning curves: `docs/results/loop_ablation_{slug(table)}.png`.")
        lines.append("")
    return "\n".join(lines) + "\n"


def plot_world(records: list[dict], world: str, path: Path, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [
        ("LOOP variants", ["loop_token", "loop_turn", "loop_trajectory", "loop_std", "loop_kl"]),
        ("other algorithms", ["loop_token", "rloo", "grpo", "ppo", "rft", "gigpo"]),
    ]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    for ax, (group, names) in zip(axes, groups):
        for name in names:
            cells = [r for r in records if r["world"] == world and r["variant"] == name]
            if not cells:
                continue
            its = sorted(set.intersection(*({s for s, _ in c["curves"]["train"]} for c in cells)))
            ys = np.array([[dict(c["curves"]["train"])[i] for i in its] for c in cells])
            mean = ys.mean(axis=0)
            line = ax.plot(its, mean, label=f"{VARIANTS[name].label} ({len(cells)} seeds)")[0]
            if len(cells) > 1:
                half = np.array([C.t_interval(col)["ci95"] for col in ys.T])
                # A success rate lies in [0, 1]; two seeds' t-interval (t = 12.7) does not.
                lo, hi = np.clip(mean - half, 0, 1), np.clip(mean + half, 0, 1)
                ax.fill_between(its, lo, hi, color=line.get_color(), alpha=0.15)
        ax.set_ylim(0, 1)
        ax.set_title(f"{title or world}: {group}", fontsize=9)
        ax.set_xlabel("RL iteration")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    axes[0].set_ylabel("train success, mean ± 95% t over seeds")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(results: Path) -> None:
    records = C.read_cells(results)
    summary = summarise(records)
    stem = results.with_suffix("")
    Path(f"{stem}.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    Path(f"{stem}.md").write_text(markdown(summary, records))
    plots = set()
    for name, (world, cpu) in tables(records).items():
        mine = [r for r in records if machine_kind(r) == cpu]
        path = Path(f"{stem}_{slug(name)}.png")
        plots.add(path)
        plot_world(mine, world, path, title=name)
    # A world whose cells gain a second CPU model is split into one table a CPU: its old
    # one-table plot would otherwise stay beside the new ones, out of date.
    for stale in set(stem.parent.glob(f"{stem.name}_*.png")) - plots:
        stale.unlink()
    print(Path(f"{stem}.md").read_text())


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--worlds", nargs="+", default=["quickstart"], choices=list(WORLDS))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--results", type=Path, default=RESULTS / "loop_ablation.jsonl")
    parser.add_argument("--runs", type=Path, default=C.ROOT / "runs" / "loop_ablation")
    parser.add_argument("--report", action="store_true", help="only write the tables and plots")
    args = parser.parse_args()
    if not args.report:
        records, here = C.read_cells(args.results), C.machine()
        todo = todo_cells(records, args.worlds, args.seeds, args.variants, here["cpu"])
        print(f"{len(todo)} cells to run ({len(records)} in {args.results}); machine {here}")
        for i, (w, v, s) in enumerate(todo):
            t0 = time.time()
            print(f"[{i + 1}/{len(todo)}] {w} {v} seed {s}; load {C.load_average()}", flush=True)
            record = run_cell(w, v, s, args.runs)
            C.append_cell(args.results, record)
            print(
                f"  success {record['eval']['success']:.3f} (trainer: "
                f"{record['summary']['success_before_rl']:.3f} -> "
                f"{record['summary']['success_after_rl']:.3f}) in {time.time() - t0:.0f} s",
                flush=True,
            )
    report(args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
