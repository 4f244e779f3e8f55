"""End of a run: the final table, the learning-curve PNG, ``summary.json`` and one JSON line.

``summary.json`` has a ``health`` list: one sentence per symptom of a run that learned badly
(``jaxagent.train.guards.learning_health``), empty for a healthy run. The last line a run
prints is ``{"success_before_rl": …, "success_after_rl": …,
"avg_steps": …, "wall_s": …}`` (plus a few more keys) for scripts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from jaxagent.parallel.distributed import is_writer
from jaxagent.train.guards import learning_health
from jaxagent.train.metrics_log import read_jsonl


def _table(rows: Sequence[tuple[str, str, str]], title: str) -> str:
    from io import StringIO

    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in ("", "before RL (after SFT)", "after RL"):
        table.add_column(col)
    for row in rows:
        table.add_row(*row)
    buf = StringIO()
    Console(file=buf, width=100, force_terminal=False, color_system=None).print(table)
    return buf.getvalue().rstrip()


def _modes(modes: dict) -> str:
    return (
        ", ".join(f"{k} {int(v)}" for k, v in sorted(modes.items(), key=lambda kv: -kv[1])) or "-"
    )


def plot_learning_curve(
    run_dir: Path, history: Sequence[dict], path: Path, val: Sequence[dict] = ()
) -> Path:
    """Held-out success at each evaluation, validation success (when there is a validation
    set) and train success per iteration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    records = read_jsonl(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").exists() else []
    train = [(r["step"], r["train/success"]) for r in records if "train/success" in r]
    if train:
        ax.plot(*zip(*train), color="tab:gray", alpha=0.6, label="train success (sampled)")
    if val:
        ax.plot(
            [v["iteration"] for v in val],
            [v["success"] for v in val],
            "s--",
            color="tab:orange",
            label="validation success (selection)",
        )
    ax.plot(
        [h["iteration"] for h in history],
        [h["success"] for h in history],
        "o-",
        color="tab:blue",
        label="held-out success",
    )
    ax.set_xlabel("RL iteration (0 = after SFT)")
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def finish_run(trainer, history: Sequence[dict], extra: dict, wall_s: float) -> dict:
    """Print the final table, write the PNG and ``summary.json``; return the summary."""
    cfg = trainer.config
    before, after = history[0], history[-1]
    summary = {
        "success_before_rl": round(float(before["success"]), 4),
        "success_after_rl": round(float(after["success"]), 4),
        "avg_steps": round(float(after["avg_steps"]), 3),
        "wall_s": round(float(wall_s), 1),
        "avg_steps_before_rl": round(float(before["avg_steps"]), 3),
        "failure_modes_before_rl": before.get("failure_modes", {}),
        "failure_modes_after_rl": after.get("failure_modes", {}),
        "failure_details_before_rl": before.get("failure_details", {}),
        "failure_details_after_rl": after.get("failure_details", {}),
        "env_errors_after_rl": int(after.get("env_errors", 0)),
        "eval_episodes": int(after.get("episodes", 0)),
        "iterations": int(after["iteration"]),
        "seed": cfg.train.seed,
        "run_dir": str(trainer.run_dir),
    }
    # the learning-health sentences (empty: no symptom), from the whole run's records
    records = read_jsonl(trainer.run_dir / "metrics.jsonl") if is_writer() else []
    evals = [(int(h["iteration"]), float(h["success"])) for h in history]
    summary["health"] = list(learning_health(records, evals, cfg.guards).values())
    for sentence in summary["health"]:
        trainer.echo(f"[health] {sentence}")
    if "sft" in extra:
        summary["expert_success"] = round(float(extra["sft"]["sft/expert_success"]), 4)
        if "sft/restarts" in extra["sft"]:  # sft.max_restarts: the fits tried, in the open
            summary["sft_restarts"] = int(extra["sft"]["sft/restarts"])
            summary["sft_val_success"] = list(extra["sft"]["sft/val_success"])
    best = extra.get("best_val")
    if best:  # model selection on the validation tasks (carved from train), tested once
        summary.update(
            {
                "success_best_val": round(float(best["test"]["success"]), 4),
                "best_val_iteration": int(best["iteration"]),
                "best_val_success": round(float(best["val_success"]), 4),
                "val_curve": [
                    [int(v["iteration"]), round(float(v["success"]), 4)]
                    for v in extra.get("val", [])
                ],
            }
        )
    rows = [
        ("held-out success", f"{before['success']:.3f}", f"{after['success']:.3f}"),
        ("avg steps (turns)", f"{before['avg_steps']:.2f}", f"{after['avg_steps']:.2f}"),
        (
            "failure modes",
            _modes(before.get("failure_modes", {})),
            _modes(after.get("failure_modes", {})),
        ),
        ("env errors", str(int(before.get("env_errors", 0))), str(int(after.get("env_errors", 0)))),
    ]
    if before.get("failure_details") or after.get("failure_details"):
        rows.insert(
            3,
            (
                "failures in detail",
                _modes(before.get("failure_details", {})),
                _modes(after.get("failure_details", {})),
            ),
        )
    if best:
        rows.append(
            (
                f"held-out success of the best-validation checkpoint (iter "
                f"{best['iteration']}, val {best['val_success']:.3f})",
                "",
                f"{best['test']['success']:.3f}",
            )
        )
    title = (
        f"{cfg.name} (seed {cfg.train.seed}): {len(trainer.built.tasks.eval)} held-out "
        f"{cfg.env.name} tasks, {cfg.rl.recipe} for {after['iteration']} iterations"
    )
    trainer.echo(_table(rows, title))
    if not is_writer():  # a multi-host run's files are written once, by process 0
        return summary
    if cfg.train.plot:
        png = plot_learning_curve(
            trainer.run_dir, history, trainer.run_dir / "learning_curve.png", extra.get("val", ())
        )
        summary["learning_curve"] = str(png)
        trainer.echo(f"learning curve: {png}")
    (trainer.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    trainer.echo(
        json.dumps(
            {
                k: summary[k]
                for k in (
                    "success_before_rl",
                    "success_after_rl",
                    "success_best_val",
                    "best_val_iteration",
                    "avg_steps",
                    "wall_s",
                    "seed",
                    "env_errors_after_rl",
                    "sft_restarts",
                )
                if k in summary
            }
        )
    )
    return summary
