"""The README's "Use the pieces" code block runs as it is: the sampler, an advantage
estimator, a loss and a recipe's update step on a tiny random model, and the update's
sampler-vs-learner log-prob gap is float rounding (the sampled log-probs are the policy's)."""

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_use_the_pieces_block_runs():
    section = README.read_text().split("## Use the pieces", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    m = re.fullmatch(r"loss (-?\d+\.\d+), log-prob gap (\S+)\n", done.stdout)
    assert m, done.stdout
    assert float(m.group(2)) < 1e-4  # fp32 rounding (KV-cache decode vs full forward)
