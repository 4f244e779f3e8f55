"""PNG plots of an evaluation record (matplotlib, Agg backend): success with its interval
per split, failure-mode bars, cost (or tokens, when no price is set) per task vs success."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _splits(record: dict) -> dict[str, dict]:
    out = {record["split"]: record}
    out.update({k: v for k, v in record.get("splits", {}).items() if isinstance(v, dict)})
    return out


def write_plots(record: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """Write ``success.png``, ``failure_modes.png`` and ``cost_vs_success.png``; returns paths."""
    plt = _pyplot()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    splits = _splits(record)

    fig, ax = plt.subplots(figsize=(4 + len(splits), 3.5))
    names = list(splits)
    means = [splits[n]["success"]["mean"] for n in names]
    lows = [splits[n]["success"]["ci_low"] for n in names]
    highs = [splits[n]["success"]["ci_high"] for n in names]
    err = [
        [m - (lo if lo is not None else m) for m, lo in zip(means, lows)],
        [(hi if hi is not None else m) - m for m, hi in zip(means, highs)],
    ]
    ax.bar(names, means, yerr=err, capsize=6, color="#4c72b0")
    labelled = False
    for n, s in splits.items():
        iqm = s["success"].get("iqm")
        if iqm is not None:
            ax.plot([n], [iqm], "D", color="#dd8452", label=None if labelled else "IQM")
            labelled = True
    ax.set_ylim(0, 1)
    ax.set_ylabel("success (95% CI)")
    ax.set_title("success")
    if labelled:
        ax.legend(loc="upper right")
    paths.append(_save(fig, out_dir / "success.png", plt))

    fig, ax = plt.subplots(figsize=(6, 3.5))
    modes = record["failure_modes"]
    if modes:
        ax.barh(list(modes), list(modes.values()), color="#c44e52")
        ax.invert_yaxis()
        ax.set_xlabel("episodes")
    else:
        ax.text(0.5, 0.5, "no policy failures", ha="center", va="center")
        ax.set_axis_off()
    ax.set_title(f"failure modes ({record['split']})")
    paths.append(_save(fig, out_dir / "failure_modes.png", plt))

    fig, ax = plt.subplots(figsize=(5, 3.5))
    priced = record["cost_usd"] > 0
    for n, s in splits.items():
        x = s["cost_usd_per_task"] if priced else sum(s["tokens"]["per_task"].values())
        ax.scatter([x], [s["success"]["mean"]], s=40)
        ax.annotate(n, (x, s["success"]["mean"]), textcoords="offset points", xytext=(4, 4))
    ax.set_xlim(left=0)
    ax.set_xlabel("cost per task (USD)" if priced else "tokens per task (no price set)")
    ax.set_ylabel("success")
    ax.set_ylim(0, 1)
    ax.set_title("cost vs success")
    paths.append(_save(fig, out_dir / "cost_vs_success.png", plt))
    return paths


def _save(fig, path: Path, plt) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
