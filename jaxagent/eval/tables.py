"""Markdown tables of evaluation records (``protocol.build_record``) and of comparisons."""

from __future__ import annotations

from typing import Any, Optional


def _f(x: Optional[float], digits: int = 3) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def _interval(s: dict) -> str:
    return f"{_f(s.get('mean'))} [{_f(s.get('ci_low'))}, {_f(s.get('ci_high'))}]"


def _row(name: str, r: dict) -> list[str]:
    s = r["success"]
    tok = r["tokens"]["per_task"]
    return [
        name,
        str(r["episodes"]),
        _interval(s),
        _f(s.get("iqm")),
        _f(r["avg_steps"], 2),
        _f(r.get("avg_steps_successes"), 2),
        str(r["safety_violations"]),
        str(r["env_errors"]),
        f"{tok['prompt']:.0f} / {tok['observation']:.0f} / {tok['generated']:.0f}",
        f"{r['cost_usd']:.6f}",
        _f(r["wall_time"]["per_task_s"], 3),
    ]


HEADER = [
    "split",
    "episodes",
    "success [95% CI]",
    "IQM",
    "avg steps",
    "avg steps (successes)",
    "safety violations",
    "env errors",
    "tokens/task prompt / obs / generated",
    "cost USD",
    "s/task",
]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def record_markdown(record: dict[str, Any]) -> str:
    """The record as Markdown: headline table, failure modes, pass@k, provenance."""
    rows = [_row(record["split"], record)]
    for name, sub in record.get("splits", {}).items():
        if isinstance(sub, dict):
            rows.append(_row(name, sub))
    out = ["## Evaluation", ""]
    out += _table(HEADER, rows)
    s = record["success"]
    out += ["", f"Interval: {s['ci_method']} ({s['tasks']} tasks)."]
    gen = record.get("generalisation")
    if gen:
        out.append(
            f"Generalisation gap (in-distribution − held-out): {gen['gap']:+.3f} "
            f"[{gen['gap_ci_low']:+.3f}, {gen['gap_ci_high']:+.3f}]"
        )
    if s.get("per_run") and len(s["per_run"]) > 1:
        out += [
            "",
            "Success per run: " + ", ".join(f"{k} {_f(v)}" for k, v in s["per_run"].items()),
        ]
    if record["failure_modes"]:
        out += ["", "### Failure modes", ""]
        out += _table(
            ["failure mode", "episodes", "rate"],
            [
                [k, str(v), _f(record["failure_mode_rates"][k])]
                for k, v in record["failure_modes"].items()
            ],
        )
    if record.get("failure_details"):
        out += ["", "Failures in the environment's own labels:", ""]
        out += _table(
            ["label", "episodes", "rate"],
            [
                [k, str(v), _f(v / max(record["episodes"] - record["env_errors"], 1))]
                for k, v in record["failure_details"].items()
            ],
        )
    if record["pass_at_k"]:
        ks = list(record["pass_at_k"])
        out += ["", "### pass@k / pass^k", ""]
        out += _table(
            ["k"] + [k.split("@")[1] for k in ks],
            [
                ["pass@k"] + [_f(record["pass_at_k"][k]) for k in ks],
                ["pass^k"] + [_f(record["pass_hat_k"].get(k.replace("@", "^"))) for k in ks],
            ],
        )
    r = record["retries_until_success"]
    out += [
        "",
        f"Samples until the first success: {_f(r['mean_samples_to_first_success'], 2)} "
        f"(solved {r['solved_fraction']:.3f} of {r['task_evaluations']} task evaluations, "
        f"{r['samples_per_task']} samples each).",
    ]
    p = record.get("provenance") or {}
    if p:
        pk = p.get("packages", {})
        out += [
            "",
            "### Provenance",
            "",
            f"- config hash `{p.get('config_hash')}`, env `{p.get('env')}`, policy `{p.get('policy')}`",
            f"- checkpoint `{p.get('checkpoint')}` step {p.get('step')}, model {p.get('model')}",
            f"- training seeds {p.get('train_seeds')}, evaluation seeds {p.get('eval_seeds')}",
            "- " + ", ".join(f"{k} {v}" for k, v in pk.items()) + f", git `{p.get('git_commit')}`",
        ]
    return "\n".join(out) + "\n"


def compare_markdown(cmp: dict[str, Any]) -> str:
    """A comparison (``compare.compare_records``) as a Markdown table."""
    d, p = cmp["difference"], cmp["probability_of_improvement"]
    rows = [
        ["A", cmp["a"]["path"], _f(cmp["a"]["success"]), str(cmp["a"]["episodes"])],
        ["B", cmp["b"]["path"], _f(cmp["b"]["success"]), str(cmp["b"]["episodes"])],
    ]
    out = _table(["", "record", "success", "episodes"], rows)
    out += [
        "",
        f"B − A: {d['value']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}] (95% bootstrap)",
        f"P(B > A): {p['value']:.3f} [{p['ci_low']:.3f}, {p['ci_high']:.3f}] over {p['tasks']} tasks",
    ]
    return "\n".join(out) + "\n"
