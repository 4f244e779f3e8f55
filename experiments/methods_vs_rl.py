"""Training-free methods around the SFT-trained LM against RL from the same start.

    nice -n 19 python experiments/methods_vs_rl.py [--seeds 0 1 2]
    python experiments/methods_vs_rl.py --report

The base policy of every method is the quickstart LM after SFT (the step-0 checkpoint of the
LOOP (token) cells of ``experiments/loop_ablation.py``; missing runs are trained with the
same command). Each method wraps that LM at test time (``jaxagent/agents/methods``):
ReAct (the LM writes its own thought), Reflexion (up to 3 attempts with a transcript
lesson), Self-Refine (signature critique and revision, up to 2 rounds), best-of-N with the
environment's checker (an oracle: pass@N) at N = 2, 4, 8 and with the claim judge (no
ground truth) at N = 4, and DFSDT (depth-first search with backtracking, 2 children, 30
environment steps). RL is the same LM after 20 LOOP iterations (the cell's last
checkpoint), alone and under best-of-4.

Every evaluation is on the 200 held-out tasks, one sample a task, with the evaluation
protocol's cost accounting (``eval.protocol.episode_tokens``: prompt, observation and
generated tokens, a method's off-trajectory tokens included) and environment steps (every
attempt's, candidate's and branch's). RL's own budget is its training: the environment
steps and generated tokens of its 20 iterations (32 tasks x 6 samples each), reported
beside the test-time cost and amortised over the 200 test tasks, so methods and RL can be
compared at equal interactions and tokens. Each (method, seed) is appended to
``docs/results/methods_vs_rl.jsonl``; ``--report`` writes ``methods_vs_rl.md`` (the table)
and ``methods_vs_rl.png`` (success against generated tokens a task).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cells as C  # noqa: E402
import loop_ablation as LA  # noqa: E402

RESULTS = C.ROOT / "docs" / "results"

# name -> (label, checkpoint: "sft" | "rl", method mapping or None)
METHODS = {
    "sft": ("SFT LM alone", "sft", None),
    "react": ("ReAct", "sft", {"method": "react", "thought": "name"}),
    "reflexion": (
        "Reflexion (3 attempts)",
        "sft",
        {"method": "reflexion", "max_attempts": 3, "memory_size": 3, "reflector": "transcript"},
    ),
    "self_refine": (
        "Self-Refine (2 rounds)",
        "sft",
        {"method": "self_refine", "max_rounds": 2, "critic": "signature"},
    ),
    "best_of_2": ("best-of-2 (env checker: oracle)", "sft", {"method": "best_of_n", "n": 2}),
    "best_of_4": ("best-of-4 (env checker: oracle)", "sft", {"method": "best_of_n", "n": 4}),
    "best_of_8": ("best-of-8 (env checker: oracle)", "sft", {"method": "best_of_n", "n": 8}),
    "best_of_4_judge": (
        "best-of-4 (claim judge)",
        "sft",
        {"method": "best_of_n", "n": 4, "verifier": "claim_judge"},
    ),
    "dfsdt": (
        "DFSDT (2 children, 30 steps)",
        "sft",
        {"method": "dfsdt", "max_children": 2, "max_env_steps": 30, "proposer": "policy"},
    ),
    "rl": ("RL (LOOP, 20 iterations)", "rl", None),
    "rl_best_of_4": ("RL + best-of-4 (oracle)", "rl", {"method": "best_of_n", "n": 4}),
}
KEY = ("method", "seed")
WORLD, VARIANT = "quickstart", "loop_token"


def rl_run(seed: int, runs: Path) -> Path:
    """The LOOP (token) quickstart cell's run directory, trained if it is missing."""
    run_dir = runs / WORLD / VARIANT / f"seed{seed}"
    if not (run_dir / "summary.json").exists():
        world, variant = LA.WORLDS[WORLD], LA.VARIANTS[VARIANT]
        over = LA.cell_overrides(world, variant, seed, runs, f"{WORLD}/{VARIANT}")
        C.run_train(world.config, over, runs / WORLD / VARIANT / f"seed{seed}.log")
    return run_dir


def training_cost(run_dir: Path) -> dict:
    """Environment steps, episodes and generated tokens of the run's RL iterations."""
    from jaxagent.train.metrics_log import read_jsonl

    steps = episodes = generated = 0.0
    for r in read_jsonl(run_dir / "metrics.jsonl"):
        if "train/episodes" in r:
            episodes += r["train/episodes"]
            steps += r["train/episodes"] * r["train/avg_steps"]
            generated += r["tokens/sampled"]
    return {"env_steps": int(steps), "episodes": int(episodes), "generated": int(generated)}


def run_method(name: str, seed: int, runs: Path) -> dict:
    label, which, method = METHODS[name]
    run_dir = rl_run(seed, runs)
    step = 0 if which == "sft" else "latest"
    t0, load = time.time(), C.load_average()
    ev = C.evaluate_checkpoint(run_dir, step, samples_per_task=1, method=method)
    record = {
        "method": name,
        "seed": seed,
        "label": label,
        "checkpoint": f"{run_dir} step {step}",
        "method_config": method,
        "eval": ev,
        "seconds": round(time.time() - t0, 1),
        "load_start": load,
        "machine": C.machine(),
        "commit": C.git_commit(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    if which == "rl":
        record["training"] = training_cost(run_dir)
    return record


def summarise(records: list[dict]) -> dict:
    out = {}
    for name, (label, which, method) in METHODS.items():
        rs = sorted((r for r in records if r["method"] == name), key=lambda r: r["seed"])
        if not rs:
            continue
        tasks = [len(r["eval"]["tasks"]) for r in rs]
        per_task = lambda f: [f(r) / n for r, n in zip(rs, tasks)]  # noqa: E731
        row = {
            "label": label,
            "seeds": [r["seed"] for r in rs],
            "success": C.t_interval([r["eval"]["success"] for r in rs]),
            "env_steps_per_task": C.t_interval(per_task(lambda r: r["eval"]["env_steps"])),
            "generated_per_task": C.t_interval(
                per_task(lambda r: r["eval"]["tokens"]["generated"])
            ),
            "input_per_task": C.t_interval(
                per_task(
                    lambda r: r["eval"]["tokens"]["prompt"] + r["eval"]["tokens"]["observation"]
                )
            ),
            "method": method,
        }
        if which == "rl":
            row["training"] = {
                k: C.t_interval([r["training"][k] for r in rs])
                for k in ("env_steps", "episodes", "generated")
            }
            n_tasks = tasks[0]
            row["amortised_generated_per_task"] = C.t_interval(
                [
                    (r["training"]["generated"] + r["eval"]["tokens"]["generated"]) / n_tasks
                    for r in rs
                ]
            )
            row["amortised_env_steps_per_task"] = C.t_interval(
                [(r["training"]["env_steps"] + r["eval"]["env_steps"]) / n_tasks for r in rs]
            )
        out[name] = row
    return out


def markdown(summary: dict, records: list[dict]) -> str:
    machines = sorted({f"{r['machine']['cpu']} ({r['machine']['cores']} cores)" for r in records})
    lines = [
        "# Training-free methods against RL (quickstart world)",
        "",
        "Generated by `python experiments/methods_vs_rl.py --report` from "
        "`docs/results/methods_vs_rl.jsonl`. Base policy: the quickstart LM after SFT (the "
        "step-0 checkpoint of `experiments/loop_ablation.py`'s LOOP (token) cells, one per "
        "seed); RL: the same LM after 20 LOOP iterations. 200 held-out tasks, one sample a "
        "task at temperature 1; ± is the 95% Student-t half-width over seeds. Tokens and "
        "environment steps are per test task, a method's extra attempts, candidates, "
        "critiques and search branches included (`jaxagent/eval/protocol.py`). RL's training "
        "budget (its 20 iterations' environment steps and generated tokens) is added to its "
        "test-time cost in the amortised columns (spread over the 200 test tasks).",
        "",
        f"Machine(s): {'; '.join(machines)}.",
        "",
        "| method | seeds | held-out success | env steps / task | generated tokens / task | "
        "input tokens / task | amortised with training: env steps / task, generated / task |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in summary.items():
        amort = ""
        if "training" in r:
            amort = (
                f"{C.fmt_interval(r['amortised_env_steps_per_task'], digits=0)}, "
                f"{C.fmt_interval(r['amortised_generated_per_task'], digits=0)} (training: "
                f"{r['training']['env_steps']['mean']:.0f} steps, "
                f"{r['training']['generated']['mean']:.0f} tokens)"
            )
        lines.append(
            f"| {r['label']} | {len(r['seeds'])} | {C.fmt_interval(r['success'])} | "
            f"{C.fmt_interval(r['env_steps_per_task'], digits=1)} | "
            f"{C.fmt_interval(r['generated_per_task'], digits=0)} | "
            f"{C.fmt_interval(r['input_per_task'], digits=0)} | {amort} |"
        )
    lines += ["", "Plot: `docs/results/methods_vs_rl.png`.", ""]
    return "\n".join(lines) + "\n"


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for name, r in summary.items():
        x, y = r["generated_per_task"]["mean"], r["success"]["mean"]
        yerr = r["success"]["ci95"] if math.isfinite(r["success"]["ci95"]) else 0.0
        marker = "s" if name.startswith("rl") else "o"
        pts = ax.errorbar([x], [y], yerr=[yerr], fmt=marker, capsize=3, label=r["label"])
        if "amortised_generated_per_task" in r:
            xa = r["amortised_generated_per_task"]["mean"]
            ax.errorbar(
                [xa], [y], yerr=[yerr], fmt=marker, mfc="none", capsize=3,
                color=pts[0].get_color(), label=f"{r['label']}, training tokens amortised",
            )  # fmt: skip
            ax.annotate("", (xa, y), (x, y), arrowprops={"arrowstyle": "->", "alpha": 0.4})
    ax.set_xscale("log")
    ax.set_xlabel("generated tokens per held-out task (log)")
    ax.set_ylabel("held-out success (mean ± 95% t over seeds)")
    ax.set_title("quickstart: training-free methods around the SFT LM vs RL")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(results: Path) -> None:
    records = C.read_cells(results)
    summary = summarise(records)
    stem = results.with_suffix("")
    Path(f"{stem}.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    Path(f"{stem}.md").write_text(markdown(summary, records))
    plot(summary, Path(f"{stem}.png"))
    print(Path(f"{stem}.md").read_text())


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--results", type=Path, default=RESULTS / "methods_vs_rl.jsonl")
    parser.add_argument("--runs", type=Path, default=C.ROOT / "runs" / "loop_ablation")
    parser.add_argument("--report", action="store_true")
    args = parser.parse_args()
    if not args.report:
        done = {C.cell_key(r, KEY) for r in C.read_cells(args.results)}
        todo = [(m, s) for s in args.seeds for m in args.methods if (m, s) not in done]
        print(f"{len(todo)} evaluations to run ({len(done)} in {args.results})")
        for i, (m, s) in enumerate(todo):
            print(f"[{i + 1}/{len(todo)}] {m} seed {s}; load {C.load_average()}", flush=True)
            record = run_method(m, s, args.runs)
            C.append_cell(args.results, record)
            ev = record["eval"]
            print(
                f"  success {ev['success']:.3f}, {ev['env_steps']} env steps, "
                f"{ev['tokens']['generated']} generated tokens, {record['seconds']:.0f} s",
                flush=True,
            )
    report(args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
