"""DFSDT (ToolLLM, Qin et al., 2023): depth-first search over actions with backtracking.

At each node (an episode prefix) a proposer offers up to ``max_children`` candidate actions,
best first; the search takes the first, goes deeper, and when that branch ends in a failure
(the episode ends unsolved, or the depth budget runs out) it restores the environment to the
node (``SnapshotEnv.restore``) and tries the next candidate. It stops at the first success or
after ``max_env_steps`` environment steps in all. ``max_children=1`` is the greedy policy.

It needs environment instances that can snapshot and restore their state
(``jaxagent.envs.base.supports_snapshot``); any other environment is refused with a
``MethodError`` naming it. The search steps its environment through an ``InlineRunner``
(in-process, so its state can be restored), which turns a crash or corrupt answer into an env
error that ends the branch, and the proposer reads observations cut as the rollout cuts them.
The returned episode is the successful path (or the last one explored), recorded by the
rollout driver itself: ``collect_episodes`` replays the path's actions from reset, so its
tokens, budgets, observation cut and env-error handling are the driver's. The other
branches' tokens and the proposer's context reads are in ``info["method_tokens"]``;
``info["method"]`` counts the search's environment steps (the replay's are not search),
restores and backtracks.

Proposers: ``ScriptedProposer`` (a function of the task and the path so far) and
``PolicyProposer`` (samples ``n`` continuations of the path's token context from an LM turn
policy: ``start`` on the whole context, as a stateless re-read).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Protocol, Sequence

import jax

from jaxagent.agents.chat import Chat, observation_after
from jaxagent.agents.episode import Episode
from jaxagent.agents.expert import ExpertTurnPolicy
from jaxagent.agents.methods.base import add_method_tokens
from jaxagent.agents.rollout import RolloutSpec, collect_episodes
from jaxagent.agents.runner import InlineRunner
from jaxagent.agents.turn_policy import TurnPolicy
from jaxagent.envs.base import Task, supports_snapshot, truncate_observation


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
            turn = self.chat.action(action)
            ids = ids + turn + observation_after(self.chat, self.chat.decode(turn), obs)
        out = self.policy.start(
            self.params, [ids] * n, key, tasks=[task] * n, observations=[first_obs] * n
        )
        self.policy.release()  # one-turn proposals: the KV cache is done with
        self.input_tokens += len(ids) * n
        seen: list[str] = []
        for toks in out.tokens:
            text = self.chat.decode(toks)
            if text not in seen:
                seen.append(text)
        return seen


@dataclasses.dataclass
class _Search:
    runner: InlineRunner  # slot 0 is the searched environment
    task: Task
    first_obs: str
    proposer: Proposer
    max_children: int
    max_depth: int
    max_env_steps: int
    key: Any
    cut: Callable[
        [str], str
    ]  # the rollout's observation cut: the proposer reads what a policy would
    steps: int = 0
    restores: int = 0
    backtracks: int = 0
    explored: list = dataclasses.field(default_factory=list)  # every (action, obs, done)
    last: Optional[tuple[History, bool]] = None  # the last ended or depth-capped path, ended

    def dfs(self, history: History) -> Optional[History]:
        """The first successful path below ``history`` (the env is at its end), or None."""
        if len(history) >= self.max_depth or self.steps >= self.max_env_steps:
            return None
        self.key, sub = jax.random.split(self.key)
        children = self.proposer.propose(self.task, self.first_obs, history, self.max_children, sub)
        snap = self.runner.snapshot(0) if len(children) > 1 else None
        for i, action in enumerate(children[: self.max_children]):
            if self.steps >= self.max_env_steps:
                break
            if i > 0:
                self.runner.restore(0, snap)
                self.restores += 1
                self.backtracks += 1
            (reply,) = self.runner.step([0], [action])
            self.steps += 1
            # An env failure ends the branch unsolved, as it ends an episode in the driver.
            done = reply.done or reply.error is not None
            obs = self.cut(reply.observation)
            path = history + [(action, obs)]
            self.explored.append((action, obs, done))
            if done:
                self.last = (path, True)
                if reply.error is None and reply.info.get("success"):
                    return path
                continue
            if len(path) >= self.max_depth:
                self.last = (path, False)
            found = self.dfs(path)
            if found is not None:
                return found
        return None


class _Replay:
    """``make_expert`` of one path: its actions in order (the driver records the path)."""

    def __init__(self, path: History):
        self.actions = [a for a, _ in path] or [""]

    def __call__(self, task, error_rate, rng) -> "_Replay":
        del task, error_rate, rng
        self.next = 0
        return self

    def act(self, observation: str) -> str:
        del observation
        action = self.actions[min(self.next, len(self.actions) - 1)]
        self.next += 1
        return action


def _record(task, group, path, done, spec: RolloutSpec, runner: InlineRunner) -> Episode:
    """The path recorded by the rollout driver (``collect_episodes``): the path's actions
    replayed from reset through ``runner`` with the run's chat format, budgets (a path that
    did not end stops at its length, a step-budget truncation) and observation cut."""
    # A path that was not explored at all (no candidate) is one empty action.
    turns = spec.budget.max_turns if done else max(1, len(path))
    budget = dataclasses.replace(spec.budget, max_turns=turns)
    replay_spec = dataclasses.replace(spec, budget=budget, runner=runner)
    policy = ExpertTurnPolicy(_Replay(path), spec.chat, error_rate=0.0, seed=0)
    eps, _ = collect_episodes(
        policy,
        None,
        [task],
        samples_per_task=1,
        spec=replay_spec,
        key=jax.random.key(0),
        group_offset=group,
    )
    return eps[0]


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
        runner = InlineRunner(self.make_env)
        env = runner.env(0)
        if not supports_snapshot(env):
            runner.close()
            raise MethodError(
                f"dfsdt needs an environment with snapshot() and restore() (the SnapshotEnv "
                f"capability of jaxagent.envs.base); {type(env).__name__} has none: implement "
                "them or choose another method (reflexion, self_refine, best_of_n)"
            )
        proposer = self.proposer or PolicyProposer(policy, spec.chat, spec.system_prompt, params)
        limit = spec.budget.max_observation_chars

        def cut(text: str) -> str:
            return truncate_observation(text, limit) if limit else text

        out = []
        try:
            for i, task in enumerate(tasks):
                for k in range(samples_per_task):
                    out.append(
                        self._one(runner, proposer, task, i, k, samples_per_task, spec, key, cut)
                    )
        finally:
            runner.close()
        return out

    def _one(self, runner, proposer, task, i, k, samples_per_task, spec, key, cut) -> Episode:
        before = proposer.input_tokens
        (first,) = runner.reset([0], [task])
        if first.error is not None:  # recorded by the driver as it records any reset failure
            return _record(task, i, [], False, spec, runner)
        s = _Search(
            runner,
            task,
            cut(first.observation),
            proposer,
            self.max_children,
            spec.budget.max_turns,
            self.max_env_steps,
            jax.random.fold_in(key, i * samples_per_task + k),
            cut,
        )
        found = s.dfs([])
        path, ended = (found, True) if found is not None else (s.last or ([], False))
        ep = _record(task, i, path, ended, spec, runner)
        # Off-path branches: their actions were generated, their (non-final) observations
        # read; the path's own tokens are in the episode.
        gen = sum(len(spec.chat.action(a)) for a, _, _ in s.explored)
        gen -= sum(t.num_action_tokens for t in ep.turns)
        chat = spec.chat
        obs = sum(
            len(observation_after(chat, chat.decode(chat.action(a)), o))
            for a, o, d in s.explored
            if not d
        )
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
        return ep
