"""Training-free methods against RL on the quickstart world, from one script.

    nice -n 5 python experiments/methods_vs_rl.py --sft-run RUN_A --rl-run RUN_B
    python experiments/methods_vs_rl.py --report-only      # table and plot from the evals kept

Every arm is one ``jaxagent eval configs/quickstart.yaml ... --seeds 1 --out DIR/ARM`` on the
held-out test tasks (200 by default, one sample a task: the trainer's own evaluation key), so
each figure comes from that arm's ``eval.json``: success with its 95% bootstrap interval over
tasks, average environment steps, tokens per episode (prompt + observation + generated, a
method's extra attempts, critiques, candidates and branches included) and cost per episode at
the nominal prices below. Arms:

* the quickstart LM after SFT (``--sft-run`` at step 0, before RL), alone and wrapped in each
  training-free method of ``configs/methods/`` (ReAct, Reflexion, Self-Refine, best-of-N with
  the environment's checker, DFSDT);
* RL: the LM after LOOP iterations (``--rl-run`` at ``--rl-step``, the final checkpoint by
  default), and ``--sft-run``'s own last RL checkpoint when it has one (same SFT start);
* the control where methods are known to help: the scripted look-alike and wrong-argument
  policies (``--policy lookalike|argname``), alone and with Reflexion / Self-Refine.

An arm whose ``DIR/ARM/eval.json`` exists is not rerun (``--force`` reruns); a failing arm is
recorded with its exit status and last error line. The script writes
``docs/results/methods_vs_rl.{md,json,png}`` and ends with one JSON line summarising the arms.
The reading paragraph under "## Reading" of an existing page is kept across reruns.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cells as C  # noqa: E402

ROOT = C.ROOT
RESULTS = ROOT / "docs" / "results"
CONFIG = "configs/quickstart.yaml"
# Nominal prices (USD per million tokens) to turn tokens into a cost column; the model is a
# toy, so only the ratios between arms mean anything.
PRICE_IN, PRICE_OUT = 0.15, 0.60

# name -> (label, source, method yaml or None, group)
# source: "sft" (--sft-run step 0), "rl" (--rl-run at --rl-step), "rl_same" (--sft-run's last
# checkpoint), or a scripted policy name.
ARMS = {
    "sft": ("SFT LM (before RL)", "sft", None, "lm"),
    "sft+react": ("SFT + ReAct", "sft", "react", "lm"),
    "sft+reflexion": ("SFT + Reflexion (3 attempts)", "sft", "reflexion", "lm"),
    "sft+self_refine": ("SFT + Self-Refine (2 rounds)", "sft", "self_refine", "lm"),
    "sft+best_of_n": ("SFT + best-of-4 (env checker)", "sft", "best_of_n", "lm"),
    "sft+dfsdt": ("SFT + DFSDT (2 children, 30 steps)", "sft", "dfsdt", "lm"),
    "rl": ("RL (LOOP, final checkpoint)", "rl", None, "rl"),
    "rl_same": ("RL (LOOP, same SFT start)", "rl_same", None, "rl"),
    "lookalike": ("scripted look-alike", "lookalike", None, "scripted"),
    "lookalike+reflexion": ("look-alike + Reflexion", "lookalike", "reflexion", "scripted"),
    "lookalike+self_refine": ("look-alike + Self-Refine", "lookalike", "self_refine", "scripted"),
    "argname": ("scripted wrong-argument", "argname", None, "scripted"),
    "argname+reflexion": ("wrong-argument + Reflexion", "argname", "reflexion", "scripted"),
    "argname+self_refine": ("wrong-argument + Self-Refine", "argname", "self_refine", "scripted"),
}
# Cheap arms first, DFSDT (a search over the LM's proposals) last.
ORDER = [
    "sft",
    "rl",
    "rl_same",
    "lookalike",
    "argname",
    "sft+react",
    "sft+self_refine",
    "sft+reflexion",
    "sft+best_of_n",
    "lookalike+reflexion",
    "lookalike+self_refine",
    "argname+reflexion",
    "argname+self_refine",
    "sft+dfsdt",
]


def last_step(run: Path) -> int | None:
    steps = [int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit()]
    return max(steps) if steps else None


def command(name: str, args, out: Path) -> list[str] | None:
    """The ``jaxagent eval`` command line of arm ``name`` (None: the arm does not apply)."""
    _, source, method, _ = ARMS[name]
    cmd = [sys.executable, "-m", "jaxagent.cli", "eval", CONFIG]
    if source == "sft":
        cmd += ["--checkpoint", str(args.sft_run), "--step", "0"]
    elif source == "rl":
        cmd += ["--checkpoint", str(args.rl_run), "--step", str(args.rl_step)]
    elif source == "rl_same":
        step = last_step(args.sft_run)
        if not step:
            return None
        cmd += ["--checkpoint", str(args.sft_run), "--step", str(step)]
    else:
        cmd += ["--policy", source]
    if method:
        cmd += ["--method", f"configs/methods/{method}.yaml"]
    cmd += ["--seeds", "1", "--out", str(out / name)]
    cmd += ["--price-input-per-mtok", str(PRICE_IN), "--price-output-per-mtok", str(PRICE_OUT)]
    if args.num_tasks:
        cmd.append(f"eval.num_tasks={args.num_tasks}")
    return cmd


def run_arm(name: str, args, out: Path) -> dict:
    cmd = command(name, args, out)
    if cmd is None:
        return {"arm": name, "skipped": "--sft-run has no RL checkpoint after step 0"}
    t0 = time.time()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        p = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.arm_timeout
        )
        rc, tail = p.returncode, (p.stderr.strip().splitlines() or [""])[-1]
    except subprocess.TimeoutExpired:
        rc, tail = 124, f"timed out after {args.arm_timeout} s"
    meta = {
        "arm": name,
        "command": shlex.join(["jaxagent", *cmd[3:]]),
        "rc": rc,
        "seconds": round(time.time() - t0, 1),
        "load_start": C.load_average(),
    }
    if rc != 0:
        meta["error"] = tail
    (out / name).mkdir(parents=True, exist_ok=True)
    (out / name / "run.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def arm_row(name: str, out: Path) -> dict:
    """One row of the table from ``out/name/eval.json`` (and the run's ``run.json``)."""
    label, source, method, group = ARMS[name]
    meta_path = out / name / "run.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    row = {"arm": name, "label": label, "group": group, "method": method, **meta}
    ev_path = out / name / "eval.json"
    if not ev_path.exists() or meta.get("rc", 0) != 0:
        return row
    ev = json.loads(ev_path.read_text())
    n, tok = ev["episodes"], ev["tokens"]
    row.update(
        success=ev["success"]["mean"],
        ci_low=ev["success"]["ci_low"],
        ci_high=ev["success"]["ci_high"],
        episodes=n,
        avg_steps=ev["avg_steps"],
        tokens_per_episode=tok["total"] / n,
        generated_per_episode=tok["generated"] / n,
        input_per_episode=tok["input"] / n,
        cost_usd_per_episode=ev["cost_usd"] / n,
        step=ev["provenance"].get("step"),
        checkpoint=ev["provenance"].get("checkpoint"),
    )
    return row


def table_lines(rows: list[dict]) -> list[str]:
    """The arms' table (``scripts/results_tables.py`` renders it from methods_vs_rl.json)."""
    lines = [
        "| arm | held-out success [95% CI] | avg steps | tokens / episode | generated / "
        "episode | cost / 1k episodes (USD) | eval wall (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "success" not in r:
            why = r.get("skipped") or f"failed (exit {r.get('rc')}): {r.get('error', '?')}"
            lines.append(f"| {r['label']} | not run: {why} | | | | | |")
            continue
        lines.append(
            f"| {r['label']} | {r['success']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}] | "
            f"{r['avg_steps']:.2f} | {r['tokens_per_episode']:.0f} | "
            f"{r['generated_per_episode']:.0f} | {1000 * r['cost_usd_per_episode']:.4f} | "
            f"{r.get('seconds', float('nan')):.0f} |"
        )
    return lines


def markdown(rows: list[dict], args, wall_s: float, reading: str) -> str:
    m = C.machine()
    lines = [
        "# Training-free methods against RL (quickstart world)",
        "",
        "Generated by `experiments/methods_vs_rl.py`. Every arm is one `jaxagent eval` on the "
        f"held-out test tasks ({rows[0].get('episodes', '?')} tasks, one sample a task, "
        "`--seeds 1`: the trainer's evaluation key); success is the mean with its 95% bootstrap "
        "interval over tasks; steps are environment steps per episode; tokens are prompt + "
        "observation + generated per episode, every attempt, critique, candidate and search "
        "branch of a method included; cost is at nominal prices of "
        f"${PRICE_IN} / ${PRICE_OUT} per million input / output tokens. Avg steps is "
        "`eval.json`'s `avg_steps`: every attempt's for Reflexion, but only the kept "
        "candidate's / final path's for best-of-N and DFSDT (their candidates' and branches' "
        "environment steps are in each episode's `info['method']['env_steps']`, which "
        "`eval.json` does not aggregate); their extra interactions show in the tokens column.",
        "",
        "<!-- table:methods_vs_rl -->",
        *table_lines(rows),
        "<!-- /table -->",
    ]
    lines += [
        "",
        "![success and tokens per arm](methods_vs_rl.png)",
        "",
        "## Runs",
        "",
        f"- SFT checkpoint: `{args.sft_run}` step 0; RL checkpoint: `{args.rl_run}` step "
        f"`{args.rl_step}`.",
        f"- Machine: {m['cpu']} ({m['cores']} cores, {m['mem_gib']} GiB), Python "
        f"{m['python']}, commit {C.git_commit()}; the machine was shared with other work. Wall "
        f"time of the evaluations in this table: {wall_s:.0f} s.",
        "- Reproduce: `nice -n 5 python experiments/methods_vs_rl.py --sft-run "
        f"{args.sft_run} --rl-run {args.rl_run} --rl-step {args.rl_step} --out {args.out}` "
        "(add `--force` to rerun kept arms). Each arm's command:",
        "",
        "```",
        *[r["command"] for r in rows if r.get("command")],
        "```",
        "",
        "## Reading",
        "",
        reading.strip() or "(to be written from the table above)",
        "",
    ]
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if "success" in r]
    colours = {"lm": "tab:blue", "rl": "tab:red", "scripted": "tab:gray"}
    y = list(range(len(rows)))[::-1]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 0.42 * len(rows) + 1.6), sharey=True)
    for yi, r in zip(y, rows):
        c = colours[r["group"]]
        err = [[r["success"] - r["ci_low"]], [r["ci_high"] - r["success"]]]
        a.errorbar([r["success"]], [yi], xerr=err, fmt="o", color=c, capsize=3)
        b.barh([yi], [r["input_per_episode"]], color=c, alpha=0.35)
        b.barh([yi], [r["generated_per_episode"]], left=[r["input_per_episode"]], color=c)
    a.set_yticks(y, [r["label"] for r in rows], fontsize=8)
    a.set_xlim(-0.02, 1.02)
    a.set_xlabel("held-out success (95% bootstrap CI over tasks)")
    a.grid(axis="x", alpha=0.3)
    b.set_xlabel("tokens per episode (light: input, dark: generated)")
    b.grid(axis="x", alpha=0.3)
    fig.suptitle("quickstart: training-free methods vs RL (blue: SFT LM, red: RL, grey: scripted)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def kept_reading(page: Path) -> str:
    if not page.exists():
        return ""
    text = page.read_text()
    return text.split("## Reading", 1)[1] if "## Reading" in text else ""


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--sft-run", type=Path, required=True, help="run dir with step 0")
    parser.add_argument("--rl-run", type=Path, required=True, help="run dir after RL")
    parser.add_argument("--rl-step", default="latest", help="latest, best or a step")
    parser.add_argument("--arms", nargs="+", default=ORDER, choices=ORDER)
    parser.add_argument("--num-tasks", type=int, default=0, help="0: the config's test tasks")
    parser.add_argument("--out", type=Path, default=Path("/tmp/methods_vs_rl"))
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--arm-timeout", type=int, default=600)
    parser.add_argument("--force", action="store_true")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        for name in args.arms:
            if (args.out / name / "eval.json").exists() and not args.force:
                print(f"{name}: kept", flush=True)
                continue
            meta = run_arm(name, args, args.out)
            print(f"{name}: {json.dumps(meta)}", flush=True)
    rows = [arm_row(n, args.out) for n in args.arms]
    wall = sum(r.get("seconds", 0.0) for r in rows)
    page = args.results / "methods_vs_rl.md"
    page.write_text(markdown(rows, args, wall, kept_reading(page)))
    (args.results / "methods_vs_rl.json").write_text(json.dumps(rows, indent=1) + "\n")
    plot(rows, args.results / "methods_vs_rl.png")
    summary = {
        r["arm"]: (
            {
                "success": r["success"],
                "ci": [r["ci_low"], r["ci_high"]],
                "avg_steps": r["avg_steps"],
                "tokens_per_episode": round(r["tokens_per_episode"], 1),
            }
            if "success" in r
            else {"not_run": r.get("skipped") or r.get("error")}
        )
        for r in rows
    }
    print(json.dumps({"arms": summary, "wall_s": round(wall, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
