"""Regenerate the figure tables of docs/results/*.md from their raw records.

    python scripts/results_tables.py            # rewrite every table block
    python scripts/results_tables.py --check    # exit 1 naming the tables that differ

A table in a results page sits between ``<!-- table:NAME -->`` and ``<!-- /table -->``; the
prose around it stays hand-written. Each NAME is rendered from the JSON lines of
``docs/results/*.jsonl`` whose ``table`` field is NAME (or, for the experiment runners'
files, the records that runner wrote): one line a run, with its command, commit, machine,
seed and raw figures. Means, gains and 95% Student-t intervals are computed here, so a
figure edited by hand in the markdown, without its record, no longer matches
(``tests/test_results_tables.py``). Records reconstructed from an earlier page rather than
re-run carry ``recovered_from: "<file>@<commit>"``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Callable, Sequence

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # from a checkout without `pip install -e .` too
RESULTS = ROOT / "docs" / "results"
BLOCK = re.compile(r"(<!-- table:([\w-]+) -->\n)(.*?)(<!-- /table -->)", re.S)

from jaxagent.eval.report import seed_summary  # noqa: E402


# ----------------------------------------------------------------------------- records


def read_records(name: str) -> list[dict]:
    path = RESULTS / name
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def table_records(name: str, table: str) -> list[dict]:
    rs = [r for r in read_records(name) if r.get("table") == table]
    return sorted(rs, key=lambda r: (str(r.get("seed")),))


def interval(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the 95% Student-t half-width over seeds (``eval.report.seed_summary``)."""
    s = seed_summary(list(values))
    return s["mean"], s["ci95"]


def rint(x: float) -> int:
    return int(math.floor(x + 0.5))  # half up, as the pages were written


def table(header: Sequence[str], align: Sequence[str], rows: Sequence[Sequence[str]]) -> list:
    sep = {"r": "---:", "l": "---"}
    return [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(sep[a] for a in align) + "|",
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def gain_points(r: dict, key: str = "after") -> float:
    return (r["figures"][key] - r["figures"]["before"]) * 100


def mean_gain_line(rs: list[dict], what: str = "Mean gain") -> str:
    m, ci = interval([gain_points(r) for r in rs])
    return f"{what} **{m:+.1f} points (95% t-interval ± {ci:.1f})** over {len(rs)} seeds."


# ----------------------------------------------------------------------------- renderers


def quickstart_seeds_wave0() -> list[str]:
    rs = table_records("quickstart.jsonl", "quickstart_seeds_wave0")
    rows = []
    for r in rs:
        f = r["figures"]
        rows.append([str(r["seed"]), f"{f['before']:.3f}", f"{f['after']:.3f}",
                     f"{gain_points(r):+.1f}", f"{f['best_val']:.3f} ({f['best_val_iter']})",
                     f"{gain_points(r, 'best_val'):+.1f}", f"{f['wall_s']:,}"])  # fmt: skip
    last = interval([gain_points(r) for r in rs])
    best = interval([gain_points(r, "best_val") for r in rs])
    return [
        *table(
            [
                "seed",
                "before RL (after SFT)",
                "after RL (last)",
                "gain",
                "best-validation checkpoint (iter)",
                "gain",
                "wall s (loaded)",
            ],
            "rrrrrrr",
            rows,
        ),  # fmt: skip
        "",
        f"Mean gain **{last[0]:+.1f} points (95% t-interval ± {last[1]:.1f})** for the last "
        f"checkpoint, {best[0]:+.1f} (± {best[1]:.1f}) for the best-validation one.",
    ]


def seed_table(name: str, table_name: str, extra: Sequence[tuple[str, Callable]] = ()) -> list:
    """seed | before | after | gain | best-validation (iter) | extra... | wall s."""
    rs = table_records(name, table_name)
    rows = []
    for r in rs:
        f = r["figures"]
        wall = f"{f['wall_s']:,}" + (f" ({f['wall_note']})" if f.get("wall_note") else "")
        rows.append([str(r["seed"]), f"{f['before']:.3f}", f"{f['after']:.3f}",
                     f"{gain_points(r):+.1f}", f"{f['best_val']:.3f} ({f['best_val_iter']})",
                     *(fn(f) for _, fn in extra), wall])  # fmt: skip
    header = ["seed", "before RL (after SFT)", "after RL (last)", "gain", "best-validation (iter)",
              *(h for h, _ in extra), "wall s"]  # fmt: skip
    return [*table(header, "r" * len(header), rows), "", mean_gain_line(rs)]


def quickstart_seeds() -> list[str]:
    return seed_table("quickstart.jsonl", "quickstart_seeds")


def quickstart_reruns() -> list[str]:
    rows = []
    for i, r in enumerate(table_records("quickstart.jsonl", "quickstart_reruns")):
        f = r["figures"]
        rows.append([r["code_label"], f"`{r['command']}`" if i == 0 else "the same",
                     f"{f['before']:.3f}", f"{f['after']:.3f}", f"{f['best_val']:.3f}", f"{f['wall_s']} s"])  # fmt: skip
    return table(["code", "command", "before RL", "after RL", "best val", "wall"], "llllll", rows)


def quickstart_seeds_f13b200(name: str = "quickstart_seeds_f13b200") -> list[str]:
    rs = table_records("quickstart.jsonl", name)
    rows = [[str(r["seed"]), f"`{r['command']}`", f"{r['figures']['before']:.3f}",
             f"{r['figures']['after']:.3f}", f"{gain_points(r):+.1f}", f"{r['figures']['wall_s']} s"]
            for r in rs]  # fmt: skip
    return [*table(["seed", "command", "before RL", "after RL", "gain", "wall"], "llllll", rows),
            "", mean_gain_line(rs)]  # fmt: skip


def engine_quickstart_seeds() -> list[str]:
    return seed_table("rollout_engine.jsonl", "engine_quickstart_seeds")


def harness_quickstart_seeds() -> list[str]:
    return seed_table(
        "serve.jsonl",
        "harness_quickstart_seeds",
        [
            ("env errors (train episodes)", lambda f: f"{f['train_env_errors']} ({f['train_episodes']:,})"),
            ("median s / iteration (generate)", lambda f: f"{f['median_iteration_s']} ({f['median_generate_s']})"),
        ],
    )  # fmt: skip


def plain_seed_table(
    name: str, table_name: str, extra: Sequence[tuple[str, Callable]] = ()
) -> list:
    """seed | before | after | gain | extra... | wall s, and the mean gain."""
    rs = table_records(name, table_name)
    rows = [[str(r["seed"]), f"{r['figures']['before']:.3f}", f"{r['figures']['after']:.3f}",
             f"{gain_points(r):+.1f}", *(fn(r["figures"]) for _, fn in extra),
             f"{r['figures']['wall_s']:,}"] for r in rs]  # fmt: skip
    header = ["seed", "before RL", "after RL", "gain", *(h for h, _ in extra), "wall s"]
    return [*table(header, "r" * len(header), rows), "", mean_gain_line(rs)]


def quickstart_chatml_seeds() -> list[str]:
    return plain_seed_table("quickstart_chatml.jsonl", "quickstart_chatml_seeds")


def grpo_math_seeds() -> list[str]:
    return plain_seed_table("math.jsonl", "grpo_math_seeds")


def robot_loop_seeds() -> list[str]:
    val = ("validation before -> after", lambda f: f"{f['val_before']:.2f} -> {f['val_after']:.2f}")
    return plain_seed_table("robot.jsonl", "robot_loop_seeds", [val])


def bfcl_gen_seeds() -> list[str]:
    extra = [
        ("95% interval of the gain (Newcombe)",
         lambda f: f"[{f['newcombe95_gain'][0] * 100:+.1f}, {f['newcombe95_gain'][1] * 100:+.1f}]"),
        ("validation before -> after", lambda f: f"{f['val_before']:.2f} -> {f['val_after']:.2f}"),
        ("SFT s", lambda f: f"{f['sft_s']:,}"),
    ]  # fmt: skip
    return plain_seed_table("bfcl_gen.jsonl", "bfcl_gen_seeds", extra)


def bfcl_gen_ablation_seed1() -> list[str]:
    rs = sorted(table_records("bfcl_gen.jsonl", "bfcl_gen_ablation_seed1"),
                key=lambda r: -r["figures"]["after"])  # fmt: skip
    rows = []
    for r in rs:
        f = r["figures"]
        lo, hi = f["newcombe95_gain"]
        rows.append([r["variant"], f"{f['before']:.2f}", f"{f['after']:.2f}", f"{gain_points(r):+.0f}",
                     f"[{lo * 100:+.1f}, {hi * 100:+.1f}]", f"{f['val_after']:.2f}"])  # fmt: skip
    header = ["variant (seed 1)", "before RL", "after RL", "gain", "95% interval (Newcombe)",
              "validation after"]  # fmt: skip
    return table(header, "lrrrrr", rows)


def bfcl_gen_seeds_f8045ed() -> list[str]:
    """The second recipe's seeds; a seed whose SFT start is 0 has no RL row (after: null)."""
    rows = []
    for r in table_records("bfcl_gen.jsonl", "bfcl_gen_seeds_f8045ed"):
        f = r["figures"]
        if f["after"] is None:
            rows.append([str(r["seed"]), f"{f['before']:.3f}", "not run", "", "",
                         f"{f['val_before']:.2f} -> (not run)", f"{f['sft_s']:,}", ""])  # fmt: skip
            continue
        lo, hi = f["newcombe95_gain"]
        rows.append([str(r["seed"]), f"{f['before']:.3f}", f"{f['after']:.3f}", f"{gain_points(r):+.1f}",
                     f"[{lo * 100:+.1f}, {hi * 100:+.1f}]", f"{f['val_before']:.2f} -> {f['val_after']:.2f}",
                     f"{f['sft_s']:,}", f"{f['cpu_s_process']:,}"])  # fmt: skip
    header = ["seed", "before RL", "after RL", "gain", "95% interval of the gain (Newcombe)",
              "validation before -> after", "SFT s", "CPU s (process)"]  # fmt: skip
    return table(header, "r" * len(header), rows)


def bfcl_gen_fits(table_name: str, sft_key: str, sft_header: str) -> list[str]:
    """A bfcl_gen recipe's seeds with the validation of each SFT fit it tried."""
    rows = []
    for r in table_records("bfcl_gen.jsonl", table_name):
        f = r["figures"]
        lo, hi = f["newcombe95_gain"]
        tried = " / ".join(f"{v:.2f}" for v in f["sft_val_success"])
        rows.append([str(r["seed"]), tried, f"{f['before']:.3f}", f"{f['after']:.3f}",
                     f"{gain_points(r):+.1f}", f"[{lo * 100:+.1f}, {hi * 100:+.1f}]",
                     f"{f['val_before']:.2f} -> {f['val_after']:.2f}",
                     f"{f[sft_key]:,}", f"{f['wall_s']:,}"])  # fmt: skip
    header = ["seed", "validation of each SFT fit", "before RL", "after RL", "gain",
              "95% interval of the gain (Newcombe)", "validation before -> after",
              sft_header, "wall s"]  # fmt: skip
    return table(header, "r" * len(header), rows)


def bfcl_gen_restarts_fbec46a() -> list[str]:
    """The recipe with SFT restarts (a fit below validation 0.1 redone, at most twice)."""
    return bfcl_gen_fits("bfcl_gen_restarts_fbec46a", "sft_s_all_attempts", "SFT s (all fits)")


def bfcl_gen_heads8_121e283() -> list[str]:
    """The recipe with 8 attention heads of 16 dims (none shared) instead of 4 heads of 32
    sharing 2 key/value heads; chosen on seed 0's validation start."""
    return bfcl_gen_fits("bfcl_gen_heads8_121e283", "sft_s", "SFT s")


def bfcl_gen_heads8_trend() -> list[str]:
    """Whether the 8-head recipe's curves fall late: training success (64 episodes an
    iteration) in iterations 21-30 against 11-20 per seed, with the 95% interval of the
    difference from the iterations' spread (Welch, t at 18 degrees of freedom), the mean over
    seeds with its t-interval; the validation peak against the last point, and held-out
    success of the last checkpoint against the best-validation one."""
    t18 = 2.101  # t_{0.975, 18}: two halves of 10 iterations each
    rows, diffs = [], []
    for r in table_records("bfcl_gen.jsonl", "bfcl_gen_heads8_121e283"):
        f = r["figures"]
        by_it = {int(k): v for k, v in f["train_success_by_iteration"].items()}
        halves = [[by_it[i] for i in range(a, a + 10)] for a in (1, 11, 21)]
        s = [seed_summary(h) for h in halves]  # mean and sample std of each half
        means = [x["mean"] for x in s]
        half = t18 * math.sqrt(s[1]["std"] ** 2 / 10 + s[2]["std"] ** 2 / 10)
        diff = means[2] - means[1]
        diffs.append(diff)
        val = {int(k): v for k, v in f["val_curve"].items()}
        peak = max(sorted(val), key=lambda k: (val[k], -k))
        last = max(val)
        rows.append([str(r["seed"]), f"{means[0]:.3f}", f"{means[1]:.3f}", f"{means[2]:.3f}",
                     f"{diff * 100:+.1f} [{(diff - half) * 100:+.1f}, {(diff + half) * 100:+.1f}]",
                     f"{val[peak]:.2f} (iteration {peak}) / {val[last]:.2f}",
                     f"{f['after']:.2f} / {f['success_best_val']:.2f}"])  # fmt: skip
    m, h = interval(diffs)
    rows.append(["mean", "", "", "", f"{m * 100:+.1f} ± {h * 100:.1f}", "", ""])
    header = ["seed", "train success, iterations 1-10", "11-20", "21-30",
              "21-30 minus 11-20 (points, 95%)", "validation: peak / last",
              "held-out: last / best-validation checkpoint"]  # fmt: skip
    return table(header, "r" * len(header), rows)


def halfcheetah_ppo_seeds() -> list[str]:
    rs = table_records("robot.jsonl", "halfcheetah_ppo_seeds")
    rows = []
    for r in rs:
        f = r["figures"]
        last10 = f"{f['train_return_last10']:,}" if "train_return_last10" in f else "—"
        rows.append([str(r["seed"]), f"{f['return_mean']:,.1f}", last10, str(f["wall_s"]),
                     f"{f['env_steps_per_s']:,}", f["load"]])  # fmt: skip
    returns = [r["figures"]["return_mean"] for r in rs]
    return [
        *table(
            [
                "seed",
                "return, 10 evaluation episodes",
                "training episodes, last 10",
                "wall s",
                "env steps/s",
                "load average",
            ],
            "rrrrrr",
            rows,
        ),  # fmt: skip
        "",
        f"Mean return **{sum(returns) / len(returns):,.1f}** over {len(rs)} seeds, lowest "
        f"{min(returns):,.1f} (target 1,500).",
    ]


def web_health() -> list[str]:
    mw = table_records("web.jsonl", "web_health_miniwob")[0]["figures"]
    sites = table_records("web.jsonl", "web_health_sites")
    rows = [[f"`jaxagent check miniwob num_test={mw['tasks_per_solver']}`",
             f"{mw['solvers']} solvers {mw['solved_per_solver']}/{mw['tasks_per_solver']} "
             f"({mw['episodes']} episodes, {mw['env_errors']} env errors, "
             f"{mw['browser_restarts']} browser restarts)",
             f"{mw['episodes_per_s']} episodes/s, {mw['env_steps_per_s']} env steps/s through "
             f"{mw['browsers']} browsers; a browser step p50 {mw['step_p50_ms']} ms, p95 "
             f"{mw['step_p95_ms']} ms"]]  # fmt: skip
    for r in sites:
        f = r["figures"]
        rows.append([f"`{r['command']}`", f"expert {f['expert']:.3f}, random {f['random']:.3f}",
                     f"no-scroll oracle {f['no_scroll']:.3f} under its bound 1 - "
                     f"{f['off_viewport_frac']:.3f} (tasks whose target is off-viewport at reset)"])  # fmt: skip
    return table(["command", "success", "other figures"], "lll", rows)


def soak_default() -> list[str]:
    rows = []
    for r in sorted(table_records("pool_and_faults.jsonl", "soak_default"), key=lambda r: r["run"]):
        f = r["figures"]
        assert (
            f["episodes_in"] == f["episodes_out"] and f["faults_injected"] == f["faults_recovered"]
        )
        rows.append([str(r["run"]), str(f["iterations"]), f"{f['episodes_in']:,}",
                     f"{f['faults_injected']:,}", str(f["skipped_updates"]),
                     f"{f['rss_slope_mb_h']:+g} ± {f['rss_slope_ci_mb_h']:g} MB/h",
                     f"{f['peak_slope_mb_h']:+g} ± {f['peak_slope_ci_mb_h']:g} MB/h"])  # fmt: skip
    return table(["run", "iterations", "episodes in = out", "faults injected = recovered",
                  "skipped updates", "RSS slope after the warm-up", "per-iteration peak slope"],
                 "lllllll", rows)  # fmt: skip


def dqn_shipped_summary() -> list[str]:
    r = table_records("dqn_dialogue.jsonl", "dqn_recipes")[0]
    f, per = r["figures"], r["figures"]["dqn_return_per_seed"]
    m, ci = interval(per)
    above = (
        "every seed"
        if min(per) > f["rule_return"]
        else f"{sum(v > f['rule_return'] for v in per)} seeds"
    )
    return [
        f"The shipped recipe (100k env steps, 4 updates a step, lr 5e-4, target copy every 1000, "
        f"epsilon decay 30k), {len(per)} seeds on {r['machine']}, {f['wall_s']} s for all "
        f"{len(per)}: DQN return {m:.3f}, 95% interval [{m - ci:.3f}, {m + ci:.3f}], {above} "
        f"above the rule policy's {f['rule_return']} (worst {min(per):.3f}; success "
        f"{f['dqn_success']:.3f}); the table of the three recipes over ten seeds each is in "
        "[dqn_dialogue.md](dqn_dialogue.md)."
    ]


def serve_throughput() -> list[str]:
    rs = sorted(table_records("serve.jsonl", "serve_throughput"), key=lambda r: r["run"])
    heads = [f"run {r['run']} ({r['machine'].split(', ')[-1]}"
             + (f", {r['run_note']})" if r["run_note"] else ")") for r in rs]  # fmt: skip
    f = [r["figures"] for r in rs]
    rows = [
        ["requests/s", *(f"{x['requests_per_s']}" for x in f)],
        ["completion tokens/s", *(f"{x['completion_tokens_per_s']}" for x in f)],
        ["latency p50 / p95", *(f"{x['latency_p50_s']:.2f} s / {x['latency_p95_s']:.2f} s" for x in f)],
        ["KV reuse (context tokens already cached)",
         *(f"{x['kv_reuse']:.2f} (own turns {x['kv_reuse_own_turns']:.2f})" for x in f)],
        ["mean decode batch", *(f"{x['mean_decode_batch']} rows" for x in f)],
        ["evictions, compiles in the timed pass", *(f"{x['evictions']}, {x['compiles_timed']}" for x in f)],
        ["built-in driver (engine), same work", *(f"{x['driver_tokens_per_s']} tokens/s" for x in f)],
        ["server / driver", *(f"{x['completion_tokens_per_s'] / x['driver_tokens_per_s']:.2f}" for x in f)],
    ]  # fmt: skip
    return table(["", *heads], "l" * (1 + len(rs)), rows)


def engine_web_seed0() -> list[str]:
    rows = []
    for r in [
        r for r in read_records("rollout_engine.jsonl") if r.get("table") == "engine_web_seed0"
    ]:
        f = r["figures"]
        best = f"{f['best_val']:.2f} ({f['best_val_iter']})" if "best_val" in f else ""
        rows.append([r["run"], f"{f['before']:.2f}", f"{f['after']:.2f}", f"{rint(gain_points(r)):+d}",
                     " / ".join(f"{v:.2f}" for v in f["val"]), best])  # fmt: skip
    return table(["run", "before RL (after SFT)", "after RL (last)", "gain",
                  "validation 0 / 10 / 20 / 30 / 32", "best-validation (iter)"], "lrrrlr", rows)  # fmt: skip


def loop_dialogue_seeds() -> list[str]:
    """configs.jsonl's loop_dialogue runs joined with their out-of-turns counts."""
    out = {
        r["seed"]: r["figures"]
        for r in table_records("dialogue.jsonl", "loop_dialogue_out_of_turns")
    }
    rs = sorted((r for r in read_records("configs.jsonl") if r["config"] == "loop_dialogue"),
                key=lambda r: r["seed"])  # fmt: skip
    rows, gains = [], []
    for r in rs:
        s, f = r["summary"], out[r["seed"]]
        gains.append((s["success_after_rl"] - s["success_before_rl"]) * 100)
        rows.append([str(r["seed"]), f"{s['success_before_rl']:.3f} → {s['success_after_rl']:.3f}",
                     " / ".join(f"{v:.2f}" for _, v in r["curves"]["val"]),
                     f"{f['out_of_turns_before']} → {f['out_of_turns_after']}"])  # fmt: skip
    m, ci = interval(gains)
    return [
        *table(
            [
                "seed",
                "held-out success (200 goals: unseen routes, the held-out simulator "
                "setting) before → after 40 LOOP iterations",
                "validation success (100 "
                "training-distribution goals never trained on), iterations 0 / 10 / 20 / 30 / 40",
                "held-out episodes out of turns, before → after",
            ],
            "llll",
            rows,
        ),  # fmt: skip
        "",
        f"Over the {len(rs)} seeds the held-out gain is {m:+.1f} ± {ci:.1f} points (95% t).",
    ]


def strict_tool_calls() -> list[str]:
    rows = []
    for r in [
        r for r in read_records("strict_tool_calls.jsonl") if r.get("table") == "strict_tool_calls"
    ]:
        f = r["figures"]
        rate = f"{100 * f['valid_calls'] / f['calls']:.1f}%".replace(".0%", "%")
        if f["valid_calls"] == f["calls"]:
            rate = f"**{rate}**"
        rows.append([f["decoding"], str(f["calls"]), str(f["valid_calls"]), rate,
                     f"{100 * f['call_or_answer_frac']:.0f}%", f"{100 * f['held_out_success']:.1f}%"])  # fmt: skip
    return table(["decoding", "calls", "valid calls", "valid rate",
                  "turns that are a call or an answer", "held-out success"], "llllll", rows)  # fmt: skip


def soak_allocators() -> list[str]:
    rows = []
    for r in [
        r for r in read_records("pool_and_faults.jsonl") if r.get("table") == "soak_allocators"
    ]:
        f = r["figures"]
        rows.append([r["setting"], f"{f['peak_slope_mb_h']:+g} ± {f['peak_slope_ci_mb_h']:g} MB/h",
                     f"{f['mean_peak_mb']} MB", str(f["iterations"])])  # fmt: skip
    return table(["setting", "peak slope", "mean peak", "iterations"], "llll", rows)


def dqn_recipes() -> list[str]:
    rows = []
    for r in table_records("dqn_dialogue.jsonl", "dqn_recipes"):
        f = r["figures"]
        per = f["dqn_return_per_seed"]
        m, ci = interval(per)
        rows.append([r["label"], str(len(per)), f"{m:.3f} [{m - ci:.3f}, {m + ci:.3f}]",
                     f"{min(per):.3f}", f"{f['dqn_success']:.3f}",
                     " / ".join(f"{v:.3f}" for v in per), f"{f['wall_s']:,}",
                     f"`{r['command']}`"])  # fmt: skip
    return table(["config", "seeds", "DQN return [95% t]", "worst seed", "DQN success",
                  "per seed", "wall s", "command"], "lrlrrlrl", rows)  # fmt: skip


def dqn_select() -> list[str]:
    """Validation per candidate (mean [95% t] over the seeds every candidate has), the
    selected one, and its held-out cells."""
    sys.path.insert(0, str(ROOT / "experiments"))
    from dqn_select import CANDIDATES, selected

    rs = read_records("dqn_select.jsonl")
    val = [r for r in rs if r["stage"] == "val"]
    if not val:
        return ["(no records yet)"]
    common = set.intersection(
        *({r["seed"] for r in val if r["candidate"] == n} for n in CANDIDATES)
    )
    pick = selected(rs)
    rows = []
    for n in CANDIDATES:
        cells = sorted((r for r in val if r["candidate"] == n and r["seed"] in common),
                       key=lambda r: r["seed"])  # fmt: skip
        per = [r["dqn_return"] for r in cells]
        m, ci = interval(per)
        succ = sum(r["dqn_success"] for r in cells) / len(cells)
        rows.append([f"**{n}** (selected)" if n == pick else n, str(len(per)),
                     f"{m:.3f} [{m - ci:.3f}, {m + ci:.3f}]", f"{min(per):.3f}", f"{succ:.3f}",
                     " / ".join(f"{v:.3f}" for v in per), f"{cells[0]['rule_return']:.4f}",
                     " ".join(cells[0]["overrides"]) or "(none)"])  # fmt: skip
    out = table(["candidate", "seeds", "validation return [95% t]", "worst seed", "success",
                 "per seed", "rule policy", "overrides of configs/dqn_dialogue.yaml"],
                "lrlrrlrl", rows)  # fmt: skip
    out.append("")
    by = {(r["candidate"], r["seed"]): r["dqn_return"] for r in val if r["seed"] in common}
    diffs = []
    for n in CANDIDATES:
        if n != pick:
            m, ci = interval([by[pick, s] - by[n, s] for s in sorted(common)])
            diffs.append(f"{m:+.3f} ± {ci:.3f} against {n}")
    out.append(f"Paired over seeds, `{pick}` minus each other candidate on validation (95% t): "
               + "; ".join(diffs) + ".")  # fmt: skip
    ho = sorted((r for r in rs if r["stage"] == "heldout"), key=lambda r: r["seed"])
    out.append("")
    if ho:
        per = [r["dqn_return"] for r in ho]
        m, ci = interval(per)
        above = sum(v > ho[0]["rule_return"] for v in per)
        out.append(
            f"Held-out, once, for the selected `{ho[0]['candidate']}` (whole training split, "
            f"{len(per)} seeds): **{m:.3f} [{m - ci:.3f}, {m + ci:.3f}]** against the rule "
            f"policy's {ho[0]['rule_return']:.4f}; worst seed {min(per):.3f}, {above} of "
            f"{len(per)} seeds above the rule policy; per seed "
            + " / ".join(f"{v:.3f}" for v in per)
            + "."
        )
        shipped = table_records("dqn_dialogue.jsonl", "dqn_recipes")[0]["figures"]
        if ho[0]["candidate"] == "shipped":
            published = shipped["dqn_return_per_seed"]
            same = sum(f"{r['dqn_return']:.3f}" == f"{published[r['seed']]:.3f}" for r in ho)
            out.append(
                f"{same} of these {len(ho)} seeds equal the published per-seed return "
                "([dqn_recipes](#dqn-dialogue-policy-against-the-rule-policy), 2026-12-04, "
                "AMD EPYC) to the 3 published decimals; the rule policy's held-out return is "
                f"{ho[0]['rule_return']:.4f} here ({shipped['rule_return']} published)."
            )
    else:
        out.append(f"Selected on validation: `{pick}`; its held-out cells are not measured yet.")
    machines = sorted({f"{r['machine']['cpu']} ({r['machine']['cores']} cores)" for r in rs})
    out.append(f"Machine: {'; '.join(machines)}; HEAD {rs[0]['commit']} at the first cell, "
               f"{rs[-1]['commit']} at the last (the records name each cell's).")  # fmt: skip
    return out


def async_speedup_quiet() -> list[str]:
    rows = []
    for r in table_records("async_training.jsonl", "async_speedup_quiet"):
        f, x = r["figures"], r["figures"]["ratio"]
        rows.append([f["profile"], f"{f['sync_s']:.2f} s (collect {f['collect_s']:.2f}, update {f['update_s']:.2f})",
                     *(f"{x[k]:.2f}x" for k in ("async_k1", "async_k2", "disagg_k1", "disagg_k2", "ceiling"))])  # fmt: skip
    return table(["profile", "sync (anchor)", "async k=1", "async k=2", "disaggregated k=1",
                  "disaggregated k=2", '"ceiling"'], "lllllll", rows)  # fmt: skip


def async_lanes() -> list[str]:
    rows = []
    for r in read_records("async_training.jsonl"):
        if r.get("table") != "async_lanes":
            continue
        f, x = r["figures"], r["figures"]["ratio"]
        rows.append([f"`{r['command']}`", f"{f['sync_s']:.2f} s", f"{x['async_k1']:.2f}x",
                     f"**{x['async_k1_lanes2']:.2f}x**",
                     f"{x['ceiling']:.2f}x / {x['ceiling_lanes2']:.2f}x"])  # fmt: skip
    return table(["command", "sync (anchor)", "async k = 1, one lane", "async k = 1, two lanes",
                  "ceiling one lane / two lanes"], "lllll", rows)  # fmt: skip


def async_speedup_full() -> list[str]:
    rows = []
    for r in table_records("async_training.jsonl", "async_speedup_full"):
        f, x = r["figures"], r["figures"]["ratio"]
        rows.append([f["profile"], f"{f['sync_s']:.2f} s (collect {f['collect_s']:.2f}, update {f['update_s']:.2f})",
                     *(f"{x[k]:.2f}x" for k in ("async_k1", "async_k1_lanes2", "async_k2", "disagg_k1", "disagg_k2")),
                     f"{x['ceiling']:.2f}x / {x['ceiling_lanes2']:.2f}x"])  # fmt: skip
    return table(["profile", "sync (anchor)", "async k=1", "async k=1, 2 lanes", "async k=2",
                  "disaggregated k=1", "disaggregated k=2", "ceiling (1 lane / 2 lanes)"],
                 "llllllll", rows)  # fmt: skip


def async_learning() -> list[str]:
    def slash(values, fmt="{:.3f}"):
        return " / ".join(fmt.format(v) for v in values)

    sync = table_records("quickstart.jsonl", "quickstart_seeds")
    m, ci = interval([gain_points(r) for r in sync])
    rows = [["synchronous, 3 seeds ([quickstart.md](quickstart.md))",
             "`jaxagent train configs/quickstart.yaml train.seed=S`",
             slash(r["figures"]["before"] for r in sync), slash(r["figures"]["after"] for r in sync),
             f"{m:+.1f} ± {ci:.1f} (95%)", "float rounding only (fp32)", "—"]]  # fmt: skip
    recs = [r for r in read_records("async_training.jsonl") if r.get("table") == "async_learning"]
    for run in dict.fromkeys(r["run"] for r in recs):
        rs = sorted((r for r in recs if r["run"] == run), key=lambda r: r["seed"])
        gains = [gain_points(r) for r in rs]
        m, ci = interval(gains)
        mism = [r["figures"].get("mismatch_mean_abs_median") for r in rs]
        mism_s = (slash(mism) if all(v is not None for v in mism)
                  else f"{mism[0]} (seed 0)")  # fmt: skip
        weights = [r["figures"].get("offpolicy_weight_mean") for r in rs]
        extra = rs[0]["command"].split("quickstart.yaml ", 1)[1].rsplit(" train.seed", 1)[0]
        rows.append([f"{run}, seeds {' / '.join(str(r['seed']) for r in rs)}",
                     f"`... {extra} train.seed=S`",
                     slash(r["figures"]["before"] for r in rs),
                     slash(r["figures"]["after"] for r in rs),
                     f"**{m:+.1f} ± {ci:.1f}** (95%; {slash(gains, '{:+.1f}')})", mism_s,
                     slash(weights) if all(w is not None for w in weights) else "—"])  # fmt: skip
    return table(["run", "command", "before", "after", "gain", "median `mismatch/mean_abs`",
                  "`offpolicy/weight_mean`"], "lllllll", rows)  # fmt: skip


def _partial(table_name: str, first: str) -> list[str]:
    rs = [r for r in read_records("async_training.jsonl") if r.get("table") == table_name]
    anchor = rs[0]["figures"]["s_per_iteration"]
    rows = []
    for r in rs:
        f = r["figures"]
        waited = "" if f["learner_waited_s"] is None else f"{f['learner_waited_s']:g} s"
        stale = f"{f['mean_staleness']:.2f}" if f["mean_staleness"] else "0"
        if 0 < f["mean_staleness"] < 1:
            stale = f"**{stale}**"
        rows.append([r["mode"], f"{f['s_per_iteration']:.2f}",
                     f"{f['s_per_iteration'] / anchor:.2f}x", waited, stale])  # fmt: skip
    return table([first, "s / iteration", "vs synchronous", "learner waited",
                  "mean staleness of the trained tokens"], "lllll", rows)  # fmt: skip


def async_partial_lockstep() -> list[str]:
    return _partial("async_partial_lockstep", "mode")


def async_partial_slots() -> list[str]:
    return _partial("async_partial_slots", "mode (slot engine)")


def async_k16() -> list[str]:
    rows = []
    for r in [r for r in read_records("async_training.jsonl") if r.get("table") == "async_k16"]:
        f = r["figures"]
        gain = f"**{gain_points(r):+.1f}**"
        if "best_val" in f:
            gain += f" (best validation {f['best_val']:.3f} at iteration {f['best_val_iter']})"
        extra = r["command"].split("quickstart.yaml", 1)[1].strip()
        mism = f.get("mismatch_note") or f"{f['mismatch_mean_abs_median']:.3f}"
        rows.append([r["run"], f"`... {extra}`" if extra else f"`{r['command']}`",
                     f"{f['before']:.3f}", f"{f['after']:.3f}", gain,
                     " / ".join(f"{v:.2f}" for v in f.get("val_every_10", [])), mism,
                     f"{f['offpolicy_weight_mean']:.3f}" if "offpolicy_weight_mean" in f else "—"])  # fmt: skip
    return table(["run", "command", "before", "after", "gain", "validation every 10 iterations",
                  "median `mismatch/mean_abs`", "`offpolicy/weight_mean`"], "llllllll", rows)  # fmt: skip


def web_rl_5seeds() -> list[str]:
    """configs.jsonl's web_quickstart runs joined with their SFT figures (web.jsonl)."""
    sft = {r["seed"]: r["figures"] for r in table_records("web.jsonl", "web_rl_5seeds_sft")}
    rs = sorted((r for r in read_records("configs.jsonl") if r["config"] == "web_quickstart"),
                key=lambda r: r["seed"])  # fmt: skip
    rows, gains = [], []
    for r in rs:
        s, f = r["summary"], sft[r["seed"]]
        gain = (s["success_after_rl"] - s["success_before_rl"]) * 100
        gains.append(gain)
        val = " / ".join(f"{v:.2f}" for _, v in r["curves"]["val"])
        rows.append([str(r["seed"]), f"{f['sft_loss']:.3f}", str(f["sft_s"]),
                     f"{s['success_before_rl']:.2f}", f"{s['success_after_rl']:.2f}",
                     f"{rint(gain):+d}", val, str(rint(s["wall_s"]))])  # fmt: skip
    m, ci = interval(gains)
    return [
        *table(
            [
                "seed",
                "SFT loss",
                "SFT s",
                "before RL",
                "after RL",
                "gain",
                "validation 0 / 10 / 20 / 30 / 32",
                "wall s",
            ],
            "rrrrrrlr",
            rows,
        ),  # fmt: skip
        "",
        f"Mean gain **{m:+.1f} points (95% t ± {ci:.1f})** over {len(rs)} seeds, every seed "
        f"{min(gains):+.0f} to {max(gains):+.0f}.",
    ]


def web_sft_starts() -> list[str]:
    rs = table_records("web.jsonl", "web_sft_starts")
    by = {(r["seed"], r["figures"]["microbatch_size"]): r["figures"]["start"] for r in rs}
    rows = [[str(s), f"{by[s, 2]:.2f}", f"{by[s, 4]:.2f}"] for s in sorted({k[0] for k in by})]
    return table(["seed", "start, microbatch 2 (shipped)", "start, microbatch 4"], "rrr", rows)


def web_sft_select() -> list[str]:
    sys.path.insert(0, str(ROOT / "experiments"))
    from web_sft_select import CANDIDATES, by_rate, common_seeds, selected, starts

    cells = starts()
    seeds = common_seeds(cells)
    if not seeds:
        return ["(no seed has every candidate yet)"]
    pick, rates = selected(cells), by_rate(cells, seeds)
    rows = []
    for lr in CANDIDATES:
        cs = rates[lr]
        m = sum(c["val"] for c in cs) / len(cs)
        held = " / ".join(f"{c['heldout']:.2f}" for c in cs) if lr == pick else "(not read)"
        rows.append([f"**{lr:g}** (selected)" if lr == pick else f"{lr:g}",
                     " / ".join(f"{c['val']:.2f}" for c in cs), f"{m:.3f}",
                     f"{min(c['val'] for c in cs):.2f}", held,
                     ", ".join(dict.fromkeys(f"{c['source']} at {c['commit']}" for c in cs))])  # fmt: skip
    return table(["sft.learning_rate", f"validation start, seeds {' / '.join(map(str, seeds))}",
                  "mean", "worst", "held-out start (selected rate only)", "records"],
                 "llrrll", rows)  # fmt: skip


def methods_vs_rl() -> list[str]:
    sys.path.insert(0, str(ROOT / "experiments"))
    from methods_vs_rl import table_lines

    return table_lines(json.loads((RESULTS / "methods_vs_rl.json").read_text()))


def configs_page() -> str:
    """configs.md, written whole by ``experiments/config_seeds.py --report``."""
    sys.path.insert(0, str(ROOT / "experiments"))
    import cells
    from config_seeds import markdown

    return markdown(cells.read_cells(RESULTS / "configs.jsonl"))


def loop_ablation_page() -> str:
    """loop_ablation.md, written whole by ``experiments/loop_ablation.py --report``."""
    sys.path.insert(0, str(ROOT / "experiments"))
    import cells
    import loop_ablation as la

    records = cells.read_cells(RESULTS / "loop_ablation.jsonl")
    return la.markdown(la.summarise(records), records)


# Pages an experiment runner writes whole from its records.
PAGES: dict[str, Callable[[], str]] = {
    "configs.md": configs_page,
    "loop_ablation.md": loop_ablation_page,
}

TABLES: dict[str, tuple[str, Callable[[], list[str]]]] = {
    "methods_vs_rl": ("methods_vs_rl.md", methods_vs_rl),
    "quickstart_seeds_wave0": ("quickstart.md", quickstart_seeds_wave0),
    "quickstart_seeds": ("quickstart.md", quickstart_seeds),
    "quickstart_reruns": ("quickstart.md", quickstart_reruns),
    "quickstart_seeds_f13b200": ("quickstart.md", quickstart_seeds_f13b200),
    "quickstart_seeds_trainer_parts": (
        "quickstart.md",
        lambda: quickstart_seeds_f13b200("quickstart_seeds_trainer_parts"),
    ),
    "engine_quickstart_seeds": ("rollout_engine.md", engine_quickstart_seeds),
    "engine_web_seed0": ("rollout_engine.md", engine_web_seed0),
    "harness_quickstart_seeds": ("serve.md", harness_quickstart_seeds),
    "serve_throughput": ("serve.md", serve_throughput),
    "quickstart_chatml_seeds": ("quickstart_chatml.md", quickstart_chatml_seeds),
    "grpo_math_seeds": ("math.md", grpo_math_seeds),
    "robot_loop_seeds": ("robot.md", robot_loop_seeds),
    "halfcheetah_ppo_seeds": ("robot.md", halfcheetah_ppo_seeds),
    "strict_tool_calls": ("strict_tool_calls.md", strict_tool_calls),
    "dqn_recipes": ("dqn_dialogue.md", dqn_recipes),
    "dqn_select": ("dqn_dialogue.md", dqn_select),
    "dqn_shipped_summary": ("dialogue.md", dqn_shipped_summary),
    "loop_dialogue_seeds": ("dialogue.md", loop_dialogue_seeds),
    "web_health": ("web.md", web_health),
    "soak_default": ("pool_and_faults.md", soak_default),
    "soak_allocators": ("pool_and_faults.md", soak_allocators),
    "async_speedup_quiet": ("async_training.md", async_speedup_quiet),
    "async_lanes": ("async_training.md", async_lanes),
    "async_speedup_full": ("async_training.md", async_speedup_full),
    "async_learning": ("async_training.md", async_learning),
    "async_partial_lockstep": ("async_training.md", async_partial_lockstep),
    "async_partial_slots": ("async_training.md", async_partial_slots),
    "async_k16": ("async_training.md", async_k16),
    "web_rl_5seeds": ("web.md", web_rl_5seeds),
    "web_sft_starts": ("web.md", web_sft_starts),
    "web_sft_select": ("web.md", web_sft_select),
    "bfcl_gen_seeds": ("bfcl_gen.md", bfcl_gen_seeds),
    "bfcl_gen_ablation_seed1": ("bfcl_gen.md", bfcl_gen_ablation_seed1),
    "bfcl_gen_seeds_f8045ed": ("bfcl_gen.md", bfcl_gen_seeds_f8045ed),
    "bfcl_gen_restarts_fbec46a": ("bfcl_gen.md", bfcl_gen_restarts_fbec46a),
    "bfcl_gen_heads8_121e283": ("bfcl_gen.md", bfcl_gen_heads8_121e283),
    "bfcl_gen_heads8_trend": ("bfcl_gen.md", bfcl_gen_heads8_trend),
}


# ----------------------------------------------------------------------------- pages


def render_page(text: str) -> tuple[str, list[str]]:
    """The page with every table block regenerated; and the names of unknown blocks."""
    unknown = []

    def sub(m: re.Match) -> str:
        name = m.group(2)
        if name not in TABLES:
            unknown.append(name)
            return m.group(0)
        return m.group(1) + "\n".join(TABLES[name][1]()) + "\n" + m.group(4)

    return BLOCK.sub(sub, text), unknown


def blocks(text: str) -> dict[str, str]:
    return {m.group(2): m.group(3) for m in BLOCK.finditer(text)}


def check() -> list[str]:
    """Problems: a table whose page lacks its block, an unknown block, a block that differs."""
    problems = []
    for page in sorted({p for p, _ in TABLES.values()}):
        text = (RESULTS / page).read_text()
        have = blocks(text)
        for name, (p, render) in TABLES.items():
            if p != page:
                continue
            if name not in have:
                problems.append(f"{page}: no <!-- table:{name} --> block")
            elif have[name] != "\n".join(render()) + "\n":
                problems.append(f"{page}: table {name} differs from its records")
        problems += [f"{page}: unknown table {n}" for n in have if n not in TABLES]
    for page, render in PAGES.items():
        if (RESULTS / page).read_text() != render():
            problems.append(f"{page} differs from its records (its runner's --report)")
    return problems


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="compare only; exit 1 on a difference")
    args = p.parse_args(argv)
    if args.check:
        problems = check()
        for line in problems:
            print(line)
        return 1 if problems else 0
    for page in sorted({p for p, _ in TABLES.values()}):
        path = RESULTS / page
        text, unknown = render_page(path.read_text())
        if unknown:
            print(f"{page}: unknown tables {unknown}", file=sys.stderr)
            return 2
        path.write_text(text)
    for page, render in PAGES.items():
        (RESULTS / page).write_text(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
