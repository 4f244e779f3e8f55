"""eval/stats.py on constructed data with known answers, and the bootstrap's coverage."""

import numpy as np
import pytest

from jaxagent.eval import stats


def test_iqm_drops_a_quarter_at_each_end():
    assert stats.iqm(np.arange(1, 9)) == pytest.approx(4.5)  # mean of 3, 4, 5, 6
    assert stats.iqm([5.0, 1.0, 100.0, -50.0]) == pytest.approx(3.0)  # mean of 1, 5
    assert stats.iqm([2.0]) == 2.0
    rng = np.random.default_rng(0)
    for n in range(1, 13):  # scipy.stats.trim_mean(x, 0.25), written out
        x = rng.random(n)
        cut = int(0.25 * n)
        assert stats.iqm(x) == pytest.approx(np.sort(x)[cut : n - cut].mean())


def test_bootstrap_ci_is_seeded_and_collapses_on_constant_data():
    x = np.random.default_rng(1).random(40)
    a, b = stats.bootstrap_ci(x, seed=3), stats.bootstrap_ci(x, seed=3)
    assert a == b and a["ci_low"] < a["value"] < a["ci_high"]
    assert a["value"] == pytest.approx(x.mean())
    assert stats.bootstrap_ci(x, seed=4) != a
    c = stats.bootstrap_ci(np.full(10, 0.25), stat="iqm")
    assert c == {"value": 0.25, "ci_low": 0.25, "ci_high": 0.25}
    with pytest.raises(ValueError, match="confidence"):
        stats.bootstrap_ci(x, confidence=95)
    with pytest.raises(ValueError, match="stat="):
        stats.bootstrap_ci(x, stat="median")


def test_bootstrap_interval_width_matches_the_standard_error():
    # For n = 400 scores the 95% percentile interval is ~ 2 * 1.96 * sd / sqrt(n) wide.
    x = np.random.default_rng(2).normal(0.0, 1.0, 400)
    r = stats.bootstrap_ci(x, reps=4000, seed=0)
    expected = 2 * 1.96 * x.std() / np.sqrt(x.size)
    assert r["ci_high"] - r["ci_low"] == pytest.approx(expected, rel=0.08)


@pytest.mark.parametrize("n,p", [(100, 0.3), (50, 0.5)])
def test_bootstrap_interval_covers_the_true_mean_at_its_stated_rate(n, p):
    """1,000 simulated evaluations of n Bernoulli(p) episodes each: the 95% interval must
    contain p in 95% +- 2 points of them."""
    rng = np.random.default_rng(0)
    hits = 0
    for chunk in range(10):  # 10 x 100 trials, one vectorised bootstrap per chunk
        x = (rng.random((100, n)) < p).astype(np.float64)
        r = stats.bootstrap_ci(x, reps=1000, seed=chunk)
        hits += int(np.sum((r["ci_low"] <= p) & (p <= r["ci_high"])))
    coverage = hits / 1000
    print(f"coverage n={n} p={p}: {coverage:.3f}")
    assert 0.93 <= coverage <= 0.97, coverage


def test_stratified_bootstrap_resamples_runs_within_tasks():
    # Task 0 is always solved, task 1 never: resampling runs within each task can never
    # change the mean (0.5), whereas pooling cells would.
    scores = np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    r = stats.stratified_bootstrap_ci(scores)
    assert r == {"value": 0.5, "ci_low": 0.5, "ci_high": 0.5}
    # Run-to-run variation on one task gives a proper interval around the mean.
    scores = np.array([[0.2, 1.0], [0.4, 1.0], [0.6, 1.0], [0.8, 1.0]])
    r = stats.stratified_bootstrap_ci(scores, reps=4000)
    assert r["value"] == pytest.approx(0.75)
    assert 0.6 < r["ci_low"] < 0.75 < r["ci_high"] < 0.9
    assert stats.stratified_bootstrap_ci(scores, stat="iqm")["value"] == pytest.approx(
        stats.iqm(scores.ravel())
    )
    with pytest.raises(ValueError, match="runs, tasks"):
        stats.stratified_bootstrap_ci([0.1, 0.2])


def test_probability_of_improvement_known_values():
    ones, zeros = np.ones((3, 4)), np.zeros((2, 4))
    assert stats.probability_of_improvement(ones, zeros) == {
        "value": 1.0,
        "ci_low": 1.0,
        "ci_high": 1.0,
    }
    assert stats.probability_of_improvement(zeros, ones)["value"] == 0.0
    assert stats.probability_of_improvement(ones, ones)["value"] == 0.5  # ties count 1/2
    # One task, runs x = (3, 1), y = (2, 0): x wins 3 of 4 pairs.
    assert stats.probability_of_improvement([[3.0], [1.0]], [[2.0], [0.0]])["value"] == 0.75
    # Two tasks: 0.75 on the first, 0 on the second -> 0.375.
    r = stats.probability_of_improvement([[3.0, 0.0], [1.0, 0.0]], [[2.0, 1.0], [0.0, 1.0]])
    assert r["value"] == 0.375 and r["ci_low"] <= 0.375 <= r["ci_high"]
    with pytest.raises(ValueError, match="same tasks"):
        stats.probability_of_improvement(np.ones((2, 3)), np.ones((2, 4)))


def test_difference_ci():
    r = stats.difference_ci([1.0] * 8 + [0.0] * 2, [1.0] * 3 + [0.0] * 7, reps=4000)
    assert r["value"] == pytest.approx(0.5)
    assert 0.0 < r["ci_low"] < 0.5 < r["ci_high"] <= 1.0


def test_ratio_bootstrap_is_the_episode_rate_with_tasks_resampled():
    r = stats.ratio_bootstrap_ci([1, 1, 0], [2, 2, 1], reps=2000)
    assert r["value"] == pytest.approx(0.4)
    assert 0.0 <= r["ci_low"] <= 0.4 <= r["ci_high"] <= 0.5
    # Equal cluster sizes: the same value as the mean of the cluster means.
    num, den = np.array([3, 1, 4, 0]), np.full(4, 4)
    assert stats.ratio_bootstrap_ci(num, den)["value"] == pytest.approx(np.mean(num / den))
    with pytest.raises(ValueError, match="sum\\(den\\) > 0"):
        stats.ratio_bootstrap_ci([0], [0])


def test_iqm_is_left_out_with_one_sample_a_task():
    """A 0.75 success rate with one sample a task: the IQM of 0/1 scores would be 1.000 (the
    middle half is all successes); the record reports none, and says why. With two samples
    a task the scores are averages and the IQM is reported."""
    from jaxagent.agents.episode import Episode
    from jaxagent.envs.base import Task, Termination
    from jaxagent.eval.protocol import EvalGroup, build_record

    def ep(task, ok):
        e = Episode(task=Task(id=task, split="test", prompt=""), group=0)
        e.finish(Termination.TERMINATED, None if ok else "wrong_answer", success=ok)
        return e

    one = [ep("a", False), ep("b", True), ep("c", True), ep("d", True)]
    s = build_record([EvalGroup(one)], reps=50)["success"]
    assert s["mean"] == 0.75 and s["iqm"] is None and s["iqm_ci_low"] is None
    assert "samples_per_task >= 2" in s["iqm_note"]
    two = [
        ep(t, ok)
        for t, oks in [("a", (0, 1)), ("b", (1, 1)), ("c", (1, 0)), ("d", (1, 1))]
        for ok in map(bool, oks)
    ]
    s = build_record([EvalGroup(two)], reps=50)["success"]
    assert s["mean"] == 0.75 and s["iqm"] == pytest.approx(0.75) and "iqm_note" not in s
