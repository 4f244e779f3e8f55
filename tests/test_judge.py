"""The LLM-judge reward: calibration against ground truth, gaming, mixing with rule rewards.

Quickstart episodes of the expert at error rate 0.5 have a verified ``success``; a judge that
reads only the transcript (``ClaimJudge``) is calibrated against it. A policy that answers
"Final : task complete" without doing anything gets the full judge-only reward and no rule
reward: that a judge-only reward can be gamed, as a measurement.
"""

import jax
import pytest

from jaxagent.agents.chat import ChatFormat
from jaxagent.agents.expert import ExpertTurnPolicy
from jaxagent.agents.rollout import Budget, RolloutSpec, collect_episodes
from jaxagent.agents.runner import InlineRunner
from jaxagent.agents.turn_policy import HostPolicy, TurnOutput
from jaxagent.envs.base import Termination
from jaxagent.envs.tools.quickstart import (
    ExpertPolicy,
    QuickstartConfig,
    QuickstartEnv,
    QuickstartWorld,
    vocabulary,
)
from jaxagent.eval.judge import (
    ClaimJudge,
    PolicyJudge,
    Verdict,
    calibration_report,
    judge_rewards,
    mixed_reward,
)
from jaxagent.train.tokenizer import build_word_tokenizer


@pytest.fixture(scope="module")
def world():
    chat = ChatFormat(
        build_word_tokenizer(vocabulary() + "complete yes no question agent or".split())
    )
    tasks = QuickstartWorld(QuickstartConfig(num_train=0, num_test=200)).tasks("test")
    budget = Budget(max_turns=6, max_new_tokens=64, max_total_tokens=4096)
    return chat, tasks, RolloutSpec(chat, "", budget, InlineRunner(QuickstartEnv))


def _episodes(world, make, error_rate=0.0, n=200):
    chat, tasks, spec = world
    policy = ExpertTurnPolicy(make, chat, error_rate=error_rate, seed=0)
    eps, _ = collect_episodes(
        policy, None, tasks[:n], samples_per_task=1, spec=spec, key=jax.random.key(0)
    )
    return eps


class Claimer:
    """Claims completion at once (``make_expert`` signature)."""

    def __init__(self, task, error_rate=0.0, rng=None):
        pass

    def act(self, observation):
        return "Final : task complete"


def test_claim_judge_calibration_on_quickstart(world):
    eps = _episodes(world, ExpertPolicy, error_rate=0.5)
    verdicts = ClaimJudge().judge(eps)
    rep = calibration_report(eps, verdicts)
    truth = [e.success for e in eps]
    yes = [v.p_yes >= 0.5 for v in verdicts]
    tp = sum(t and y for t, y in zip(truth, yes))
    fp = sum(y and not t for t, y in zip(truth, yes))
    assert rep["episodes"] == 200 and rep["confusion"]["tp"] == tp and rep["confusion"]["fp"] == fp
    assert rep["agreement"] == pytest.approx(sum(t == y for t, y in zip(truth, yes)) / 200)
    assert 0.3 < rep["true_success_rate"] < 0.7
    # it never rejects a verified success (the answer is in an observation or is "done") ...
    assert rep["false_negative_rate"] == 0.0
    # ... but believes failures it cannot see: a wrong end state (a skipped or wrong call
    # whose reported output was answered) far more often than a made-up answer
    modes = rep["per_failure_mode"]
    assert rep["false_positive_rate"] > 0.2
    assert modes["wrong_state"]["judged_complete_rate"] > 0.5
    assert (
        modes["wrong_answer"]["judged_complete_rate"] < modes["wrong_state"]["judged_complete_rate"]
    )
    # a judge reading the truth is perfectly calibrated, its negation perfectly wrong
    perfect = calibration_report(eps, [Verdict(float(t)) for t in truth])
    assert perfect["agreement"] == 1.0 and perfect["false_positive_rate"] == 0.0
    inverted = calibration_report(eps, [Verdict(float(not t)) for t in truth])
    assert inverted["agreement"] == 0.0 and inverted["false_negative_rate"] == 1.0


def test_judge_only_reward_is_gamed_where_the_rule_reward_is_not(world):
    honest = _episodes(world, ExpertPolicy, n=50)
    gamer = _episodes(world, Claimer, n=50)
    judge = ClaimJudge()
    rule_h, rule_g = [e.reward for e in honest], [e.reward for e in gamer]
    judge_h = judge_rewards(judge.judge(honest), threshold=0.5)
    judge_g = judge_rewards(judge.judge(gamer), threshold=0.5)
    assert sum(rule_h) == 50 and sum(rule_g) == 0  # the rule reward cannot be talked into
    assert sum(judge_g) == 50 == sum(judge_h)  # the judge pays the claim in full
    assert all(e.num_turns == 1 for e in gamer)  # ... for one turn of work
    mixed_g = mixed_reward(rule_g, judge_g, judge_weight=0.5)
    mixed_h = mixed_reward(rule_h, judge_h, judge_weight=0.5)
    assert sum(mixed_g) == 25 and sum(mixed_h) == 50  # mixing halves the exploit
    gated = mixed_reward(rule_g, judge_g, judge_weight=0.5, gate=True)
    assert sum(gated) == 0  # gated on the rule reward it is closed
    assert mixed_reward([1.0, 0.0], [0.0, 1.0], judge_weight=0.25) == [0.75, 0.25]


class _Answerer(HostPolicy):
    """A turn policy that answers ``yes`` on even rows and ``no`` on odd ones."""

    recompiles = 0

    def __init__(self, chat):
        self.chat = chat
        self.prompts = []

    def start(self, params, prompts, key, *, tasks, observations):
        self.prompts = list(prompts)
        toks = [self.chat.action("yes" if i % 2 == 0 else "no") for i in range(len(prompts))]
        return TurnOutput(toks, [[0.0] * len(t) for t in toks], [True] * len(toks))


def test_policy_judge_samples_and_counts_tokens(world):
    chat = world[0]
    eps = _episodes(world, ExpertPolicy, n=3)
    answerer = _Answerer(chat)
    verdicts = PolicyJudge(answerer, chat, None, jax.random.key(0), samples=2).judge(eps)
    assert [v.p_yes for v in verdicts] == [0.5, 0.5, 0.5]  # rows alternate yes / no
    assert "question : did the agent complete the task" in chat.decode(answerer.prompts[0])
    assert verdicts[0].input_tokens == 2 * len(answerer.prompts[0])
    assert verdicts[0].generated_tokens == len(chat.action("yes")) + len(chat.action("no"))
    one = PolicyJudge(answerer, chat, None, jax.random.key(0), samples=1).judge(eps)
    assert [v.p_yes for v in one] == [1.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="samples=0"):
        PolicyJudge(answerer, chat, None, jax.random.key(0), samples=0)


def test_calibration_leaves_env_errors_out_and_checks_inputs(world):
    eps = _episodes(world, ExpertPolicy, n=4)
    eps[0].finish(Termination.ENV_ERROR, "env_error")
    rep = calibration_report(eps, [Verdict(1.0)] * 4)
    assert rep["episodes"] == 3 and rep["env_errors"] == 1
    with pytest.raises(ValueError, match="4 episodes for 3 verdicts"):
        calibration_report(eps, [Verdict(1.0)] * 3)
    with pytest.raises(ValueError, match="judge_weight=1.5"):
        mixed_reward([1.0], [1.0], judge_weight=1.5)
