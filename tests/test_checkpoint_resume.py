"""Exact resume after a SIGKILL in the middle of an iteration, with LoRA and with every pool
backend (slow: three tiny trainings each; ``bash scripts/nightly.sh``).

As in ``tests/test_train.py`` (inline backend, validation-based selection): a reference run,
then a ``jaxagent train`` subprocess killed right after its iteration-2 checkpoint, i.e. while
iteration 3 collects its episodes, and restarted. The interrupted iteration's episodes were
never stored, so the restarted run re-collects them with the same keys: every deterministic
metric of iterations 3 and 4 (and the best-validation selection) must equal the reference.
Measured here (load average ~2 on 2 CPUs): lora 125 s, thread 153 s, process 116 s.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from jaxagent.train.config import load_config

from test_train import ROOT, TINY, _by_step

VARIANTS = {
    "lora": ["rl.lora.rank=4", "rl.lora.alpha=8"],
    "thread": ["env.pool.backend=thread", "env.pool.num_envs=2"],
    "process": ["env.pool.backend=process", "env.pool.num_envs=2"],
}


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_resume_after_sigkill_is_exact(variant, tmp_path):
    from jaxagent.train.trainer import Trainer

    extra = VARIANTS[variant]
    ref_dir, killed_dir = tmp_path / "reference", tmp_path / "killed"
    config = load_config(
        ROOT / "configs/quickstart.yaml", TINY + extra + [f"train.out_dir={ref_dir}"]
    )
    trainer = Trainer(config, echo=lambda s: None)
    trainer.run()
    trainer.close()
    cmd = [sys.executable, "-m", "jaxagent.cli", "train", str(ROOT / "configs/quickstart.yaml")]
    cmd += [*TINY, *extra, f"train.out_dir={killed_dir}"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    ckpt = killed_dir / "checkpoints" / "2"
    deadline = time.time() + 900
    while not ckpt.is_dir() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert ckpt.is_dir(), proc.communicate()[0].decode()[-3000:]
    os.killpg(proc.pid, signal.SIGKILL)  # the trainer and its pool workers, mid-iteration 3
    proc.wait()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "[resume] from checkpoint" in done.stdout
    ref, resumed = _by_step(ref_dir / "metrics.jsonl"), _by_step(killed_dir / "metrics.jsonl")
    assert sorted(resumed) == sorted(ref) == [0, 1, 2, 3, 4]
    for step in (3, 4):
        assert resumed[step] == ref[step], (variant, step)
