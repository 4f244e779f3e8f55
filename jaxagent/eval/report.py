"""The reporting protocol: success, steps, failure modes, env errors, multi-seed summaries.

Episodes whose environment failed (``Termination.ENV_ERROR``) are counted and reported, but
excluded from the policy's success rate and failure modes: a crashed tool is not the agent's
fault. ``seed_summary`` gives a mean and a t-interval over seeds.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class EvalReport:
    """Summary of a set of episodes."""

    episodes: int  # all episodes, env failures included
    env_errors: int  # episodes ended by an environment failure
    success: float  # success rate over episodes without env errors
    avg_steps: float  # mean policy turns per episode (without env errors)
    avg_reward: float  # mean total reward (without env errors)
    avg_policy_tokens: float  # mean sampled tokens per episode
    failure_modes: dict  # failure label -> count (policy failures only)
    dangerous_actions: int  # episodes that took a dangerous action
    # The environment's own labels of those failures (``Episode.failure_detail``), finer than
    # the project-wide modes: the web sites' wrong_item / wrong_action / dangerous_action are
    # all ``wrong_state``. Empty for environments that give none.
    failure_details: dict = dataclasses.field(default_factory=dict)

    def as_metrics(self, prefix: str) -> dict[str, float]:
        out = {
            f"{prefix}/success": self.success,
            f"{prefix}/avg_steps": self.avg_steps,
            f"{prefix}/avg_reward": self.avg_reward,
            f"{prefix}/env_errors": self.env_errors,
            f"{prefix}/episodes": self.episodes,
            f"{prefix}/avg_policy_tokens": self.avg_policy_tokens,
            f"{prefix}/dangerous": self.dangerous_actions,
        }
        for mode, count in self.failure_modes.items():
            out[f"{prefix}/failure/{mode}"] = count
        for detail, count in self.failure_details.items():
            out[f"{prefix}/failure_detail/{detail}"] = count
        return out

    def describe(self, what: str) -> str:
        """One line for people: ``held-out success 0.430 over 100 episodes, avg steps ...``."""
        return (
            f"{what} success {self.success:.3f} over {self.episodes} episodes, avg steps "
            f"{self.avg_steps:.2f}, env errors {self.env_errors}, failures {self.failures_text()}"
        )

    def failures_text(self) -> str:
        """``{'wrong_state': 71, ...}``, and the environment's own labels when it gives any."""
        if not self.failure_details:
            return str(self.failure_modes)
        return f"{self.failure_modes}, in detail {self.failure_details}"


def episode_dangerous(ep) -> list[str]:
    """Every dangerous action of an episode, from all of its steps (``info["dangerous"]`` of
    each step, recorded on its ``Turn``), in order. A dangerous call mid-episode counts as
    much as one on the last step."""
    return [a for t in ep.turns for a in (t.dangerous or ())]


def failure_detail_counts(episodes: Sequence) -> dict:
    """``Episode.failure_detail`` -> count over ``episodes``, most frequent first."""
    counts = collections.Counter(ep.failure_detail for ep in episodes if ep.failure_detail)
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def summarize(episodes: Sequence) -> EvalReport:
    """Summarise episodes (``jaxagent.agents.episode.Episode`` records)."""
    ok = [ep for ep in episodes if not ep.env_failed]
    modes = collections.Counter(ep.failure_mode for ep in ok if not ep.success and ep.failure_mode)
    unlabelled = sum(1 for ep in ok if not ep.success and not ep.failure_mode)
    if unlabelled:
        modes["unlabelled"] += unlabelled
    n = max(len(ok), 1)
    dangerous = sum(1 for ep in ok if episode_dangerous(ep))
    return EvalReport(
        episodes=len(episodes),
        env_errors=len(episodes) - len(ok),
        success=sum(ep.success for ep in ok) / n,
        avg_steps=sum(ep.num_turns for ep in ok) / n,
        avg_reward=sum(ep.reward for ep in ok) / n,
        avg_policy_tokens=sum(ep.num_policy_tokens for ep in episodes) / max(len(episodes), 1),
        failure_modes=dict(sorted(modes.items(), key=lambda kv: -kv[1])),
        dangerous_actions=dangerous,
        failure_details=failure_detail_counts(ok),
    )


# Two-sided 95% Student-t quantiles for small sample sizes (df = n - 1).
_T95 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
}


def seed_summary(values: Sequence[float]) -> dict[str, float]:
    """Mean, sample std and a 95% t-interval half-width over seeds."""
    x = np.asarray(values, np.float64)
    if x.size == 0:
        raise ValueError("seed_summary needs at least one value")
    mean = float(x.mean())
    if x.size == 1:
        return {"mean": mean, "std": 0.0, "ci95": float("nan"), "n": 1}
    std = float(x.std(ddof=1))
    t = _T95.get(x.size - 1, 1.96)
    return {"mean": mean, "std": std, "ci95": t * std / math.sqrt(x.size), "n": int(x.size)}
