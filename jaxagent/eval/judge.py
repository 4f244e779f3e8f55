"""LLM-judge rewards, their calibration against ground truth, and mixing with rule rewards.

A judge reads an episode's transcript and answers "did this response complete the task?"
with ``Verdict.p_yes`` in [0, 1] (flexible, but gameable: calibrate it against verified success).

- ``PolicyJudge``: the policy model as judge. Its prompt is the transcript followed by
  ``JUDGE_QUESTION``; it samples ``samples`` answers (any ``TurnPolicy``: ``start`` on the
  prompt ids) and ``p_yes`` is the fraction whose first word is ``yes``.
- ``ClaimJudge``: a model-free stand-in with the blind spot an LLM judge reading only the
  response has: it accepts a final message that claims completion (``COMPLETION_CLAIMS``) or
  whose answer appears in an observation of the transcript. It never sees the world's state,
  so a wrong tool whose output was reported, or a claim with no work, passes.

``calibration_report(episodes, verdicts)`` compares a judge with the environment's verified
success: agreement, false-positive rate (judged complete | failed), false-negative rate
(judged incomplete | succeeded), precision, the confusion counts and, per failure mode, how
often failures of that kind were judged complete. Episodes ended by an environment error are
left out (they are no one's answer). ``mixed_reward`` combines a rule reward with the judge's.

Nothing here imports JAX or the agents package: policies and chats are duck-typed.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from typing import Any, Optional, Sequence

JUDGE_QUESTION = "question : did the agent complete the task ? answer yes or no ."
COMPLETION_CLAIMS = ("task complete", "done", "completed", "finished")


@dataclasses.dataclass(frozen=True)
class Verdict:
    p_yes: float  # the judge's probability that the task was completed
    text: str = ""  # what the judge wrote (first sample)
    input_tokens: int = 0  # tokens the judge read (cost accounting)
    generated_tokens: int = 0  # tokens it wrote


def episode_transcript(ep) -> str:
    """The first observation, then every action and its observation, as one text."""
    parts = [ep.first_observation]
    for t in ep.turns:
        parts += [t.action, t.observation]
    return " ".join(p for p in parts if p)


def _final_answer(ep) -> Optional[str]:
    for t in reversed(ep.turns):
        m = re.search(r"Final\s*:\s*(.*)$", t.action, re.S)
        if m:
            return " ".join(m.group(1).replace('"', " ").split()).lower()
    return None


class ClaimJudge:
    """The model-free, gameable stand-in for a response-reading judge (module docstring)."""

    def judge(self, episodes: Sequence[Any]) -> list[Verdict]:
        out = []
        for ep in episodes:
            answer = _final_answer(ep)
            said = " ".join(
                o.split(":", 1)[-1].strip().lower() for o in (t.observation for t in ep.turns) if o
            ).split()
            ok = answer is not None and (
                any(c in answer for c in COMPLETION_CLAIMS) or (answer and answer in said)
            )
            out.append(Verdict(float(ok), "yes" if ok else "no"))
        return out


class PolicyJudge:
    """The policy model as judge: ``samples`` answers to ``JUDGE_QUESTION`` per episode.

    Args:
      policy: any turn policy (``start(params, prompts, key, tasks=, observations=)``).
      chat: the policy's chat format (``prompt``, ``decode``).
      params: the policy's parameters.
      key: a JAX PRNG key (samples fold it).
      samples: answers per episode; ``p_yes`` is the fraction that start with ``yes``.
      system: the judge's system prompt.
    """

    def __init__(self, policy, chat, params, key, *, samples: int = 1, system: str = ""):
        if samples < 1:
            raise ValueError(f"PolicyJudge samples={samples} must be >= 1")
        self.policy, self.chat, self.params, self.key = policy, chat, params, key
        self.samples, self.system = samples, system

    def judge(self, episodes: Sequence[Any]) -> list[Verdict]:
        import jax  # only the LM judge needs it; the module stays importable without

        if not episodes:
            return []
        texts = [f"{episode_transcript(ep)} {JUDGE_QUESTION}" for ep in episodes]
        prompts = [self.chat.prompt(self.system, t) for t in texts]
        rows = [i for i in range(len(texts)) for _ in range(self.samples)]
        out = self.policy.start(
            self.params,
            [prompts[i] for i in rows],
            jax.random.fold_in(self.key, len(rows)),
            tasks=[episodes[i].task for i in rows],
            observations=[texts[i] for i in rows],
        )
        verdicts = []
        for i in range(len(texts)):
            mine = [j for j, r in enumerate(rows) if r == i]
            answers = [self.chat.decode(out.tokens[j]).strip().lower() for j in mine]
            yes = sum(a.split()[:1] == ["yes"] for a in answers)
            verdicts.append(
                Verdict(
                    yes / len(mine),
                    answers[0],
                    len(prompts[i]) * len(mine),
                    sum(len(out.tokens[j]) for j in mine),
                )
            )
        return verdicts


def judge_rewards(verdicts: Sequence[Verdict], threshold: Optional[float] = None) -> list[float]:
    """The judge's reward per episode: ``p_yes``, or 1/0 at ``threshold`` when given."""
    if threshold is None:
        return [float(v.p_yes) for v in verdicts]
    return [float(v.p_yes >= threshold) for v in verdicts]


def mixed_reward(
    rule: Sequence[float], judge: Sequence[float], *, judge_weight: float, gate: bool = False
) -> list[float]:
    """``(1 - w) * rule + w * judge`` per episode; with ``gate``, the judge's part is paid
    only where the rule reward is positive (the judge refines verified successes and cannot
    create reward on its own: the gamed episodes get 0).

    Raises:
      ValueError: ``judge_weight`` outside [0, 1] or the sequences' lengths differ.
    """
    if not 0.0 <= judge_weight <= 1.0:
        raise ValueError(f"judge_weight={judge_weight} must lie in [0, 1]")
    if len(rule) != len(judge):
        raise ValueError(f"{len(rule)} rule rewards for {len(judge)} judge rewards")
    w = judge_weight
    return [(1 - w) * r + (w * j if (not gate or r > 0) else 0.0) for r, j in zip(rule, judge)]


def _rate(num: int, den: int) -> Optional[float]:
    return num / den if den else None


def calibration_report(
    episodes: Sequence[Any], verdicts: Sequence[Verdict], *, threshold: float = 0.5
) -> dict[str, Any]:
    """The judge (``p_yes >= threshold``) against the episodes' verified ``success``.

    Returns:
      ``episodes`` (judged, env errors left out), ``env_errors``, ``agreement``,
      ``false_positive_rate``, ``false_negative_rate``, ``precision``, ``judge_yes_rate``,
      ``true_success_rate``, ``confusion`` {tp, fp, tn, fn} and ``per_failure_mode``
      {mode: {episodes, judged_complete, judged_complete_rate}} over the failed episodes.
    """
    if len(episodes) != len(verdicts):
        raise ValueError(f"{len(episodes)} episodes for {len(verdicts)} verdicts")
    c = collections.Counter()
    modes: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    errors = 0
    for ep, v in zip(episodes, verdicts):
        if ep.env_failed:
            errors += 1
            continue
        yes, truth = v.p_yes >= threshold, bool(ep.success)
        c[("t" if yes == truth else "f") + ("p" if yes else "n")] += 1
        if not truth:
            m = modes[ep.failure_mode or "unlabelled"]
            m["episodes"] += 1
            m["judged_complete"] += int(yes)
    n = sum(c.values())
    return {
        "episodes": n,
        "env_errors": errors,
        "threshold": threshold,
        "agreement": _rate(c["tp"] + c["tn"], n),
        "false_positive_rate": _rate(c["fp"], c["fp"] + c["tn"]),
        "false_negative_rate": _rate(c["fn"], c["fn"] + c["tp"]),
        "precision": _rate(c["tp"], c["tp"] + c["fp"]),
        "judge_yes_rate": _rate(c["tp"] + c["fp"], n),
        "true_success_rate": _rate(c["tp"] + c["fn"], n),
        "confusion": {k: int(c[k]) for k in ("tp", "fp", "tn", "fn")},
        "per_failure_mode": {
            mode: {
                "episodes": m["episodes"],
                "judged_complete": m["judged_complete"],
                "judged_complete_rate": m["judged_complete"] / m["episodes"],
            }
            for mode, m in sorted(modes.items())
        },
    }
