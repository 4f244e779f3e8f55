"""Score n sampled solutions per task in the sandbox and report pass@k / pass^k.

    with Sandbox(SandboxConfig(timeout_s=3.0), num_workers=8) as sandbox:
        report = evaluate_samples(sandbox, tasks, samples, ks=(1, 10))
    report["pass@1"], report["per_task"][i]["passed"]

``samples[i]`` holds the model's answers for ``tasks[i]`` (fenced code blocks or bare code,
as ``CodeEnv`` accepts them). A sample counts as correct only when the sandbox's harness
records every hidden test as passed.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from jaxagent.envs.base import Task
from jaxagent.envs.code.sandbox import Sandbox
from jaxagent.envs.code.tasks import assemble_program, extract_code, hidden_tests
from jaxagent.eval.passk import mean_pass_at_k, mean_pass_hat_k


def evaluate_samples(
    sandbox: Sandbox,
    tasks: Sequence[Task],
    samples: Sequence[Sequence[str]],
    ks: Sequence[int] = (1, 10, 100),
) -> dict:
    """Runs every sample; returns mean pass@k and pass^k (for k <= the smallest n) and,
    per task, ``n``, ``passed`` (c) and the sandbox statuses."""
    if len(samples) != len(tasks):
        raise ValueError(
            f"samples has {len(samples)} entries for {len(tasks)} tasks: give one list of "
            "sampled answers per task"
        )
    if any(len(s) == 0 for s in samples):
        raise ValueError("every task needs at least one sample (samples[i] is empty)")
    jobs, owner = [], []
    for i, (task, answers) in enumerate(zip(tasks, samples)):
        for answer in answers:
            jobs.append((assemble_program(task, extract_code(answer)), hidden_tests(task)))
            owner.append(i)
    results = sandbox.map(jobs)
    n = np.array([len(s) for s in samples])
    c = np.zeros(len(tasks), dtype=np.int64)
    statuses: list[list[str]] = [[] for _ in tasks]
    for i, result in zip(owner, results):
        c[i] += result.passed
        statuses[i].append(result.status)
    report = {**mean_pass_at_k(n, c, ks), **mean_pass_hat_k(n, c, ks)}
    report["per_task"] = [
        {"id": t.id, "n": int(n[i]), "passed": int(c[i]), "statuses": statuses[i]}
        for i, t in enumerate(tasks)
    ]
    return report
