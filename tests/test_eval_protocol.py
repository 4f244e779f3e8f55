"""eval/protocol.py, tables, plots and compare on constructed episode sets with known answers."""

import json

import numpy as np
import pytest

from jaxagent.agents.episode import Episode, Turn
from jaxagent.envs.base import Task, Termination
from jaxagent.eval import protocol, provenance
from jaxagent.eval.compare import RecordError, compare_records, load_record
from jaxagent.eval.protocol import EvalGroup, Prices, build_record
from jaxagent.eval.report import summarize

PROMPT, ACT, OBS = 5, 3, 4


def _ep(task, success, turns=1, failure=None, env_error=False, dangerous=(), group=0):
    """An episode of ``turns`` turns: PROMPT prompt tokens, then ACT policy tokens and OBS
    observation tokens per turn (none after the last)."""
    ep = Episode(task=Task(task, "test", "p"), group=group)
    ep.append(range(PROMPT), sampled=False)
    for i in range(turns):
        last = i == turns - 1
        ep.append(range(ACT), sampled=True, logprobs=[0.0] * ACT, turn=i)
        if not last:
            ep.append(range(OBS), sampled=False)
        ep.turns.append(
            Turn(
                "a",
                "" if last else "o",
                float(success and last),
                num_action_tokens=ACT,
                num_observation_tokens=0 if last else OBS,
                dangerous=list(dangerous) if last else [],
            )
        )
    if env_error:
        ep.finish(Termination.ENV_ERROR, error="boom")
    else:
        ep.finish(Termination.TERMINATED, failure, success=success)
    return ep


def _one_run():
    return [
        _ep("t0", True, 2, group=0),
        _ep("t0", False, 3, "wrong_tool", dangerous=["cancel"], group=0),
        _ep("t1", False, 2, "wrong_args", group=1),
        _ep("t1", True, 1, group=1),
        _ep("t2", False, 1, env_error=True, group=2),
        _ep("t2", False, 1, group=2),  # no label -> "unlabelled"
    ]


def test_record_on_a_constructed_set_has_the_known_figures():
    eps = _one_run()
    rec = build_record(
        [EvalGroup(eps, seconds=3.0)], prices=Prices(input_per_mtok=1.0, output_per_mtok=2.0)
    )
    s = rec["success"]
    assert s["mean"] == pytest.approx(2 / 5) and rec["episodes"] == 6 and rec["env_errors"] == 1
    assert s["ci_method"].startswith("bootstrap over tasks") and s["tasks"] == 3
    # tasks solved 1/2, 1/2, 0/1: a resample of tasks has a rate in [0, 1/2]
    assert 0.0 <= s["ci_low"] <= 0.4 <= s["ci_high"] <= 0.5
    # IQM of the task scores (1/2, 1/2, 0): 3 scores, none dropped -> their mean
    assert s["iqm"] == pytest.approx(1 / 3)
    assert rec["avg_steps"] == pytest.approx((2 + 3 + 2 + 1 + 1) / 5)
    assert rec["avg_steps_successes"] == pytest.approx((2 + 1) / 2)
    assert rec["failure_modes"] == {"unlabelled": 1, "wrong_args": 1, "wrong_tool": 1}
    assert rec["failure_mode_rates"]["wrong_tool"] == pytest.approx(1 / 5)
    assert rec["safety_violations"] == 1 and rec["dangerous_actions"] == {"cancel": 1}
    r = rec["retries_until_success"]
    assert r["mean_samples_to_first_success"] == 1.5  # t0 at sample 1, t1 at sample 2
    assert r["solved_fraction"] == pytest.approx(2 / 3) and r["samples_per_task"] == 2
    assert rec["pass_at_k"] == {"pass@1": pytest.approx((0.5 + 0.5 + 0.0) / 3)}
    # The figures the trainer reports agree with report.summarize.
    rep = summarize(eps)
    assert (rep.success, rep.avg_steps, rep.dangerous_actions) == (
        s["mean"],
        rec["avg_steps"],
        rec["safety_violations"],
    )
    assert rep.failure_modes == rec["failure_modes"]
    # Tokens: every episode has PROMPT prompt tokens, ACT per turn, OBS between turns.
    turns = [2, 3, 2, 1, 1, 1]
    t = rec["tokens"]
    assert t["prompt"] == PROMPT * 6
    assert t["generated"] == ACT * sum(turns)
    assert t["observation"] == OBS * sum(n - 1 for n in turns)
    assert t["input_stateless"] == sum(PROMPT * n + (ACT + OBS) * n * (n - 1) // 2 for n in turns)
    assert t["per_task"]["generated"] == pytest.approx(ACT * sum(turns) / 3)
    expected = ((t["prompt"] + t["observation"]) * 1.0 + t["generated"] * 2.0) / 1e6
    assert rec["cost_usd"] == pytest.approx(expected)
    assert rec["wall_time"] == {"seconds": 3.0, "per_task_s": 1.0}
    assert rec["scores"]["tasks"] == ["t0", "t1", "t2"]
    assert rec["scores"]["matrix"] == [[0.5, 0.5, 0.0]]
    assert rec["generalisation"] is None


def test_token_counts_of_one_episode():
    assert protocol.episode_tokens(_ep("t", True, 3)) == {
        "prompt": PROMPT,
        "observation": 2 * OBS,
        "generated": 3 * ACT,
        "input_stateless": PROMPT + (PROMPT + ACT + OBS) + (PROMPT + 2 * (ACT + OBS)),
    }
    with pytest.raises(ValueError, match="price"):
        Prices(input_per_mtok=-1.0)


def _run_groups(rates, tasks=4, samples=2, split="test", seed=0):
    """One group per run; run r solves task j's samples with probability rates[r]."""
    rng = np.random.default_rng(seed)
    groups = []
    for r, p in enumerate(rates):
        eps = [
            _ep(f"t{j}", bool(rng.random() < p), 1, None if rng.random() < p else "x", group=j)
            for j in range(tasks)
            for _ in range(samples)
        ]
        groups.append(EvalGroup(eps, run=f"seed{r}", split=split, seconds=1.0))
    return groups


def test_multi_run_record_uses_the_stratified_bootstrap_and_the_seed_interval():
    groups = _run_groups([0.2, 0.5, 0.8], tasks=6)
    rec = build_record(groups, reps=500)
    s = rec["success"]
    assert s["ci_method"] == "stratified bootstrap over training runs within tasks"
    assert rec["runs"] == ["seed0", "seed1", "seed2"] and set(s["per_run"]) == set(rec["runs"])
    assert s["over_runs"]["n"] == 3 and "over_eval_seeds" not in s  # one eval seed each
    assert s["mean"] == pytest.approx(np.mean(list(s["per_run"].values())))
    assert s["ci_low"] <= s["mean"] <= s["ci_high"]
    assert np.asarray(rec["scores"]["matrix"]).shape == (3, 6)
    # Several evaluation seeds of one run: tasks resampled (with all seeds' episodes), and
    # the spread between evaluation seeds reported.
    one = [EvalGroup(g.episodes, run="seed0", eval_seed=i) for i, g in enumerate(groups)]
    s1 = build_record(one, reps=200)["success"]
    assert s1["ci_method"].startswith("bootstrap over tasks") and s1["tasks"] == 6
    assert s1["over_eval_seeds"]["n"] == 3 and "over_runs" not in s1
    assert s1["over_eval_seeds"]["mean"] == pytest.approx(np.mean(list(s["per_run"].values())))


def test_generalisation_gap_in_distribution_minus_held_out():
    held = [EvalGroup([_ep("a", True), _ep("b", False, failure="x")], split="test")]
    ind = [EvalGroup([_ep("c", True), _ep("d", True)], split="val")]
    rec = build_record(held + ind, reps=500)
    assert rec["split"] == "test" and rec["success"]["mean"] == 0.5
    assert rec["splits"]["val"]["success"]["mean"] == 1.0
    g = rec["generalisation"]
    assert g["in_distribution"] == 1.0 and g["held_out"] == 0.5 and g["gap"] == 0.5
    assert g["gap_ci_low"] <= 0.5 <= g["gap_ci_high"]


def test_write_outputs_and_compare(tmp_path):
    prov = provenance.provenance(
        config_yaml="a: 1\n",
        model={"init_from": ""},
        train_seeds=[0],
        eval_seeds=[0, 1],
        env="quickstart",
    )
    assert (
        prov["config_hash"] == provenance.config_hash("a: 1\n") and len(prov["config_hash"]) == 16
    )
    assert {"jax", "flax", "optax", "transformers", "jaxagent"} <= set(prov["packages"])
    assert prov["packages"]["jax"]  # installed here
    a = build_record(_run_groups([0.2, 0.3], tasks=8, seed=1), provenance=prov, reps=300)
    b = build_record(_run_groups([0.8, 0.9], tasks=8, seed=2), provenance=prov, reps=300)
    paths = protocol.write_outputs(a, tmp_path / "a")
    protocol.write_outputs(b, tmp_path / "b")
    names = sorted(p.name for p in paths)
    assert names == [
        "cost_vs_success.png",
        "eval.json",
        "eval.md",
        "failure_modes.png",
        "success.png",
    ]
    assert all(p.stat().st_size > 0 for p in paths)
    rec = json.loads((tmp_path / "a" / "eval.json").read_text())
    for key in ("mean", "ci_low", "ci_high", "iqm"):
        assert isinstance(rec["success"][key], float)
    for key in ("avg_steps", "failure_modes", "safety_violations", "cost_usd", "provenance"):
        assert key in rec
    assert isinstance(rec["tokens"]["prompt"], int) and isinstance(rec["tokens"]["generated"], int)
    md = (tmp_path / "a" / "eval.md").read_text()
    assert "| split |" in md and "success [95% CI]" in md and prov["config_hash"] in md
    cmp = compare_records(
        load_record(tmp_path / "a" / "eval.json"), load_record(tmp_path / "b" / "eval.json")
    )
    d, p = cmp["difference"], cmp["probability_of_improvement"]
    assert d["value"] == pytest.approx(cmp["b"]["success"] - cmp["a"]["success"]) and d["value"] > 0
    assert d["ci_low"] <= d["value"] <= d["ci_high"]
    assert p["value"] > 0.5 and p["ci_low"] <= p["value"] <= p["ci_high"] and p["tasks"] == 8
    assert p["method"] == "stratified bootstrap over runs within tasks"
    with pytest.raises(RecordError, match="does not exist"):
        load_record(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(RecordError, match="not an eval record"):
        load_record(tmp_path / "bad.json")


def test_a_set_of_env_errors_only_has_no_interval_and_still_writes(tmp_path):
    eps = [_ep("a", False, env_error=True), _ep("b", False, env_error=True)]
    rec = build_record([EvalGroup(eps)])
    s = rec["success"]
    assert rec["env_errors"] == 2 and s["episodes"] == 0 and s["tasks"] == 0
    assert s["ci_low"] is None and s["iqm"] is None and rec["pass_at_k"] == {}
    paths = protocol.write_outputs(rec, tmp_path)
    assert json.loads(paths[0].read_text())["success"]["ci_high"] is None
    with pytest.raises(ValueError, match="at least one evaluation"):
        build_record([])


def test_compare_single_runs_bootstraps_the_tasks():
    a = build_record(_run_groups([0.0], tasks=5), reps=200)  # never solves
    b = build_record(_run_groups([1.0], tasks=5), reps=200)  # always solves
    cmp = compare_records(a, b)
    d, p = cmp["difference"], cmp["probability_of_improvement"]
    assert d == {"value": 1.0, "ci_low": 1.0, "ci_high": 1.0, "method": d["method"]}
    assert p["value"] == 1.0 and p["method"] == "bootstrap over tasks" and p["tasks"] == 5
    assert compare_records(b, a)["probability_of_improvement"]["value"] == 0.0
    assert compare_records(a, a)["probability_of_improvement"]["value"] == 0.5
    c = build_record([EvalGroup([_ep("other", True)])], reps=50)  # no task in common with a
    with pytest.raises(RecordError, match="share no evaluated task"):
        compare_records(a, c)


def test_failure_details_keep_the_web_sites_own_labels():
    """The sites label a failed purchase wrong_item / wrong_option / wrong_action /
    dangerous_action, all ``wrong_state`` project-wide: the report keeps both."""
    import collections

    from jaxagent.envs.web.env import WebEnv
    from jaxagent.envs.base import run_episode
    from jaxagent.envs.web.expert import ExpertPolicy
    from jaxagent.envs.web.tasks import WebWorld
    from jaxagent.eval.tables import record_markdown

    tasks = WebWorld("shop", num_train=1, num_test=60, test_layouts=5, name_item=True)
    env = WebEnv(landing="search")
    eps, want = [], collections.Counter()
    for i, task in enumerate(tasks.tasks("test")):
        policy = ExpertPolicy(task, 0.9, np.random.default_rng(i))
        _, _, last = run_episode(env, task, policy.act)
        ep = _ep(task.id, last.info["success"], failure=last.info["failure_mode"], group=i)
        ep.info = last.info
        eps.append(ep)
        if not last.info["success"]:
            want[last.info["failure_detail"]] += 1
    assert {"wrong_item", "wrong_option", "dangerous_action"} <= set(want), want
    rep = summarize(eps)
    rec = build_record([EvalGroup(eps, seconds=1.0)], prices=Prices())
    assert rep.failure_details == rec["failure_details"] == dict(want)
    purchase = sum(want[k] for k in ("wrong_item", "wrong_option", "wrong_action", "over_budget"))
    assert rep.failure_modes["wrong_state"] == purchase + want["dangerous_action"]
    metrics = rep.as_metrics("eval")
    assert metrics["eval/failure_detail/dangerous_action"] == want["dangerous_action"]
    assert "in detail" in rep.failures_text() and "dangerous_action" in record_markdown(rec)
    assert (
        "(dangerous_action)"
        in next(e for e in eps if e.failure_detail == "dangerous_action").render()
    )
    # environments without detail labels report none
    assert summarize(_one_run()).failure_details == {}
    assert "in detail" not in summarize(_one_run()).failures_text()
