"""The reward ladder: process rewards guide, task rewards gate.

Three rungs, densest first:
  process  per step: was the call well-formed? ``process_score`` climbs a ladder: valid syntax
           (1/3), then a known tool (2/3), then arguments that pass the schema (1). A rung only
           counts if the rungs below it hold.
  outcome  was the tool result used correctly / is the final answer right (env-defined, [0, 1])
  task     did the whole task succeed (verifiable, [0, 1]); the most truthful, the sparsest.

Dense process rewards teach "how to call" quickly but invite idle behaviour (well-formed calls
to no effect), so ``RewardMix`` combines the rungs with a gate that keeps task success on top:

  gate="none"  total = w_p * mean(process) + w_o * outcome + w_t * task
  gate="cap"   the shaping part (process + outcome) is capped at ``cap * w_t``, with cap < 1,
               so no failed episode outscores a successful one
  gate="task"  a successful episode earns exactly ``w_t * task``; shaping (capped) is paid only
               to failed episodes, to guide them

Host-side numpy/python only (nothing here imports JAX).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

GATES = ("none", "cap", "task")


def process_score(valid_syntax: bool, known_tool: bool, valid_arguments: bool) -> float:
    """One step's process reward in {0, 1/3, 2/3, 1}: the highest rung reached in order."""
    score = 0
    for rung in (valid_syntax, known_tool, valid_arguments):
        if not rung:
            break
        score += 1
    return score / 3.0


def reward_terms(process: float = 0.0, outcome: float = 0.0, task: float = 0.0) -> dict[str, float]:
    """The ``info["reward_terms"]`` dict every text env reports (``base.REWARD_TERMS`` keys)."""
    return {"process": float(process), "outcome": float(outcome), "task": float(task)}


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RewardMix:
    """How the rungs combine into the scalar reward the learner sees."""

    process_weight: float = 0.1  # weight of the mean per-step process score
    outcome_weight: float = 0.2  # weight of the final outcome term
    task_weight: float = 1.0  # weight of the task term (success = 1)
    gate: str = "task"  # "none" | "cap" | "task" (see module docstring)
    cap: float = 0.5  # shaping is capped at cap * task_weight under "cap" and "task"

    def __post_init__(self):
        if self.gate not in GATES:
            raise ValueError(f"RewardMix.gate={self.gate!r}; choose one of {GATES}")
        for name in ("process_weight", "outcome_weight", "task_weight"):
            if getattr(self, name) < 0:
                raise ValueError(f"RewardMix.{name}={getattr(self, name)} must be >= 0")
        if self.gate != "none" and not 0.0 <= self.cap < 1.0:
            raise ValueError(
                f"RewardMix.cap={self.cap} must lie in [0, 1) so task success stays on top "
                "(or use gate='none')"
            )
        if self.gate != "none" and self.task_weight <= 0:
            raise ValueError("RewardMix.task_weight must be > 0 when a gate is used")


def episode_reward(step_terms: Sequence[Mapping[str, float]], mix: RewardMix) -> float:
    """Scalar reward of one episode from its per-step ``reward_terms``.

    Args:
      step_terms: one dict per step with "process", "outcome", "task" (outcome and task are
        read from the last step, where envs report them).
      mix: the weights and gate.

    Returns:
      The episode's total reward (see the module docstring for each gate).
    """
    if not step_terms:
        return 0.0
    process = float(np.mean([t.get("process", 0.0) for t in step_terms]))
    outcome = float(step_terms[-1].get("outcome", 0.0))
    task = float(step_terms[-1].get("task", 0.0))
    shaping = mix.process_weight * process + mix.outcome_weight * outcome
    if mix.gate == "none":
        return shaping + mix.task_weight * task
    shaping = min(shaping, mix.cap * mix.task_weight)
    if mix.gate == "cap":
        return shaping + mix.task_weight * task
    return mix.task_weight * task if task > 0 else shaping  # gate == "task"


def step_rewards(step_terms: Sequence[Mapping[str, float]], mix: RewardMix) -> np.ndarray:
    """Per-step rewards ``[T]`` (float32 on output, float64 inside) that sum to ``episode_reward``.

    The process part is paid at each step (``w_p * process_t / T``, dense guidance for GAE);
    whatever the gate adds or removes is settled on the last step.
    """
    n = len(step_terms)
    if n == 0:
        return np.zeros((0,), np.float32)
    dense = np.array([mix.process_weight * t.get("process", 0.0) / n for t in step_terms])
    dense[-1] += episode_reward(step_terms, mix) - dense.sum()
    return dense.astype(np.float32)
