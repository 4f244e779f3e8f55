"""The experiment runners' own logic, without training: every ablation cell's config loads
(a misspelt override would only surface hours into a run), the results file is resumable
(a torn last line is skipped, finished cells are not rerun), and the report's verdicts follow
the paired intervals."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT / "experiments"))

import cells as C  # noqa: E402
import loop_ablation as LA  # noqa: E402

from jaxagent.train.config import load_config  # noqa: E402


@pytest.mark.parametrize("world", sorted(LA.WORLDS))
def test_every_cell_config_loads_and_differs_from_loop_in_its_named_respect(world, tmp_path):
    w = LA.WORLDS[world]
    loaded = {}
    for name, variant in LA.VARIANTS.items():
        over = LA.cell_overrides(w, variant, 0, tmp_path, f"{world}/{name}")
        cfg = load_config(ROOT / w.config, over)
        assert cfg.rollout.tasks_per_iteration * cfg.group_size == w.batch
        loaded[name] = cfg
    rl = {name: cfg.rl_config for name, cfg in loaded.items()}
    base = rl["loop_token"]
    assert rl["loop_turn"].loss.ratio_level == "turn"
    assert rl["loop_trajectory"].loss.ratio_level == "trajectory"
    assert rl["loop_std"].advantage.estimator == "group_normalized"
    assert rl["loop_kl"].kl.mode == "loss" and base.kl.mode == "none"
    rloo = rl["rloo"]
    assert (rloo.loss.policy, rloo.update.num_epochs, rloo.update.minibatch_size) == (
        "reinforce",
        1,
        w.batch,
    )
    assert rl["ppo"].critic.enabled and loaded["ppo"].model.value_head
    assert rl["rft"].advantage.filter_reward
    gigpo, grpo = rl["gigpo"], rl["grpo"]
    assert gigpo.advantage.estimator == "gigpo" and gigpo.needs_turns
    # GiGPO is GRPO plus the step term: nothing else differs.
    assert gigpo.replace(advantage=grpo.advantage) == grpo
    # The shared schedule: learning rate and sample budget of the world's LOOP config.
    for name, cfg in loaded.items():
        assert rl[name].optim.learning_rate == base.optim.learning_rate, name
        assert cfg.train.iterations == loaded["loop_token"].train.iterations, name


def _record(world, variant, seed, success, tasks, cpu="test cpu"):
    return {
        "world": world,
        "variant": variant,
        "seed": seed,
        "summary": {"success_before_rl": 0.4, "success_after_rl": success},
        "eval": {"success": success, "tasks": tasks, "seconds": 1.0},
        "curves": {"train": [[1, 0.5], [2, success]], "val": [], "test": []},
        "train_s": 10.0,
        "machine": {"cpu": cpu, "cores": 2},
    }


def test_results_file_resumes_and_report_verdicts(tmp_path):
    path = tmp_path / "r.jsonl"
    rng = np.random.default_rng(0)
    for seed in range(3):
        for variant, p in (("loop_token", 0.8), ("loop_turn", 0.5), ("loop_std", 0.79)):
            wins = rng.random(20) < p
            tasks = {f"t{i}": [2, 2 * int(w)] for i, w in enumerate(wins)}
            success = float(np.mean([c / n for n, c in tasks.values()]))
            C.append_cell(path, _record("quickstart", variant, seed, success, tasks))
    with open(path, "a") as f:
        f.write('{"world": "quickstart", "variant": "rl')  # a kill mid-write
    records = C.read_cells(path)
    assert len(records) == 9
    assert ("quickstart", "loop_turn", 2) in {C.cell_key(r, LA.KEY) for r in records}
    s = LA.summarise_world(records, "quickstart")
    verdicts = {(o["better"], o["worse"]): o["verdict"] for o in s["orderings"]}
    assert verdicts[("loop_token", "loop_turn")].startswith("reproduced")
    assert "contains 0" in verdicts[("loop_token", "loop_std")]
    row = s["variants"]["loop_token"]
    assert row["pass_at_k"]["pass@2"] >= row["pass_at_k"]["pass@1"]
    assert LA.summarise(records)["quickstart"]["orderings"] == s["orderings"]
    md = LA.markdown(LA.summarise(records), records)
    assert "| LOOP (token) | 3 |" in md and "test cpu (2 cores)" in md
    LA.plot_world(records, "quickstart", tmp_path / "curves.png")
    assert (tmp_path / "curves.png").stat().st_size > 0
    json.dumps(s)  # the JSON file's content


def test_cells_from_two_cpu_models_are_never_paired_or_counted_done(tmp_path):
    # Seed 0's LOOP cell on one CPU and its GRPO cell on another: no paired ordering may mix
    # them, each CPU model gets its own table and plot, and a run on the second CPU still
    # has LOOP (token) seed 0 to do.
    tasks = {f"t{i}": [1, i % 2] for i in range(10)}
    records = [
        _record("quickstart", "loop_token", 0, 0.5, tasks, cpu="Intel(R) Xeon(R) Processor"),
        _record("quickstart", "loop_token", 1, 0.5, tasks, cpu="Intel(R) Xeon(R) Processor"),
        _record("quickstart", "grpo", 0, 0.5, tasks, cpu="AMD EPYC"),
        _record("quickstart", "grpo", 1, 0.5, tasks, cpu="AMD EPYC"),
    ]
    assert LA.tables(records) == {
        "quickstart on Intel(R) Xeon(R) Processor": ("quickstart", "Intel(R) Xeon(R) Processor"),
        "quickstart on AMD EPYC": ("quickstart", "AMD EPYC"),
    }
    summary = LA.summarise(records)
    assert all(not s["orderings"] for s in summary.values())
    assert set(summary["quickstart on AMD EPYC"]["variants"]) == {"grpo"}
    todo = LA.todo_cells(records, ["quickstart"], [0], ["loop_token", "grpo"], "AMD EPYC")
    assert todo == [("quickstart", "loop_token", 0)]
    assert [LA.slug(n) for n in summary] == ["quickstart_intel_xeon", "quickstart_amd_epyc"]
    md = LA.markdown(summary, records)
    assert "## quickstart on AMD EPYC (" in md and "loop_ablation_quickstart_amd_epyc.png" in md
    # One CPU model: the table keeps the world's name.
    assert list(LA.tables(records[:2])) == ["quickstart"]
    # The report draws one plot a table; when the world splits by CPU its one-table plot goes.
    path = tmp_path / "r.jsonl"
    for r in records[:2]:
        C.append_cell(path, r)
    LA.report(path)
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["r_quickstart.png"]
    for r in records[2:]:
        C.append_cell(path, r)
    LA.report(path)
    names = sorted(p.name for p in tmp_path.glob("*.png"))
    assert names == ["r_quickstart_amd_epyc.png", "r_quickstart_intel_xeon.png"]


def test_methods_vs_rl_arms_parse_and_report(tmp_path):
    import argparse

    import methods_vs_rl as MR

    from jaxagent.agents.methods.config import load_method

    for name in MR.ORDER:
        method = MR.ARMS[name][2]
        if method is not None:
            load_method(str(ROOT / "configs" / "methods" / f"{method}.yaml"))
    sft, out = tmp_path / "run", tmp_path / "evals"
    (sft / "checkpoints" / "0").mkdir(parents=True)
    args = argparse.Namespace(
        sft_run=sft, rl_run=tmp_path / "rl", rl_step="latest", num_tasks=0, out=out
    )
    # A run with only the SFT checkpoint has no same-start RL arm; the others all apply.
    assert MR.command("rl_same", args, tmp_path) is None
    cmd = MR.command("argname+reflexion", args, tmp_path)
    assert cmd[cmd.index("--policy") + 1] == "argname"
    assert cmd[cmd.index("--method") + 1] == "configs/methods/reflexion.yaml"
    for name, success, total in (("sft", 0.4, 3000), ("sft+reflexion", 0.5, 9000)):
        (out / name).mkdir(parents=True)
        ev = {
            "success": {"mean": success, "ci_low": success - 0.05, "ci_high": success + 0.05},
            "episodes": 100,
            "avg_steps": 2.5,
            "tokens": {"total": total, "generated": total // 3, "input": total - total // 3},
            "cost_usd": 0.002,
            "provenance": {"step": 0, "checkpoint": str(sft)},
        }
        (out / name / "eval.json").write_text(json.dumps(ev))
    (out / "sft+dfsdt").mkdir()
    (out / "sft+dfsdt" / "run.json").write_text(json.dumps({"rc": 1, "error": "boom"}))
    rows = [MR.arm_row(n, out) for n in ("sft", "sft+reflexion", "sft+dfsdt")]
    assert rows[1]["tokens_per_episode"] == 90 and rows[1]["cost_usd_per_episode"] == 2e-5
    md = MR.markdown(rows, args, 12.0, "kept paragraph")
    assert "| SFT + Reflexion (3 attempts) | 0.500 [0.450, 0.550] | 2.50 | 90 |" in md
    assert "failed (exit 1): boom" in md and md.rstrip().endswith("kept paragraph")
    assert MR.kept_reading(_write(tmp_path / "p.md", md)).strip() == "kept paragraph"
    MR.plot(rows, tmp_path / "m.png")
    assert (tmp_path / "m.png").stat().st_size > 0


def _write(path, text):
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "config, variant", [("ppo_tools", "ppo"), ("rloo_tools", "rloo"), ("rft_tools", "rft")]
)
def test_recipe_configs_are_their_ablation_cells(config, variant, tmp_path):
    """configs/{ppo,rloo,rft}_tools.yaml state the ablation's measured figures: they must
    stay the configs those cells train."""
    import dataclasses

    world = LA.WORLDS["quickstart"]
    cell = load_config(
        ROOT / world.config, LA.cell_overrides(world, LA.VARIANTS[variant], 0, tmp_path, "x")
    )
    shipped = load_config(ROOT / "configs" / f"{config}.yaml")

    def comparable(c):
        d = dataclasses.asdict(c)
        for key in ("name", "paper"):
            d.pop(key)
        for section, key in (
            ("train", "out_dir"),
            ("train", "seed"),
            ("train", "progress"),
            ("train", "keep_checkpoints"),
        ):
            d[section].pop(key)
        d["sft"].pop("cache_dir")
        return d

    assert comparable(shipped) == comparable(cell)
    assert shipped.rl_config == cell.rl_config
