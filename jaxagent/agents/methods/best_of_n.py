"""Best-of-N with a verifier: N independent episodes per (task, sample), one kept.

The verifier scores each candidate episode: ``"env"`` uses the environment's own checker
(the episode's verified ``success``, then its reward: an oracle verifier, so best-of-N with it
is pass@N), a ``jaxagent.eval.judge`` judge uses its verdict (``p_yes``) instead, with no
access to the ground truth. Ties keep the earliest candidate. Every candidate was really run:
the others' tokens (and the judge's) go to ``info["method_tokens"]``; ``info["method"]``
holds the candidates' count, scores, successes, environment steps and dangerous actions
(those of unkept candidates happened too, so they are reported, not hidden).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import jax

from jaxagent.agents.episode import Episode
from jaxagent.agents.methods.base import add_method_tokens, method_tokens
from jaxagent.agents.rollout import RolloutSpec, collect_episodes
from jaxagent.agents.turn_policy import TurnPolicy
from jaxagent.envs.base import Task


def _tokens(ep: Episode) -> tuple[int, int]:
    gen = int(sum(ep.loss_mask))
    extra = method_tokens(ep)
    return len(ep.tokens) - gen + extra["input"], gen + extra["generated"]


@dataclasses.dataclass
class BestOfN:
    """Best-of-N around any turn policy (module docstring).

    Args:
      n: candidates per (task, sample), >= 1.
      judge: None = the environment's checker; else an object with
        ``judge(episodes) -> list[Verdict]`` (``jaxagent.eval.judge``).
    """

    n: int = 4
    judge: Optional[Any] = None
    name: str = "best_of_n"

    def __post_init__(self):
        if self.n < 1:
            raise ValueError(f"best_of_n n={self.n} must be >= 1")

    @property
    def verifier(self) -> str:
        return "env" if self.judge is None else type(self.judge).__name__

    def run(
        self,
        policy: TurnPolicy,
        params: Any,
        tasks: Sequence[Task],
        *,
        samples_per_task: int,
        spec: RolloutSpec,
        key: jax.Array,
    ) -> list[Episode]:
        eps, _ = collect_episodes(
            policy, params, tasks, samples_per_task=samples_per_task * self.n, spec=spec, key=key
        )
        if self.judge is None:
            scores = [(float(ep.success), ep.reward) for ep in eps]
            judge_in, judge_gen = [0] * len(eps), [0] * len(eps)
        else:
            verdicts = self.judge.judge(eps)
            scores = [(v.p_yes, 0.0) for v in verdicts]
            judge_in = [v.input_tokens for v in verdicts]
            judge_gen = [v.generated_tokens for v in verdicts]
        out = []
        for row in range(len(tasks) * samples_per_task):
            idx = list(range(row * self.n, (row + 1) * self.n))
            # Env errors are never picked while another candidate ran (not a policy answer).
            best = max(idx, key=lambda j: (not eps[j].env_failed, scores[j], -j))
            keep = eps[best]
            keep.group = row // samples_per_task
            others = [j for j in idx if j != best]
            add_method_tokens(
                keep,
                input=sum(_tokens(eps[j])[0] for j in others) + sum(judge_in[j] for j in idx),
                generated=sum(_tokens(eps[j])[1] for j in others) + sum(judge_gen[j] for j in idx),
            )
            keep.info["method"] = {
                "name": self.name,
                "n": self.n,
                "verifier": self.verifier,
                "kept": best - row * self.n,
                "scores": [scores[j][0] for j in idx],
                "candidate_success": [bool(eps[j].success) for j in idx],
                "env_steps": sum(eps[j].num_turns for j in idx),
                "dangerous_unkept": [a for j in others for t in eps[j].turns for a in t.dangerous],
            }
            out.append(keep)
        return out
