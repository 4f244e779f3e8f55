"""The rollout driver's seam: masks, log-probs, budgets and env failures.

The key test scripts a multi-turn episode (observations of different lengths per episode)
and checks, against the sampler's own outputs, that every token with loss_mask = 1 was
sampled by the policy, every prompt/observation token has 0, and the recorded log-probs equal
the learner's teacher-forced log-probs to 1e-4 in float32.
"""

import weakref

import jax
import numpy as np
import pytest
from episode_checks import assert_same_episodes

from jaxagent.agents.batch import pack_episodes
from jaxagent.agents.chat import ChatFormat
from jaxagent.agents.rollout import Budget, RolloutSpec, collect_episodes
from jaxagent.agents.runner import InlineRunner
from jaxagent.agents.sampling import ReferenceSampler
from jaxagent.agents.turn_policy import HostPolicy
from jaxagent.envs.base import FailureMode, StepResult, Task, Termination
from jaxagent.generate import SamplingConfig
from jaxagent.models import ModelConfig, init_model
from jaxagent.train.policy import make_logits_fn, make_logprob_fn, make_turn_sampler
from jaxagent.train.tokenizer import build_word_tokenizer

WORDS = "look at the box red blue green one two three four five ok done Action : ( )".split()


class ScriptedEnv:
    """Replies with observations whose length depends on the task and the turn; ends after
    ``turns`` steps, or crashes on a given turn."""

    def __init__(self):
        self.task = None
        self.t = 0

    def reset(self, task):
        self.task, self.t = task, 0
        return "look at the box " + " ".join(WORDS[4 : 4 + task.data["n"]])

    def step(self, action):
        self.t += 1
        if self.t == self.task.data.get("crash_at"):
            raise RuntimeError("tool server died")
        done = self.t >= self.task.data["turns"]
        obs = " ".join(WORDS[: 1 + (self.t * 3 + self.task.data["n"]) % 9])
        info = {
            "reward_terms": {"process": 0.1, "outcome": 0.0, "task": float(done)},
            "success": done,
            "failure_mode": None,
        }
        return StepResult(obs, reward=1.0 if done else 0.0, done=done, info=info)

    def close(self):
        pass


class RecordingSampler(HostPolicy):
    """Wraps a sampler and records what it produced per row, to check the driver's masks."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    @property
    def recompiles(self):
        return self.inner.recompiles

    def start(self, params, prompts, key, **texts):
        out = self.inner.start(params, prompts, key, **texts)
        self.calls.append(([list(p) for p in prompts], out))
        return out

    def resume(self, params, chunks, key, **texts):
        out = self.inner.resume(params, chunks, key, **texts)
        self.calls.append(([None if c is None else list(c) for c in chunks], out))
        return out


@pytest.fixture(scope="module")
def setup():
    tok = build_word_tokenizer(WORDS)
    chat = ChatFormat(tok)
    cfg = ModelConfig.test(vocab_size=len(tok), max_seq_len=256)
    graphdef, params = init_model(cfg, jax.random.key(0))
    return tok, chat, graphdef, params, cfg


def _tasks():
    return [
        Task(id="a", split="train", prompt="", data={"n": 2, "turns": 3}),
        Task(id="b", split="train", prompt="", data={"n": 5, "turns": 2}),
    ]


@pytest.mark.parametrize("kind", ["reference", "cached"])
def test_masks_and_logprobs_match_learner(setup, kind):
    tok, chat, graphdef, params, cfg = setup
    sampling = SamplingConfig(max_new_tokens=6, temperature=1.0, stop_token_ids=chat.stop_ids)
    sampler = RecordingSampler(
        make_turn_sampler(graphdef, sampling, 256, kind=kind, pad_id=chat.pad_id)
    )
    budget = Budget(max_turns=5, max_new_tokens=6, max_total_tokens=256)
    spec = RolloutSpec(chat, "one two", budget, InlineRunner(ScriptedEnv))
    eps, stats = collect_episodes(
        sampler, params, _tasks(), samples_per_task=2, spec=spec, key=jax.random.key(1)
    )
    assert [ep.group for ep in eps] == [0, 0, 1, 1]
    # Rebuild each episode from the sampler's own inputs and outputs.
    for row, ep in enumerate(eps):
        expect_tokens, expect_mask, expect_lp = [], [], []
        for inputs, out in sampler.calls:
            if inputs[row] is None:
                continue
            expect_tokens += inputs[row]
            expect_mask += [0] * len(inputs[row])
            expect_lp += [0.0] * len(inputs[row])
            expect_tokens += out.tokens[row]
            expect_mask += [1] * len(out.tokens[row])
            expect_lp += out.logprobs[row]
        assert ep.tokens == expect_tokens
        assert ep.loss_mask == expect_mask
        np.testing.assert_allclose(ep.logprobs, expect_lp, atol=0)
        assert ep.termination == Termination.TERMINATED and ep.success
        assert ep.num_turns == ep.task.data["turns"]
        # Observation chunks are exactly the chat-template rendering of each observation.
        for t in ep.turns[:-1]:
            assert t.num_observation_tokens == len(chat.observation(t.observation))
    batch = pack_episodes(eps, pad_id=chat.pad_id, max_len=256, length_multiple=16)
    lp, _ = make_logprob_fn(graphdef)(params, batch.tokens, batch.positions, batch.segment_ids)
    mask = np.asarray(batch.loss_mask)
    assert mask.sum() == sum(ep.num_policy_tokens for ep in eps) > 0
    np.testing.assert_allclose(np.asarray(lp) * mask, batch.old_logprobs * mask, atol=1e-4)
    assert batch.row_weight.tolist() == [1.0] * 4


def test_budgets_and_env_errors_are_labelled_and_kept(setup):
    tok, chat, graphdef, params, _ = setup
    sampling = SamplingConfig(max_new_tokens=4, temperature=1.0)
    sampler = ReferenceSampler(make_logits_fn(graphdef), sampling, 256)
    tasks = [
        Task(id="long", split="train", prompt="", data={"n": 1, "turns": 9}),
        Task(id="crash", split="train", prompt="", data={"n": 1, "turns": 9, "crash_at": 2}),
    ]
    spec = RolloutSpec(
        chat,
        "",
        Budget(max_turns=3, max_new_tokens=4, max_total_tokens=256),
        InlineRunner(ScriptedEnv),
    )
    eps, _ = collect_episodes(
        sampler, params, tasks, samples_per_task=1, spec=spec, key=jax.random.key(2)
    )
    long, crash = eps
    assert long.termination == Termination.TRUNCATED
    assert long.failure_mode == FailureMode.STEP_BUDGET.value and long.num_turns == 3
    # No stop ids: every turn hits the per-turn token limit.
    assert all(t.hit_token_limit and t.num_action_tokens == 4 for t in long.turns)
    assert crash.termination == Termination.ENV_ERROR and "tool server died" in crash.error
    assert crash.num_turns == 2
    batch = pack_episodes(eps, pad_id=0, max_len=256, rows_multiple=4)
    assert batch.tokens.shape[0] == 4 and batch.row_weight.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert batch.loss_mask[0].sum() == 12  # the crashed row keeps its tokens, weight 0
    # A total-token budget smaller than the next turn truncates before sampling it.
    spec = RolloutSpec(
        chat,
        "",
        Budget(max_turns=9, max_new_tokens=4, max_total_tokens=40),
        InlineRunner(ScriptedEnv),
    )
    eps, _ = collect_episodes(
        sampler, params, tasks[:1], samples_per_task=1, spec=spec, key=jax.random.key(3)
    )
    assert eps[0].failure_mode == FailureMode.STEP_BUDGET.value
    assert len(eps[0].tokens) <= 40


def test_fault_injection_through_the_pool_loses_no_episode(setup):
    """10% hangs + 10% crashes per env call: every episode comes back, failures labelled."""
    from jaxagent.agents.pool_runner import PoolRunner
    from jaxagent.envs.faults import FaultConfig, FaultLog, FaultyEnvFactory
    from jaxagent.pool import PoolConfig

    tok, chat, graphdef, params, cfg = setup
    sampling = SamplingConfig(max_new_tokens=4, temperature=1.0, stop_token_ids=chat.stop_ids)
    sampler = make_turn_sampler(graphdef, sampling, 256, kind="cached", pad_id=chat.pad_id)
    log = FaultLog.create("fork")
    env_fn = FaultyEnvFactory(
        lambda env_id: ScriptedEnv(), FaultConfig(hang=0.1, crash=0.1, hang_s=2.0, seed=3), log
    )
    runner = PoolRunner(
        env_fn,
        PoolConfig(
            num_envs=4,
            backend="thread",
            step_timeout_s=0.3,
            reset_timeout_s=0.3,
            max_retries=0,
            seed=1,
            start_method="fork",
        ),
    )
    tasks = [
        Task(id=f"t{i}", split="train", prompt="", data={"n": 1 + i % 4, "turns": 3})
        for i in range(12)
    ]
    try:
        spec = RolloutSpec(
            chat, "", Budget(max_turns=4, max_new_tokens=4, max_total_tokens=256), runner
        )
        eps, _ = collect_episodes(
            sampler, params, tasks, samples_per_task=2, spec=spec, key=jax.random.key(4)
        )
        health = runner.health()
    finally:
        runner.close()
    assert len(eps) == 24 and [ep.task.id for ep in eps[::2]] == [t.id for t in tasks]
    failed = [ep for ep in eps if ep.env_failed]
    faults = log.counts()
    assert faults["hang"] + faults["crash"] > 0 and failed
    # Every injected fault ended exactly one episode, labelled env_error with the reason.
    assert len(failed) == faults["hang"] + faults["crash"]
    assert all(ep.failure_mode == FailureMode.ENV_ERROR.value and ep.error for ep in failed)
    assert all(
        ep.termination == Termination.TERMINATED and ep.success for ep in eps if not ep.env_failed
    )
    assert health.get("timeouts", 0) >= faults["hang"]


class CacheWatch(HostPolicy):
    """Forwards to a ``CachedTurnSampler`` and keeps weak references to its cache's buffers
    after every call (none of them alive through the watch itself)."""

    def __init__(self, inner):
        self.inner, self.refs = inner, []

    @property
    def recompiles(self):
        return self.inner.recompiles

    def _watch(self, out):
        self.refs += [weakref.ref(x) for x in jax.tree.leaves(self.inner._cache)]
        return out

    def start(self, params, prompts, key, **texts):
        return self._watch(self.inner.start(params, prompts, key, **texts))

    def resume(self, params, chunks, key, **texts):
        return self._watch(self.inner.resume(params, chunks, key, **texts))

    def release(self):
        self.inner.release()


class KeepsCache(HostPolicy):
    """A cached sampler whose cache is never released (the behaviour before ``release``)."""

    def __init__(self, inner):
        self.inner = inner
        self.recompiles = 0
        self.start, self.resume = inner.start, inner.resume


def test_the_kv_cache_is_freed_when_the_episodes_end(setup):
    _, chat, graphdef, params, _ = setup
    sampling = SamplingConfig(max_new_tokens=6, temperature=1.0, stop_token_ids=chat.stop_ids)
    budget = Budget(max_turns=5, max_new_tokens=6, max_total_tokens=256)
    spec = RolloutSpec(chat, "one two", budget, InlineRunner(ScriptedEnv))

    def collect(policy, seed):
        eps, _ = collect_episodes(
            policy, params, _tasks(), samples_per_task=2, spec=spec, key=jax.random.key(seed)
        )
        return [(ep.tokens, ep.logprobs, ep.termination) for ep in eps]

    cached = make_turn_sampler(graphdef, sampling, 256, kind="cached", pad_id=chat.pad_id)
    watch = CacheWatch(cached)
    first = collect(watch, 5)
    assert cached._cache is None and watch.refs
    live = jax.live_arrays()
    for ref in watch.refs:  # every buffer the cache ever had is gone or deleted
        x = ref()
        assert x is None or (x.is_deleted() and not any(a is x for a in live))
    # The next rollout starts afresh and samples exactly what it would have with the cache
    # kept alive in between.
    second = collect(watch, 6)
    kept = KeepsCache(make_turn_sampler(graphdef, sampling, 256, kind="cached", pad_id=chat.pad_id))
    assert collect(kept, 5) == first
    assert kept.inner._cache is not None  # this one would carry it into the update
    assert collect(kept, 6) == second


def test_a_prompt_over_the_budget_is_a_prompt_overflow(setup):
    from jaxagent.eval.report import summarize

    _, chat, graphdef, params, _ = setup
    sampling = SamplingConfig(max_new_tokens=4, temperature=1.0, stop_token_ids=chat.stop_ids)
    sampler = ReferenceSampler(make_logits_fn(graphdef), sampling, 256)
    short, long = _tasks()  # first observations of 2 and 5 colour words
    n_short = len(chat.prompt("", ScriptedEnv().reset(short)))
    n_long = len(chat.prompt("", ScriptedEnv().reset(long)))
    assert n_long > n_short
    budget = Budget(max_turns=1, max_new_tokens=4, max_total_tokens=n_short + 4)
    spec = RolloutSpec(chat, "", budget, InlineRunner(ScriptedEnv))
    eps, _ = collect_episodes(
        sampler, params, [short, long], samples_per_task=1, spec=spec, key=jax.random.key(7)
    )
    ok, over = eps
    assert ok.num_turns == 1 and ok.termination != Termination.PROMPT_OVERFLOW
    assert over.termination == Termination.PROMPT_OVERFLOW != Termination.TRUNCATED
    assert over.failure_mode == FailureMode.PROMPT_OVERFLOW.value == "prompt_overflow"
    assert over.num_turns == 0 and over.tokens == [] and over.info["prompt_tokens"] == n_long
    batch = pack_episodes(eps, pad_id=0, max_len=256, length_multiple=16)
    assert batch.row_weight.tolist() == [1.0, 0.0] and batch.truncated[1] == 0
    metrics = summarize(eps).as_metrics("train")
    assert metrics["train/failure/prompt_overflow"] == 1


def test_a_groups_first_prompt_is_prefilled_once(setup):
    from jaxagent.agents.cached import CachedTurnSampler

    _, chat, graphdef, params, _ = setup
    k = 3
    sampling = SamplingConfig(max_new_tokens=6, temperature=1.0, stop_token_ids=chat.stop_ids)
    budget = Budget(max_turns=5, max_new_tokens=6, max_total_tokens=256)
    spec = RolloutSpec(chat, "one two", budget, InlineRunner(ScriptedEnv))
    results = {}
    for share in (False, True):
        policy = CachedTurnSampler(graphdef, sampling, 256, chat.pad_id, share_prompts=share)
        recorder = RecordingSampler(policy)
        eps, _ = collect_episodes(
            recorder, params, _tasks(), samples_per_task=k, spec=spec, key=jax.random.key(9)
        )
        first_prompts = recorder.calls[0][0]
        later = sum(len(c) for inputs, _ in recorder.calls[1:] for c in inputs if c)
        results[share] = (eps, policy.prefilled_tokens - later, first_prompts)
    (plain, plain_tokens, prompts), (shared, shared_tokens, _) = results[False], results[True]
    # The same episodes, token for token and log-prob for log-prob.
    assert_same_episodes(shared, plain)
    # The first turn prefilled each task's prompt once instead of K times.
    assert plain_tokens == sum(map(len, prompts))
    assert shared_tokens * k == plain_tokens
