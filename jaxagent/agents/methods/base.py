"""What the training-free methods share: the method protocol, merged attempts, hidden tokens.

A method runs a wrapped turn policy (an LM sampler or a scripted policy) on tasks and returns
one ``Episode`` per (task, sample), in the order ``collect_episodes`` uses, so that
``jaxagent.eval.protocol`` reports on it like on any evaluation. What a method spends beyond
the episode it returns is kept, never hidden:

- several attempts (Reflexion, best-of-N) are merged into one episode whose token stream is
  the concatenation of the attempts' (``merge_attempts``): the eval record's ``tokens`` then
  count every attempt, and ``turns`` hold every environment step taken;
- tokens spent off the trajectory (drafts and critiques of Self-Refine, reflections, judge
  calls, tree-search branches) go to ``ep.info["method_tokens"]`` (``add_method_tokens``:
  ``input`` and ``generated``), which ``eval.protocol.episode_tokens`` adds to the counts.

``MemoryRunner`` prepends a per-task text (a verbal memory) to the first observation, so that
any policy, LM or scripted, reads it and the episode records the tokens it cost.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Optional, Protocol, Sequence

import jax

from jaxagent.agents.episode import Episode
from jaxagent.agents.rollout import RolloutSpec
from jaxagent.agents.runner import BlockingRunner, EnvRunner
from jaxagent.pool.steps import EnvReply
from jaxagent.agents.turn_policy import TurnPolicy
from jaxagent.envs.base import Task


class Method(Protocol):
    """A training-free method: ``run`` returns one episode per (task, sample)."""

    name: str

    def run(
        self,
        policy: TurnPolicy,
        params: Any,
        tasks: Sequence[Task],
        *,
        samples_per_task: int,
        spec: RolloutSpec,
        key: jax.Array,
    ) -> list[Episode]: ...


def add_method_tokens(ep: Episode, *, input: int = 0, generated: int = 0) -> None:
    """Count tokens a method spent outside ``ep``'s token stream (drafts, critiques, ...)."""
    info = dict(ep.info)
    counts = dict(info.get("method_tokens") or {"input": 0, "generated": 0})
    counts["input"] = int(counts.get("input", 0)) + int(input)
    counts["generated"] = int(counts.get("generated", 0)) + int(generated)
    info["method_tokens"] = counts
    ep.info = info


def method_tokens(ep: Episode) -> dict[str, int]:
    """The off-trajectory tokens of ``ep`` (zeros when the method spent none)."""
    counts = ep.info.get("method_tokens") or {}
    return {"input": int(counts.get("input", 0)), "generated": int(counts.get("generated", 0))}


def merge_attempts(attempts: Sequence[Episode], **method_info: Any) -> Episode:
    """One episode from consecutive attempts at the same task: tokens, masks and turns
    concatenated, the outcome (termination, success, failure mode) of the last attempt.

    ``info`` is the last attempt's, with ``method`` (``method_info`` plus ``attempts`` and
    each attempt's success) and the summed ``method_tokens`` of all attempts."""
    if not attempts:
        raise ValueError("merge_attempts needs at least one attempt")
    last = attempts[-1]
    ep = Episode(task=last.task, group=last.group, first_observation=attempts[0].first_observation)
    offset = 0
    for a in attempts:
        ep.tokens += a.tokens
        ep.loss_mask += a.loss_mask
        ep.logprobs += a.logprobs
        ep.turn_ids += [t if t < 0 else t + offset for t in a.turn_ids]
        ep.versions += a.versions
        base = len(ep.constraint_masks)  # constrained decoding: each attempt's own masks
        ids = a.constraint_ids or [-1] * len(a.tokens)
        ep.constraint_ids += [i if i < 0 else i + base for i in ids]
        ep.constraint_masks += a.constraint_masks
        ep.turns += a.turns
        offset += len(a.turns)
    if not ep.constraint_masks:
        ep.constraint_ids = []
    ep.finish(last.termination, last.failure_mode, success=last.success, error=last.error)
    ep.info = {k: v for k, v in last.info.items() if k != "method_tokens"}
    for a in attempts:
        add_method_tokens(ep, **method_tokens(a))
    ep.info["method"] = {
        **method_info,
        "attempts": len(attempts),
        "attempt_success": [bool(a.success) for a in attempts],
    }
    return ep


class MemoryRunner(BlockingRunner):
    """An ``EnvRunner`` that prepends ``memories[slot]`` to the first observation of slot's
    episode (``collect_episodes`` gives episode i slot i).

    Args:
      inner: the runner that reaches the environments.
      memories: one text per slot ("" leaves the observation unchanged).
    """

    def __init__(self, inner: EnvRunner, memories: Sequence[str]):
        super().__init__()
        self.inner, self.memories = inner, list(memories)

    def reset(self, slots: Sequence[int], tasks: Sequence[Task]) -> list[EnvReply]:
        replies = self.inner.reset(slots, tasks)
        out = []
        for slot, reply in zip(slots, replies):
            text = self.memories[slot] if slot < len(self.memories) else ""
            if text and reply.error is None:
                reply = dataclasses.replace(reply, observation=f"{text} {reply.observation}")
            out.append(reply)
        return out

    def step(self, slots: Sequence[int], actions: Sequence[str]) -> list[EnvReply]:
        return self.inner.step(slots, actions)

    def health(self) -> dict[str, float]:
        return self.inner.health()

    def close(self) -> None:  # the inner runner belongs to the caller
        pass


def with_runner(spec: RolloutSpec, runner: EnvRunner) -> RolloutSpec:
    return dataclasses.replace(spec, runner=runner)


def transcript(ep: Episode, *, max_turns: Optional[int] = None) -> str:
    """The episode as text: the first observation, then ``Action`` / observation pairs."""
    parts = [ep.first_observation]
    for t in ep.turns[:max_turns]:
        parts.append(t.action)
        if t.observation:
            parts.append(t.observation)
    return " ".join(p for p in parts if p)


def evaluate_method(
    method: Method,
    policy: TurnPolicy,
    tasks: Sequence[Task],
    spec: RolloutSpec,
    key: jax.Array,
    *,
    params: Any = None,
    samples_per_task: int = 1,
):
    """``agents.evaluate.evaluate`` with a method around the policy (same ``Evaluation``)."""
    from jaxagent.agents.evaluate import Evaluation
    from jaxagent.agents.rollout import RolloutStats
    from jaxagent.eval.report import summarize

    t0 = time.perf_counter()
    eps = method.run(policy, params, tasks, samples_per_task=samples_per_task, spec=spec, key=key)
    return Evaluation(summarize(eps), eps, RolloutStats(), time.perf_counter() - t0)
