"""DFSDT (tree search over snapshot/restore) and best-of-N.

A constructed fork world where the greedy first choice leads into a dead end two steps down
and only the second choice at the root reaches the goal: the greedy policy (``max_children=1``)
must miss it, DFSDT must find it by restoring the environment and backtracking. The quickstart
world's ``snapshot()`` / ``restore()`` must replay exactly, and DFSDT on it with the
look-alike proposer must solve the tasks the greedy look-alike policy fails. An environment
without the capability is refused with a readable error.
"""

import copy

import jax
import pytest

from jaxagent.agents.chat import ChatFormat
from jaxagent.agents.expert import ExpertTurnPolicy
from jaxagent.agents.methods import DFSDT, BestOfN, MethodError, ScriptedProposer
from jaxagent.envs.tools.quickstart.scripted import LookalikeExpert, lookalike_candidates
from jaxagent.agents.rollout import Budget, RolloutSpec, collect_episodes
from jaxagent.agents.runner import InlineRunner
from jaxagent.envs.base import StepResult, Task, supports_snapshot
from jaxagent.envs.tools.quickstart import QuickstartConfig, QuickstartEnv, QuickstartWorld
from jaxagent.envs.tools.quickstart import ExpertPolicy, vocabulary
from jaxagent.eval.judge import ClaimJudge
from jaxagent.eval.protocol import EvalGroup, build_record
from jaxagent.train.tokenizer import build_word_tokenizer

# node -> {action: next node}; "goal" succeeds, a node without children is a dead end
TREE = {
    "root": {"left": "a", "right": "b"},
    "a": {"left": "a1", "right": "a2"},
    "a1": {},
    "a2": {},
    "b": {"left": "goal", "right": "b2"},
    "b2": {},
}


class ForkWorld:
    """Walk the tree with ``Action : go ( door = " left " )``-style words: ``left`` / ``right``."""

    def reset(self, task):
        self.node, self.steps = "root", 0
        return "task : find the goal"

    def step(self, action):
        self.steps += 1
        door = "left" if "left" in action else "right"
        self.node = TREE[self.node].get(door, self.node)
        if self.node == "goal":
            return StepResult("done", 1.0, True, {"success": True, "failure_mode": None})
        if not TREE[self.node]:
            return StepResult("dead end", 0.0, True, {"success": False, "failure_mode": "gave_up"})
        return StepResult(f"at {self.node}", 0.0, False, {"success": False})

    def close(self):
        pass


class SnapshotForkWorld(ForkWorld):
    def snapshot(self):
        return copy.deepcopy((self.node, self.steps))

    def restore(self, snap):
        self.node, self.steps = snap


def _left_first(task, history, first_obs):
    return ["left", "right"]  # the greedy preference: always left first


@pytest.fixture(scope="module")
def chat():
    words = vocabulary() + "find goal left right dead end at a a1 a2 b b2 claimed".split()
    return ChatFormat(build_word_tokenizer(words))


def _spec(chat, factory, max_turns=6):
    budget = Budget(max_turns=max_turns, max_new_tokens=64, max_total_tokens=4096)
    return RolloutSpec(chat, "", budget, InlineRunner(factory))


def test_dfsdt_finds_what_greedy_misses_on_a_fork_world(chat):
    task = Task("fork", "test", "find the goal")
    spec, key = _spec(chat, SnapshotForkWorld), jax.random.key(0)
    proposer = ScriptedProposer(_left_first)
    greedy = DFSDT(SnapshotForkWorld, proposer, max_children=1).run(
        None, None, [task], samples_per_task=1, spec=spec, key=key
    )[0]
    assert not greedy.success and [t.action for t in greedy.turns] == ["left", "left"]
    assert greedy.info["method"]["restores"] == 0
    ep = DFSDT(SnapshotForkWorld, proposer, max_children=2).run(
        None, None, [task], samples_per_task=1, spec=spec, key=key
    )[0]
    assert ep.success and [t.action for t in ep.turns] == ["right", "left"]
    m = ep.info["method"]
    # a1 and a2 dead ends, back to the root, then b -> goal: 5 steps, 2 restores
    assert m["env_steps"] == 5 and m["restores"] == 2 and m["path_length"] == 2
    # the recorded episode is the path, tokenised as collect_episodes would
    assert ep.tokens[: len(chat.prompt("", "task : find the goal"))] == chat.prompt(
        "", "task : find the goal"
    )
    assert ep.info["method_tokens"]["generated"] == 3 * len(chat.action("left"))
    # the step budget bounds the search
    capped = DFSDT(SnapshotForkWorld, proposer, max_children=2, max_env_steps=3).run(
        None, None, [task], samples_per_task=1, spec=spec, key=key
    )[0]
    assert not capped.success and capped.info["method"]["env_steps"] == 3


def test_dfsdt_refuses_an_env_without_snapshot(chat):
    assert not supports_snapshot(ForkWorld()) and supports_snapshot(SnapshotForkWorld())
    method = DFSDT(ForkWorld, ScriptedProposer(_left_first))
    with pytest.raises(MethodError, match=r"snapshot\(\) and restore\(\).*ForkWorld has none"):
        method.run(
            None,
            None,
            [Task("f", "test", "x")],
            samples_per_task=1,
            spec=_spec(chat, ForkWorld),
            key=jax.random.key(0),
        )


def test_quickstart_snapshot_restore_replays_exactly():
    tasks = QuickstartWorld(QuickstartConfig(num_train=0, num_test=30)).tasks("test")
    task = next(t for t in tasks if len(t.data["plan"]) >= 2)
    env = QuickstartEnv()
    expert = LookalikeExpert(task)
    obs = env.reset(task)
    first = env.step(expert.act(obs))
    snap = env.snapshot()
    state = copy.deepcopy(env.state)
    action = expert.act(first.observation)
    a = env.step(action)
    after = copy.deepcopy(env.state)
    env.restore(snap)
    assert env.state == state  # later steps did not alias the snapshot
    b = env.step(action)
    assert (a.observation, a.reward, a.done, a.info) == (b.observation, b.reward, b.done, b.info)
    assert env.state == after
    # restoring a finished episode makes it steppable again
    while not env.step("Final : 0").done:
        pass
    env.restore(snap)
    c = env.step(action)
    assert (c.observation, c.reward, c.done, c.info) == (b.observation, b.reward, b.done, b.info)


def test_dfsdt_on_quickstart_fixes_the_lookalike_policy(chat):
    tasks = QuickstartWorld(QuickstartConfig(num_train=0, num_test=40)).tasks("test")
    spec, key = _spec(chat, QuickstartEnv), jax.random.key(0)
    proposer = ScriptedProposer(lookalike_candidates)
    greedy = DFSDT(QuickstartEnv, proposer, max_children=1).run(
        None, None, tasks, samples_per_task=1, spec=spec, key=key
    )
    base, _ = collect_episodes(
        ExpertTurnPolicy(LookalikeExpert, chat, error_rate=0.0, seed=0),
        None,
        tasks,
        samples_per_task=1,
        spec=spec,
        key=key,
    )
    # the greedy search is the policy itself: same actions, same outcomes
    assert [[t.action for t in e.turns] for e in greedy] == [
        [t.action for t in e.turns] for e in base
    ]
    assert sum(e.success for e in greedy) < len(tasks)
    found = DFSDT(QuickstartEnv, proposer, max_children=2).run(
        None, None, tasks, samples_per_task=1, spec=spec, key=key
    )
    assert all(e.success for e in found)
    fixed = [f for f, g in zip(found, greedy) if not g.success]
    assert fixed and all(f.info["method"]["restores"] >= 1 for f in fixed)
    rg = build_record([EvalGroup(greedy)], reps=100)
    rf = build_record([EvalGroup(found)], reps=100)
    assert rf["tokens"]["generated"] > rg["tokens"]["generated"]  # the branches cost


def test_best_of_n_with_env_checker_and_with_a_judge(chat):
    tasks = QuickstartWorld(QuickstartConfig(num_train=0, num_test=20)).tasks("test")
    spec, key = _spec(chat, QuickstartEnv), jax.random.key(0)
    policy = ExpertTurnPolicy(ExpertPolicy, chat, error_rate=0.6, seed=0)
    cands, _ = collect_episodes(policy, None, tasks, samples_per_task=4, spec=spec, key=key)
    any_ok = [any(e.success for e in cands[i * 4 : (i + 1) * 4]) for i in range(len(tasks))]
    eps = BestOfN(n=4).run(policy, None, tasks, samples_per_task=1, spec=spec, key=key)
    # the env checker is an oracle: best-of-4 succeeds exactly where some candidate did
    assert [e.success for e in eps] == any_ok
    assert sum(any_ok) > sum(e.success for e in cands[::4])
    one = build_record([EvalGroup(cands[::4])], reps=100)["tokens"]["generated"]
    assert build_record([EvalGroup(eps)], reps=100)["tokens"]["generated"] > 2 * one
    judged = BestOfN(n=4, judge=ClaimJudge()).run(
        policy, None, tasks, samples_per_task=1, spec=spec, key=key
    )
    assert all(e.info["method"]["verifier"] == "ClaimJudge" for e in judged)
    # the judge cannot see the world: it keeps some failures the checker would not
    assert sum(e.success for e in judged) <= sum(e.success for e in eps)


class CrashyForkWorld(SnapshotForkWorld):
    """``left`` from the root raises: a broken branch, not a broken run."""

    def step(self, action):
        if self.node == "root" and "left" in action:
            raise RuntimeError("the left door is broken")
        return super().step(action)


def test_dfsdt_steps_through_a_runner_a_crash_ends_the_branch_not_the_search(chat):
    task = Task("fork", "test", "find the goal")
    spec = _spec(chat, CrashyForkWorld)
    ep = DFSDT(CrashyForkWorld, ScriptedProposer(_left_first), max_children=2).run(
        None, None, [task], samples_per_task=1, spec=spec, key=jax.random.key(0)
    )[0]
    # the crashed branch is abandoned (the runner restarts its env) and the search restores
    # the root into the fresh env, then finds the goal on the right
    assert ep.success and [t.action for t in ep.turns] == ["right", "left"]
    assert ep.info["method"]["env_steps"] == 3 and ep.info["method"]["restores"] == 1


def test_dfsdt_path_is_recorded_by_the_driver_with_its_observation_cut(chat):
    task = Task("fork", "test", "find the goal")
    budget = Budget(max_turns=6, max_new_tokens=64, max_total_tokens=4096, max_observation_chars=64)
    spec = RolloutSpec(chat, "", budget, InlineRunner(WordyForkWorld))
    seen = []

    def propose(task, history, first_obs):
        seen.append(first_obs)
        return _left_first(task, history, first_obs)

    ep = DFSDT(WordyForkWorld, ScriptedProposer(propose), max_children=2).run(
        None, None, [task], samples_per_task=1, spec=spec, key=jax.random.key(0)
    )[0]
    ref, _ = collect_episodes(
        ExpertTurnPolicy(lambda t, e, r: _Path(["right", "left"]), chat, error_rate=0.0, seed=0),
        None,
        [task],
        samples_per_task=1,
        spec=spec,
        key=jax.random.key(0),
    )
    # the same tokens, mask and cut observations as the driver's own episode of that path
    assert ep.tokens == ref[0].tokens and ep.loss_mask == ref[0].loss_mask
    assert [t.observation for t in ep.turns] == [t.observation for t in ref[0].turns]
    assert len(ep.first_observation) <= 64 < len(WordyForkWorld().reset(task))  # cut
    assert set(seen) == {ep.first_observation}  # the proposer reads the cut text too


class WordyForkWorld(SnapshotForkWorld):
    def reset(self, task):
        super().reset(task)
        return "task : find the goal " + "a " * 60


class _Path:
    def __init__(self, actions):
        self.actions = list(actions)

    def act(self, observation):
        return self.actions.pop(0)
