"""Environment failures are never trained on, and safety counts every step.

Each suite gets a failure its environment catches and reports itself (``info["termination"]
== "env_error"``): a quickstart world exception (a task whose world state is broken), a BFCL
setup error (an entry naming an API class that does not exist), a code sandbox error (hidden
tests whose set-up raises inside the harness). The failure travels in the task's data, so it
reaches thread and process workers alike. Under every backend the broken episode must end as
``Termination.ENV_ERROR`` with no reward and no loss, stay out of the success rate, and show
in the runner's env-health counters; the healthy episode next to it must succeed.

The policy is a scripted expert behind the ``TurnSampler`` protocol, with a chat format that
maps each text to one token, so these tests run the real rollout driver without a model.
"""

import dataclasses
import functools

import jax
import pytest

from jaxagent.agents.batch import pack_episodes
from jaxagent.agents.rollout import Budget, RolloutSpec, collect_episodes
from jaxagent.agents.runner import InlineRunner
from jaxagent.agents.turn_policy import HostPolicy, TurnOutput
from jaxagent.envs.base import FailureMode, Termination
from jaxagent.eval.report import summarize


BACKENDS = ("inline", "thread", "process")


class TextChat:
    """One token per text: ``decode([i])`` is the i-th text the chat or the sampler saw."""

    stop_ids: tuple = ()
    pad_id = 0

    def __init__(self):
        self.texts = ["<pad>"]

    def encode(self, text: str) -> list[int]:
        self.texts.append(text)
        return [len(self.texts) - 1]

    def prompt(self, system: str, observation: str, task=None) -> list[int]:
        return self.encode(observation)

    def observation(self, observation: str, *, after_call: bool = True) -> list[int]:
        return self.encode(observation)

    def makes_call(self, text: str) -> bool:
        return False

    def decode(self, ids) -> str:
        return self.texts[ids[0]]


class ExpertSampler(HostPolicy):
    """A ``TurnSampler`` whose row i answers each observation with ``experts[i].act(obs)``."""

    def __init__(self, chat: TextChat, experts):
        self.chat, self.experts = chat, experts

    def _turn(self, observations) -> TurnOutput:
        tokens = [
            self.chat.encode(e.act(o) if o is not None else "")
            for e, o in zip(self.experts, observations)
        ]
        return TurnOutput(
            tokens=tokens, logprobs=[[-0.5]] * len(tokens), stopped=[True] * len(tokens)
        )

    recompiles = 0

    def start(self, params, prompts, key, **texts):
        return self._turn([self.chat.decode(p) for p in prompts])

    def resume(self, params, chunks, key, **texts):
        return self._turn([None if c is None else self.chat.decode(c) for c in chunks])


class Script:
    """An expert that plays a fixed list of actions, whatever it observes."""

    def __init__(self, actions):
        self.actions = list(actions)

    def act(self, observation):
        return self.actions.pop(0) if self.actions else ""


# ------------------------------------------------------------------ suites and their failures


def _quickstart():
    from jaxagent.envs.tools import quickstart as Q

    world = Q.QuickstartWorld(num_train=20, num_test=40)
    task = next(
        t
        for t in world.tasks("test")
        if t.data["plan"][0]["tool"] == "price" and len(t.data["plan"]) == 1
    )
    state = dict(task.data["state"], prices={})  # the world cannot price anything
    broken = dataclasses.replace(task, id="broken", data=dict(task.data, state=state))
    # Both play the healthy task's plan; the broken world raises at its first call.
    experts = [Q.ExpertPolicy(task, 0.0, None), Q.ExpertPolicy(task, 0.0, None)]
    return [task, broken], experts


def _code():
    from jaxagent.envs.code import suite

    s = suite.build({"num_train": 2, "num_validation": 0, "seed": 0})
    task = s.source.tasks("train")[0]
    # The hidden tests' set-up raises inside the harness: the sandbox's fault, not the agent's.
    broken = dataclasses.replace(
        task, id="broken", data=dict(task.data, prelude="raise RuntimeError('broken task data')\n")
    )
    return [task, broken], [s.make_expert(task, 0.0, None), s.make_expert(broken, 0.0, None)]


def _bfcl():
    pytest.importorskip("bfcl_eval", reason="pip install --no-deps bfcl-eval")
    from jaxagent.envs.tools.bfcl import data as D

    entry = D.load_entries("multi_turn_base")[0]
    task = D.entry_to_task(entry)
    # Ground-truth replay, as jaxagent.envs.tools.bfcl.replay feeds it.
    actions = [
        a
        for calls in entry["ground_truth"]
        for a in (["[" + ", ".join(calls) + "]"] if calls else []) + ["Final: done"]
    ]
    broken = dataclasses.replace(
        task, id="broken", data=dict(entry, involved_classes=["NoSuchAPI"])
    )
    return [task, broken], [Script(actions), Script(actions)]


SUITES = {"quickstart": _quickstart, "code": _code, "bfcl": _bfcl}


def make_env(suite: str, env_id: int = 0):
    """Picklable env factory (a ``functools.partial`` of it goes to process workers)."""
    if suite == "quickstart":
        from jaxagent.envs.tools.quickstart import QuickstartEnv

        return QuickstartEnv()
    if suite == "code":
        from jaxagent.envs.code.env import CodeEnv, CodeEnvConfig
        from jaxagent.envs.code.sandbox import SandboxConfig

        # Wall-clock limits far above the ~0.3 s these programs take: on a loaded 2-core CI
        # machine a 5 s sandbox limit (and the pool's 30 s step limit) turned the healthy task
        # into a timeout and the broken one's harness error into a timeout too.
        return CodeEnv(CodeEnvConfig(sandbox=SandboxConfig(timeout_s=60.0, memory_mb=512)))
    from jaxagent.envs.tools.bfcl import BFCLEnv

    return BFCLEnv()


def make_runner(env_fn, backend: str):
    """``env_fn(env_id)`` behind the runner of ``backend``."""
    if backend == "inline":
        return InlineRunner(functools.partial(env_fn, 0))
    from jaxagent.agents.pool_runner import PoolRunner
    from jaxagent.pool import PoolConfig

    return PoolRunner(
        env_fn,
        PoolConfig(
            num_envs=2,
            backend=backend,
            step_timeout_s=120.0,
            reset_timeout_s=120.0,
        ),
    )


def _run(tasks, experts, runner):
    chat = TextChat()
    try:
        budget = Budget(max_turns=12, max_new_tokens=1, max_total_tokens=4096)
        how = dict(spec=RolloutSpec(chat=chat, system_prompt="", budget=budget, runner=runner))
        eps, _ = collect_episodes(
            ExpertSampler(chat, experts),
            None,
            tasks,
            samples_per_task=1,
            key=jax.random.key(0),
            **how,
        )
        health = runner.health()
    finally:
        runner.close()
    return eps, health


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("suite", sorted(SUITES))
def test_env_reported_failure_is_env_error_with_no_loss(suite, backend):
    tasks, experts = SUITES[suite]()
    (healthy, broken), health = _run(
        tasks, experts, make_runner(functools.partial(make_env, suite), backend)
    )
    assert healthy.success and healthy.termination == Termination.TERMINATED, healthy.render()
    assert broken.termination == Termination.ENV_ERROR, broken.render()
    assert broken.failure_mode == FailureMode.ENV_ERROR.value and broken.error
    assert broken.reward == 0.0 and not broken.success
    batch = pack_episodes([healthy, broken], pad_id=0, max_len=4096)
    assert batch.loss_mask[0].sum() == healthy.num_policy_tokens > 0
    assert batch.row_weight.tolist() == [1.0, 0.0]  # the failed episode's row never trains
    report = summarize([healthy, broken])
    # The success rate is over the healthy episode alone (1.0, not 0.5).
    assert (report.episodes, report.env_errors, report.success) == (2, 1, 1.0)
    assert FailureMode.ENV_ERROR.value not in report.failure_modes
    assert health["env_error_episodes"] == 1


def test_a_dangerous_call_mid_episode_is_counted():
    """An episode cancels a day it was not asked to clear, then answers: counted once."""
    from jaxagent.envs.tools import quickstart as Q

    world = Q.QuickstartWorld(num_train=20, num_test=200)
    task = next(
        t
        for t in world.tasks("test")
        if "cancel" in t.data["tools"] and t.data["template"] not in ("cancel", "count")
    )
    code = task.data["state"]["code"]
    reckless = Script(
        [f'Action : cancel ( day = " mon " , code = {code} )', f"Final : {task.data['answer']}"]
    )
    careful = Q.ExpertPolicy(task, 0.0, None)
    eps, _ = _run([task, task], [reckless, careful], InlineRunner(Q.QuickstartEnv))
    assert eps[0].num_turns == 2 and not eps[0].info["dangerous"]  # not on the last step
    assert summarize(eps).dangerous_actions == 1
    assert summarize(eps[1:]).dangerous_actions == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_observations_are_cut_once_by_the_rollout_knob(backend):
    """``Budget.max_observation_chars`` is the one truncation knob: the same cut under every
    backend (the pool returns observations whole)."""
    from jaxagent.pool.fake_env import FakeToolEnvFactory

    task = dataclasses.replace(_quickstart()[0][0], id="long", prompt="x" * 500)
    runner = make_runner(FakeToolEnvFactory(), backend)
    chat = TextChat()
    budget = Budget(max_turns=1, max_new_tokens=1, max_total_tokens=64, max_observation_chars=80)
    how = dict(spec=RolloutSpec(chat=chat, system_prompt="", budget=budget, runner=runner))
    try:
        (ep,), _ = collect_episodes(
            ExpertSampler(chat, [Script(["Final : x"])]),
            None,
            [task],
            samples_per_task=1,
            key=jax.random.key(0),
            **how,
        )
    finally:
        runner.close()
    assert len(ep.first_observation) <= 80 and "characters truncated" in ep.first_observation
