"""Evaluation of a turn policy on a set of tasks: episodes -> the reporting protocol.

``evaluate(policy, tasks, spec, key, params=..., samples_per_task=...)`` runs every task's
samples through the rollout driver (``collect_episodes``) and summarises them with
``jaxagent.eval.report.summarize``. The trainer's held-out and validation evaluations,
``jaxagent eval`` and the training-free methods all go through it, so for one policy, one
set of tasks, one spec and one key they report the same figures.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import jax

from jaxagent.agents.episode import Episode
from jaxagent.agents.rollout import RolloutSpec, RolloutStats, collect_episodes
from jaxagent.agents.turn_policy import TurnPolicy
from jaxagent.envs.base import Task
from jaxagent.eval.report import EvalReport, summarize


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """The report of one evaluation and what it was computed from."""

    report: EvalReport  # success, steps, failure modes, env errors, ...
    episodes: list[Episode]  # in task order, ``samples_per_task`` per task
    stats: RolloutStats  # where the time went
    seconds: float  # wall-clock time of the evaluation

    def metrics(self, prefix: str) -> dict[str, float]:
        """Flat metrics (``<prefix>/success``, ...) and ``time/<prefix>_s``."""
        return {**self.report.as_metrics(prefix), f"time/{prefix}_s": self.seconds}


def evaluate(
    policy: TurnPolicy,
    tasks: Sequence[Task],
    spec: RolloutSpec,
    key: jax.Array,
    *,
    params: Any = None,
    samples_per_task: int = 1,
) -> Evaluation:
    """Run ``samples_per_task`` episodes of each task and report on them.

    Args:
      policy: the turn policy (an LM sampler, a scripted expert, a wrapper).
      tasks: the tasks to evaluate on.
      spec: chat format, system prompt, budgets and environment runner.
      key: the sampling key (the same key reproduces the same episodes).
      params: the policy's parameters (None for policies without any).
      samples_per_task: episodes per task.

    Returns:
      An ``Evaluation`` (report, episodes, rollout stats, seconds).
    """
    t0 = time.perf_counter()
    eps, stats = collect_episodes(
        policy, params, tasks, samples_per_task=samples_per_task, spec=spec, key=key
    )
    return Evaluation(summarize(eps), eps, stats, time.perf_counter() - t0)
