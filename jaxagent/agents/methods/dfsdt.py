"""DFSDT (ToolLLM, Qin et al., 2023): depth-first search over actions with backtracking.

At each node (an episode prefix) a proposer offers up to ``max_children`` candidate actions,
best first; the search takes the first, goes deeper, and when that branch ends in a failure
(the episode ends unsolved, or the depth budget runs out) it restores the environment to the
node (``SnapshotEnv.restore``) and tries the next candidate. It stops at the first success or
after ``max_env_steps`` environment steps in all. ``max_children=1`` is the greedy policy.

It needs environment instances that can snapshot and restore their state
(``jaxagent.envs.base.supports_snapshot``); any other environment is refused with a
``MethodError`` naming it. The returned episode is the successful path (or the last one
explored), tokenised with the chat format as ``collect_episodes`` would; the other branches'
tokens and the proposer's context reads are in ``info["method_tokens"]``; ``info["method"]``
counts environment steps, restores and backtracks.

Proposers: ``ScriptedProposer`` (a function of the task and the path so far) and
``PolicyProposer`` (samples ``n`` continuations of the path's token context from an LM turn
policy: ``start`` on the whole context, as a stateless re-read).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Protocol, Sequence

import jax

from jaxagent.agents.chat import Chat
from jaxagent.agents.episode import Episode, Turn
from jaxagent.agents.methods.base import add_method_tokens
from jaxagent.agents.rollout import RolloutSpec
from jaxagent.agents.turn_policy import TurnPolicy
from jaxagent.envs.base import FailureMode, Task, Termination, supports_snapshot


class MethodError(ValueError):
    """A method cannot run on this input (the message says why and what to do)."""


History = list[tuple[str, str]]  # (action, observation) pairs of the path so far


class Proposer(Protocol):
    def propose(self, task: Task, first_obs: str, history: History, n: int, key) -> list[str]: ...

    input_tokens: int  # context tokens read so far (for the cost accounting)


class ScriptedProposer:
    """Candidates from ``fn(task, history, first_obs) -> list[str]`` (best first)."""

    def __init__(self, fn: Callable[[Task, History, str], list[str]]):
        self.fn, self.input_tokens = fn, 0

    def propose(self, task, first_obs, history, n, key) -> list[str]:
        return list(self.fn(task, history, first_obs))[:n]


class PolicyProposer:
    """``n`` sampled continuations of the path from an LM turn policy, deduplicated in order."""

    def __init__(self, policy: TurnPolicy, chat: Chat, system: str, params: Any):
        self.policy, self.chat, self.system, self.params = policy, chat, system, params
        self.input_tokens = 0

    def propose(self, task, first_obs, history, n, key) -> list[str]:
        ids = self.chat.prompt(self.system, first_obs)
        for action, obs in history:
            ids = ids + self.chat.action(action) + self.chat.observation(obs)
        out = self.policy.start(
            self.params, [ids] * n, key, tasks=[task] * n, observations=[first_obs] * n
        )
        self.input_tokens += len(ids) * n
        seen: list[str] = []
        for toks in out.tokens:
            text = self.chat.decode(toks)
            if text not in seen:
                seen.append(text)
        return seen


@dataclasses.dataclass
class _Search:
    env: Any
    task: Task
    first_obs: str
    proposer: Proposer
    max_children: int
    max_depth: int
    max_env_steps: int
    key: Any
    steps: int = 0
    restores: int = 0
    backtracks: int = 0
    explored: list = dataclasses.field(default_factory=list)  # every (action, obs, done)
    last: Optional[tuple[History, Any]] = None  # the last finished path and its StepResult

    def dfs(self, history: History) -> Optional[tuple[History, Any]]:
        """The first successful path below ``history`` (the env is at its end), or None."""
        if len(history) >= self.max_depth or self.steps >= self.max_env_steps:
            return None
        self.key, sub = jax.random.split(self.key)
        children = self.proposer.propose(self.task, self.first_obs, history, self.max_children, sub)
        snap = self.env.snapshot() if len(children) > 1 else None
        for i, action in enumerate(children[: self.max_children]):
            if self.steps >= self.max_env_steps:
                break
            if i > 0:
                self.env.restore(snap)
                self.restores += 1
                self.backtracks += 1
            result = self.env.step(action)
            self.steps += 1
            path = history + [(action, result.observation)]
            self.explored.append((action, result.observation, bool(result.done)))
            if result.done:
                self.last = (path, result)
                if result.info.get("success"):
                    return path, result
                continue
            if len(path) >= self.max_depth:
                self.last = (path, result)
            found = self.dfs(path)
            if found is not None:
                return found
        return None


def _episode(task, group, first_obs, path, result, spec: RolloutSpec) -> Episode:
    """The path as ``collect_episodes`` would record it (prompt, actions, observations)."""
    chat = spec.chat
    ep = Episode(task=task, group=group, first_observation=first_obs)
    ep.append(chat.prompt(spec.system_prompt, first_obs), sampled=False)
    for t, (action, obs) in enumerate(path):
        ids = chat.action(action)
        ep.append(ids, sampled=True, logprobs=[0.0] * len(ids), turn=t)
        final = t == len(path) - 1 and result is not None and result.done
        turn = Turn(
            action=action, observation="" if final else obs, reward=0.0, num_action_tokens=len(ids)
        )
        if not final and t < len(path) - 1:
            chunk = chat.observation(obs)
            turn.num_observation_tokens = len(chunk)
            ep.append(chunk, sampled=False)
        ep.turns.append(turn)
    if result is not None and result.done:
        info = dict(result.info)
        ep.turns[-1].reward = float(result.reward)
        ep.turns[-1].reward_terms = dict(info.get("reward_terms") or {})
        ep.turns[-1].failure_mode = info.get("failure_mode")
        ep.turns[-1].dangerous = list(info.get("dangerous") or ())
        ep.info = info
        term = Termination.TRUNCATED if info.get("truncated") else Termination.TERMINATED
        ep.finish(term, info.get("failure_mode"), success=bool(info.get("success")))
    else:
        ep.finish(Termination.TRUNCATED, FailureMode.STEP_BUDGET)
    return ep


@dataclasses.dataclass
class DFSDT:
    """Depth-first tree search with backtracking (module docstring).

    Args:
      make_env: builds one environment instance (it must support snapshot/restore).
      proposer: candidate actions at a node; None = ``PolicyProposer`` over the run's policy.
      max_children: candidates tried per node (1 = greedy).
      max_env_steps: environment steps per (task, sample) over all branches.
    """

    make_env: Callable[[], Any]
    proposer: Optional[Proposer] = None
    max_children: int = 2
    max_env_steps: int = 30
    name: str = "dfsdt"

    def __post_init__(self):
        if self.max_children < 1 or self.max_env_steps < 1:
            raise ValueError(
                f"dfsdt max_children={self.max_children} and max_env_steps="
                f"{self.max_env_steps} must be >= 1"
            )

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
        env = self.make_env()
        if not supports_snapshot(env):
            raise MethodError(
                f"dfsdt needs an environment with snapshot() and restore() (the SnapshotEnv "
                f"capability of jaxagent.envs.base); {type(env).__name__} has none: implement "
                "them or choose another method (reflexion, self_refine, best_of_n)"
            )
        proposer = self.proposer or PolicyProposer(policy, spec.chat, spec.system_prompt, params)
        out = []
        for i, task in enumerate(tasks):
            for k in range(samples_per_task):
                before = proposer.input_tokens
                first = env.reset(task)
                s = _Search(
                    env,
                    task,
                    first,
                    proposer,
                    self.max_children,
                    spec.budget.max_turns,
                    self.max_env_steps,
                    jax.random.fold_in(key, i * samples_per_task + k),
                )
                found = s.dfs([])
                path, result = found or s.last or ([], None)
                ep = _episode(task, i, first, path, result, spec)
                # Off-path branches: their actions were generated, their (non-final)
                # observations read; the path's own tokens are in the episode.
                gen = sum(len(spec.chat.action(a)) for a, _, _ in s.explored)
                gen -= sum(t.num_action_tokens for t in ep.turns)
                obs = sum(len(spec.chat.observation(o)) for _, o, d in s.explored if not d)
                obs -= sum(t.num_observation_tokens for t in ep.turns)
                add_method_tokens(ep, input=obs + proposer.input_tokens - before, generated=gen)
                ep.info["method"] = {
                    "name": self.name,
                    "max_children": self.max_children,
                    "env_steps": s.steps,
                    "restores": s.restores,
                    "backtracks": s.backtracks,
                    "path_length": len(path),
                }
                out.append(ep)
        env.close()
        return out
