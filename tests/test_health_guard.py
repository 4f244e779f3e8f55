"""The learning-health guard: a run whose train success falls, or whose entropy or KL run
away, says so in words in its log and in ``summary.json`` (``health``); a healthy run does not.

A toy one-turn world: the reply succeeds when it avoids the word "no" (a random policy of 9
words and 6 tokens succeeds about half the time: a decent start). The collapsing run is paid
for the opposite of success (a mis-specified reward), so LOOP, correctly ascending its reward,
drives train success down; the healthy run is paid for success and raises it.
"""

import json

import pytest

from jaxagent.envs.base import StepResult, Task
from jaxagent.envs.registry import EnvSpec, env_names, register_env
from jaxagent.train.config import load_config
from jaxagent.train.guards import GuardSection, UpdateGuard, learning_health
from jaxagent.train.metrics_log import read_jsonl

WORDS = ["no", "yes", "maybe", "red", "blue", "one", "two", "ok"]


class AvoidNo:
    """One turn; success: the reply has no "no". ``inverted``: the reward is 1 - success."""

    inverted = False

    def reset(self, task):
        return f"say {task.data['word']}"

    def step(self, action):
        ok = "no" not in action.split()
        reward = float(ok != self.inverted)
        return StepResult("", reward, True, {"success": ok, "failure_mode": None})

    def close(self):
        pass


class Inverted(AvoidNo):
    inverted = True


class _Source:
    def splits(self):
        return ("train", "test")

    def tasks(self, split):
        return [
            Task(id=f"{split}-{i}", split=split, prompt="", data={"word": WORDS[i % 8]})
            for i in range(64 if split == "train" else 16)
        ]


def _spec(env):
    return lambda options: EnvSpec(
        name="avoid_no",
        make_source=_Source,
        make_env=env,
        system_prompt="",
        vocabulary=lambda: WORDS + ["say"],
    )


def _run(tmp_path, env_name):
    for name, env in (("avoid_no", AvoidNo), ("avoid_no_inverted", Inverted)):
        if name not in env_names():
            register_env(name, _spec(env))
    config = load_config(
        None,
        [
            "name=health",
            f"env.name={env_name}",
            "env.pool.backend=inline",
            "model.hidden_size=32",
            "model.num_layers=1",
            "model.num_heads=2",
            "model.num_kv_heads=1",
            "model.intermediate_size=64",
            "model.max_seq_len=64",
            "rollout.tasks_per_iteration=8",
            "rollout.samples_per_task=4",
            "rollout.max_turns=1",
            "rollout.max_new_tokens=6",
            "rl.recipe=loop",
            "rl.lora.rank=0",
            "rl.optim.learning_rate=0.01",
            "rl.update.minibatch_size=16",
            "eval.num_tasks=8",
            "eval.every=0",
            "train.iterations=10",
            "guards.health_window=4",
            "train.checkpoint_every=0",
            "train.progress=none",
            "train.tensorboard=false",
            "train.plot=false",
            f"train.out_dir={tmp_path}/{env_name}",
        ],
    )
    from jaxagent.train.trainer import Trainer

    lines = []
    summary = Trainer(config, echo=lines.append).run()
    saved = json.loads((tmp_path / env_name / "summary.json").read_text())
    records = read_jsonl(tmp_path / env_name / "metrics.jsonl")
    success = [r["train/success"] for r in records if "train/success" in r]
    return summary, saved, lines, success


@pytest.mark.slow  # two short runs, about a minute
def test_a_collapsing_run_is_reported_and_a_healthy_run_is_not(tmp_path):
    summary, saved, lines, success = _run(tmp_path, "avoid_no_inverted")
    assert sum(success[:4]) / 4 > 0.3 and sum(success[-4:]) / 4 < sum(success[:4]) / 4 - 0.15
    assert saved["health"] == summary["health"] and len(saved["health"]) >= 1
    assert any(s.startswith("train success fell from") for s in saved["health"])
    assert "learning_rate" in saved["health"][0]  # a likely fix is named
    assert any(line.startswith("[health] iteration") for line in lines)  # in the log, live
    summary, saved, lines, success = _run(tmp_path, "avoid_no")
    assert sum(success[-4:]) / 4 > sum(success[:4]) / 4  # it learns
    assert saved["health"] == [] and not any("[health]" in line for line in lines)


def _rows(success, entropy=None, kl=None):
    out = []
    for i, s in enumerate(success):
        r = {"step": i + 1, "train/success": s}
        if entropy:
            r["entropy/mean"] = entropy[i]
        if kl:
            r["kl/approx_old_new"] = kl[i]
        out.append(r)
    return out


def test_learning_health_names_each_symptom_and_spares_noise():
    g = GuardSection(health_window=5)
    # the loop_bfcl seed-0 curve (docs/results/configs.jsonl): 0.48 -> 0.26
    bfcl = [0.65, 0.63, 0.38, 0.44, 0.29, 0.54, 0.21, 0.29, 0.33, 0.35]
    bfcl += [0.21, 0.25, 0.19, 0.15, 0.25, 0.13, 0.25, 0.35, 0.27, 0.33]
    found = learning_health(_rows(bfcl), [], g)
    assert list(found) == ["train_success"]
    assert "fell from 0.48 (iterations 1-5) to 0.27 (iterations 16-20)" in found["train_success"]
    # a rising, a flat-but-noisy and a too-short curve are not symptoms
    assert learning_health(_rows([0.2, 0.3, 0.3, 0.4, 0.4, 0.5, 0.6, 0.6, 0.7, 0.8]), [], g) == {}
    noisy = [0.5, 0.2, 0.7, 0.3, 0.6, 0.4, 0.3, 0.5, 0.2, 0.5]
    assert learning_health(_rows(noisy), [], g) == {}
    assert learning_health(_rows([0.9, 0.9, 0.1]), [], g) == {}
    # entropy and KL that run away
    flat = [0.5] * 10
    ent = [0.3] * 5 + [0.5, 0.8, 1.2, 1.5, 2.0]
    kl = [1e-3] * 5 + [0.01, 0.05, 0.1, 0.2, 0.3]
    found = learning_health(_rows(flat, ent, kl), [], g)
    assert set(found) == {"entropy", "kl"}
    assert "guards.health_entropy_factor=3" in found["entropy"]
    assert "kl_stop" in found["kl"]
    # held-out success falling at two consecutive evaluations; one dip is not a symptom
    assert set(learning_health([], [(0, 0.4), (5, 0.3), (10, 0.2)], g)) == {"eval_success"}
    assert learning_health([], [(0, 0.4), (5, 0.3), (10, 0.35)], g) == {}
    assert learning_health(_rows(bfcl), [], GuardSection(health_window=0)) == {}


def test_update_guard_reports_a_symptom_once_as_it_appears():
    lines = []
    guard = UpdateGuard(GuardSection(health_window=3), None, lines.append)
    curve = [0.8, 0.8, 0.7, 0.4, 0.3, 0.2, 0.2, 0.1]
    for i, s in enumerate(curve, start=1):
        m = guard.check(i, {"optim/steps": 2.0, "train/success": s, "optim/grad_norm": 1.0})
    assert m["guard/health"] == 1
    health = [line for line in lines if line.startswith("[health]")]
    assert len(health) == 1 and health[0].startswith("[health] iteration 6: train success fell")
