"""Trainer: exact resume after SIGKILL, CLI eval/export/rollout on the resulting checkpoint.

A tiny quickstart run (1-layer model with a critic head, PPO so that every iteration trains
even when no episode succeeds, 4 tasks an iteration) is run twice: once
uninterrupted in-process, once as a ``jaxagent train`` subprocess killed with SIGKILL right
after its iteration-2 checkpoint and then restarted. The restarted run must log exactly the
same metrics (losses, rewards, clip fractions, eval success...) for iterations 3 and 4.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from jaxagent.cli.main import main as cli_main
from jaxagent.train.config import load_config
from jaxagent.train.metrics_log import read_jsonl

ROOT = Path(__file__).parent.parent
TINY = [
    "model.hidden_size=32",
    "model.num_layers=1",
    "model.num_heads=2",
    "model.num_kv_heads=1",
    "model.intermediate_size=64",
    "model.max_seq_len=160",
    "env.options.num_train=40",
    "env.options.num_test=4",
    "rl.recipe=ppo",
    "model.value_head=true",
    "rollout.tasks_per_iteration=4",
    "rollout.samples_per_task=1",
    "rollout.max_turns=2",
    "rollout.max_new_tokens=8",
    "rl.update.minibatch_size=4",
    "rl.optim.learning_rate=0.01",
    "sft.num_demos=8",
    "sft.steps=3",
    "sft.batch_size=2",
    "sft.microbatch_size=1",  # the learner options of small models on CPU (web quickstart)
    "rl.update.remat=false",
    "rl.data.length_multiple=40",
    "eval.num_tasks=4",
    "eval.every=2",
    "eval.val_tasks=4",
    "train.iterations=4",
    "train.checkpoint_every=1",
    "train.progress=none",
    "train.tensorboard=false",
    "train.plot=false",
]
# Wall-clock figures differ between runs; everything else must match exactly.
NONDETERMINISTIC = ("time/", "tokens/per_s", "env_health/", "sampler/recompiles", "sft/time_s")


def _deterministic(record):
    return {k: v for k, v in record.items() if not k.startswith(NONDETERMINISTIC)}


def _by_step(path):
    out = {}
    for r in read_jsonl(path):
        out.setdefault(r["step"], {}).update(_deterministic(r))
    return out


@pytest.fixture(scope="module")
def runs(tiny_quickstart_run):
    """One uninterrupted quickstart run: (run dir, summary), shared with
    tests/test_run_integrity.py (tests/conftest.py trains it once a session)."""
    return tiny_quickstart_run


def test_reference_run_trains_on_samples_and_pads_to_the_length_multiple(runs):
    ref = _by_step(runs[0] / "metrics.jsonl")
    assert sorted(ref) == [0, 1, 2, 3, 4]
    for step in (3, 4):
        assert "loss/total" in ref[step] and "train/success" in ref[step]
        assert ref[step]["tokens/policy"] > 0  # the update really trained on samples
    assert "eval/success" in ref[4]
    # rl.data.length_multiple=40: batch lengths are multiples of 40 or the cap (160 - 8
    # new tokens); with the default 32 none below the cap would be.
    assert {ref[s]["batch/len"] for s in (1, 2, 3, 4)} <= {40, 80, 120, 152}


# Nightly: tests/test_resume_matrix.py kills and resumes the CLI at every point in CI; this
# is the kill on a checkpoint directory appearing, from outside the process.
@pytest.mark.slow
def test_resume_after_sigkill_continues_exactly(runs, tmp_path):
    ref_dir, summary = runs
    killed_dir = tmp_path / "killed"
    cmd = [
        sys.executable,
        "-m",
        "jaxagent.cli",
        "train",
        str(ROOT / "configs/quickstart.yaml"),
        *TINY,
        f"train.out_dir={killed_dir}",
    ]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    ckpt = killed_dir / "checkpoints" / "2"
    deadline = time.time() + 600
    while not ckpt.is_dir() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert ckpt.is_dir(), proc.communicate()[0].decode()[-3000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "[resume] from checkpoint" in done.stdout
    ref, resumed = _by_step(ref_dir / "metrics.jsonl"), _by_step(killed_dir / "metrics.jsonl")
    assert sorted(resumed) == sorted(ref) == [0, 1, 2, 3, 4]
    for step in (3, 4):
        assert resumed[step] == ref[step], step
    # The final JSON line of the resumed run reports the same results.
    last = json.loads(done.stdout.strip().splitlines()[-1])
    assert last["success_after_rl"] == summary["success_after_rl"]
    assert last["success_before_rl"] == summary["success_before_rl"]


def test_cli_eval_reproduces_the_trainers_evaluation(runs, capsys):
    ref_dir, summary = runs
    rc = cli_main(
        ["eval", str(ROOT / "configs/quickstart.yaml"), *TINY, "--checkpoint", str(ref_dir)]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["step"] == 4 and out["episodes"] == 4
    assert out["success"] == summary["success_after_rl"]


def test_cli_export_loads_in_transformers_with_identical_logits(runs, tmp_path, capsys):
    import jax.numpy as jnp
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from jaxagent.models import apply_model
    from jaxagent.train.session import load_policy

    ref_dir = runs[0]
    out = tmp_path / "hf"
    assert cli_main(["export", "--checkpoint", str(ref_dir), "--out", str(out)]) == 0
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
    text = tok.apply_chat_template(
        [{"role": "user", "content": "task : what is the price of acme today ?"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    ids = tok.encode(text, add_special_tokens=False)
    policy = load_policy(ref_dir)
    assert ids == policy.tokenizer.encode(text, add_special_tokens=False)
    t = len(ids)
    ours = apply_model(
        policy.graphdef,
        policy.params,
        jnp.asarray([ids]),
        jnp.arange(t)[None],
        jnp.ones((1, t), jnp.int32),
    ).logits
    with torch.no_grad():
        theirs = model(torch.tensor([ids])).logits.numpy()
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-4)


def test_cli_rollout_prints_turns_and_config_errors_exit_2(runs, capsys):
    ref_dir = runs[0]
    assert (
        cli_main(
            [
                "rollout",
                str(ROOT / "configs/quickstart.yaml"),
                *TINY,
                "--checkpoint",
                str(ref_dir),
                "--n",
                "2",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert text.count("task quickstart-test-") == 2
    assert "[turn 0] action:" in text and "reward" in text and "->" in text
    assert cli_main(["train", str(ROOT / "configs/quickstart.yaml"), "model.hiden_size=3"]) == 2
    err = capsys.readouterr().err
    assert "model.hiden_size" in err and "hidden_size" in err


def test_checkpoints_can_live_outside_the_run_directory(runs, tmp_path, capsys):
    # train.checkpoint_dir: a location every host sees (a URL orbax writes, e.g. gs://...)
    # while the run directory stays local; eval finds the checkpoints through the config
    import shutil

    from etils import epath

    from jaxagent.train.checkpoint import complete_steps, storage_path
    from jaxagent.train.config import config_to_yaml

    url = storage_path("gs://bucket/runs/qs")
    assert isinstance(url, epath.Path) and str(url) == "gs://bucket/runs/qs"
    ref_dir = runs[0]
    run, ckpts = tmp_path / "run", tmp_path / "store" / "quickstart-0"
    shutil.copytree(ref_dir / "tokenizer", run / "tokenizer")
    shutil.copytree(ref_dir / "checkpoints", ckpts)
    cfg = load_config(
        ref_dir / "config.yaml",
        [f"train.out_dir={run}", f"train.checkpoint_dir={tmp_path}/store/{{name}}-{{seed}}"],
    )
    assert cfg.checkpoint_dir() == str(ckpts) and complete_steps(cfg.checkpoint_dir())
    (run / "config.yaml").write_text(config_to_yaml(cfg))
    assert cli_main(["eval", str(run / "config.yaml"), "--checkpoint", str(run)]) == 0
    moved = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert cli_main(["eval", str(run / "config.yaml"), "--checkpoint", str(ref_dir)]) == 0
    here = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert moved["step"] == here["step"] and moved["success"] == here["success"]
