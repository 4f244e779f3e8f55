"""Scripted experts speak through the one episode loop (``ExpertTurnPolicy``).

SFT demonstrations are collected by ``collect_episodes`` like the policy's own episodes. The
reference here is the closed loop SFT used before (one environment, the expert acting on
each observation, its text tokenised with ``Chat.action``): an error-free expert must give
exactly its demonstrations (tokens, loss mask, success), and an erring one the same error
statistics (its mistakes now come from one generator per task instead of one shared
generator, so the individual demonstrations differ).
"""

import dataclasses
from pathlib import Path

import numpy as np
import pytest

import jaxagent
from jaxagent.agents.episode import Episode
from jaxagent.agents.expert import ExpertTurnPolicy
from jaxagent.agents.runner import InlineRunner
from jaxagent.train.config import load_config
from jaxagent.train.sft import expert_episodes

ROOT = Path(jaxagent.__file__).parent.parent


def reference_demos(env_spec, tasks, chat, system, error_rate, seed, max_turns):
    """The expert's closed loop without the driver: (tokens, loss mask, success) per task."""
    rng = np.random.default_rng([seed, 7])
    env = env_spec.make_env()
    out = []
    for task in tasks:
        ep = Episode(task=task, group=0)
        obs = env.reset(task)
        ep.append(chat.prompt(system, obs), sampled=False)
        expert = env_spec.make_expert(task, error_rate, rng)
        success = False
        for turn in range(max_turns):
            action = expert.act(obs)
            ids = chat.action(action)
            ep.append(ids, sampled=True, logprobs=[0.0] * len(ids))
            res = env.step(action)
            if res.done:
                success = bool(res.info.get("success"))
                break
            obs = res.observation
            if turn + 1 < max_turns:
                ep.append(chat.observation(obs), sampled=False)
        out.append((ep.tokens, ep.loss_mask, success))
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from jaxagent.train.run import build_run

    config = load_config(
        ROOT / "configs/quickstart.yaml",
        [
            "env.options.num_train=300",
            "env.options.num_test=4",
            "eval.val_tasks=0",
            f"train.out_dir={tmp_path_factory.mktemp('expert')}",
        ],
    )
    run = build_run(config)
    yield run
    run.close()


def _demos(run, tasks, error_rate):
    spec = dataclasses.replace(run.rollout, runner=InlineRunner(run.env.make_env))
    return expert_episodes(
        run.env.make_expert, tasks, spec, error_rate=error_rate, seed=0, chunk=64
    )


def test_error_free_demos_equal_the_reference_loop(run):
    tasks = run.tasks.sft[:120]
    demos = _demos(run, tasks, 0.0)
    ref = reference_demos(
        run.env, tasks, run.chat, run.env.system_prompt, 0.0, 0, run.budget.max_turns
    )
    assert [d.group for d in demos] == list(range(len(tasks)))  # across driver chunks too
    for demo, (tokens, mask, success) in zip(demos, ref):
        assert demo.tokens == tokens and demo.loss_mask == mask
        assert demo.success == success and demo.logprobs == [0.0] * len(tokens)
        # The environment saw the decoded tokens, which for this vocabulary are the text.
        for turn in demo.turns:
            assert run.chat.decode(run.chat.action(turn.action)) == turn.action
    assert all(d.success for d in demos)


def test_erring_expert_keeps_its_error_statistics_and_is_call_independent(run):
    tasks = run.tasks.sft[:300]
    demos = _demos(run, tasks, 0.5)
    ref = reference_demos(
        run.env, tasks, run.chat, run.env.system_prompt, 0.5, 0, run.budget.max_turns
    )
    new_rate = np.mean([d.success for d in demos])
    ref_rate = np.mean([s for _, _, s in ref])
    # Two binomial samples of 300 with p ~ 0.5: the difference has sd ~ 0.041; allow 3 sd.
    assert abs(new_rate - ref_rate) < 0.125, (new_rate, ref_rate)
    assert 0.3 < new_rate < 0.75
    # A task's demonstration depends on the seed and the task alone, not on its batch.
    alone = _demos(run, tasks[5:6], 0.5)[0]
    assert alone.tokens == demos[5].tokens


def test_expert_policy_rows_follow_the_driver():
    from jaxagent.envs.base import Task

    class Echo:
        def __init__(self, task, error_rate, rng):
            self.task = task

        def act(self, observation):
            return f"{self.task.id}:{observation}"

    class Chat:
        stop_ids, pad_id = (0,), 0

        def action(self, text):
            return [len(text), 0]

    policy = ExpertTurnPolicy(Echo, Chat(), error_rate=0.0, seed=0)
    tasks = [Task(id="a", split="train", prompt=""), Task(id="bb", split="train", prompt="")]
    out = policy.start(None, [[1], [1]], None, tasks=tasks, observations=["x", None])
    assert out.tokens == [[3, 0], []] and out.stopped == [True, False]
    out = policy.resume(None, [None, [2]], None, observations=[None, "yy"])
    assert out.tokens == [[], [5, 0]] and out.logprobs == [[], [0.0, 0.0]]
    assert policy.recompiles == 0
    with pytest.raises(ValueError, match="one row per episode"):
        policy.resume(None, [None], None, observations=[None])


def test_evaluate_reports_on_any_turn_policy(run):
    """``evaluate`` takes any turn policy: an error-free expert scores 1, an always-wrong one 0."""
    import jax

    from jaxagent.agents.evaluate import evaluate

    tasks = run.tasks.eval
    for error_rate, success in ((0.0, 1.0), (1.0, 0.0)):
        policy = ExpertTurnPolicy(run.env.make_expert, run.chat, error_rate=error_rate, seed=0)
        result = evaluate(policy, tasks, run.rollout, jax.random.key(0), samples_per_task=2)
        assert result.report.episodes == 2 * len(tasks) == len(result.episodes)
        assert result.report.success == success and result.report.env_errors == 0
        m = result.metrics("eval")
        assert m["eval/success"] == success and m["time/eval_s"] >= 0


def test_observation_weight_puts_loss_on_the_other_tokens_of_each_demo():
    # sft.observation_weight w: 1 on actions, w on prompt / observation tokens, 0 on each
    # episode's first token (nothing in its episode predicts it) and on padding.
    from jaxagent.train.sft import pack_dense

    a = Episode(task=None, group=0, tokens=[1, 2, 3, 4, 5], loss_mask=[0, 0, 1, 1, 0])
    b = Episode(task=None, group=1, tokens=[1, 7, 8], loss_mask=[0, 1, 0])
    plain = pack_dense([a, b], row_len=10, pad_id=0)
    np.testing.assert_array_equal(plain["loss_mask"][0], [0, 0, 1, 1, 0, 0, 1, 0, 0, 0])
    mixed = pack_dense([a, b], row_len=10, pad_id=0, observation_weight=0.25)
    q = 0.25
    np.testing.assert_allclose(mixed["loss_mask"][0], [0, q, 1, 1, q, 0, 1, q, 0, 0])
    np.testing.assert_array_equal(mixed["segment_ids"][0], [1, 1, 1, 1, 1, 2, 2, 2, 0, 0])
    with pytest.raises(Exception, match="observation_weight"):
        load_config(ROOT / "configs/web_quickstart.yaml", ["sft.observation_weight=1.5"])


def test_sft_microbatches_give_the_whole_batch_step():
    # sft.microbatch_size: gradients summed over microbatches that each divide by the whole
    # batch's loss-token count equal one pass over the batch (token_mean). SGD, so the
    # parameters after a step compare the gradients themselves (Adam's first step is
    # lr * sign(g) and would hide a scale error); float32 sums in another order differ by
    # ~1e-7 relative, the 1e-5 tolerance is far from any missing or doubled microbatch.
    import jax
    import optax

    from jaxagent.models import ModelConfig, init_model
    from jaxagent.train.sft import make_sft_step

    graphdef, params = init_model(ModelConfig.test(num_layers=2), jax.random.key(0))
    rng = np.random.default_rng(0)
    rows, t = 4, 24
    tokens = rng.integers(0, 128, (rows, t)).astype(np.int32)
    segments = np.ones((rows, t), np.int32)
    segments[:, 14:] = 2
    segments[1, 20:] = 0  # padding
    positions = np.concatenate([np.arange(14), np.arange(t - 14)])[None].repeat(rows, 0)
    # uneven loss tokens per row: a per-microbatch mean would weigh rows differently
    mask = (rng.random((rows, t)) < np.array([[0.1], [0.3], [0.6], [0.9]])).astype(np.float32)
    mask *= segments > 0
    out = {}
    for micro in (0, 1, 2):
        step = make_sft_step(graphdef, optax.sgd(1.0), micro)
        p = jax.tree.map(np.array, params)
        new, _, loss = step(p, optax.sgd(1.0).init(p), tokens, positions, segments, mask)
        out[micro] = (float(loss), new)
    for micro in (1, 2):
        np.testing.assert_allclose(out[micro][0], out[0][0], rtol=1e-6)
        diff = jax.tree.map(lambda a, b: float(np.max(np.abs(a - b))), out[micro][1], out[0][1])
        assert max(jax.tree.leaves(diff)) < 1e-5
    moved = jax.tree.map(lambda a, b: float(np.max(np.abs(a - b))), out[0][1], params)
    assert max(jax.tree.leaves(moved)) > 1e-3  # the step did move the parameters
    with pytest.raises(Exception, match="sft.microbatch_size=3 must divide"):
        load_config(ROOT / "configs/web_quickstart.yaml", ["sft.microbatch_size=3"])
