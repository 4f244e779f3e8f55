"""pass@k / pass^k against brute force over all k-subsets, and against the binomial form."""

import itertools
import math

import numpy as np
import pytest

from jaxagent.eval.passk import mean_pass_at_k, mean_pass_hat_k, pass_at_k, pass_hat_k


def _brute(n, c, k, all_pass):
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    hit = [(all if all_pass else any)(samples[i] for i in s) for s in subsets]
    return sum(hit) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_matches_brute_force_over_all_subsets(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            np.testing.assert_allclose(pass_at_k(n, c, k), _brute(n, c, k, False), rtol=1e-12)
            np.testing.assert_allclose(pass_hat_k(n, c, k), _brute(n, c, k, True), rtol=1e-12)


def test_hand_computed_values():
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7 ; pass^2 = C(2,2)/C(5,2) = 0.1
    np.testing.assert_allclose(pass_at_k(5, 2, 2), 0.7)
    np.testing.assert_allclose(pass_hat_k(5, 2, 2), 0.1)
    # pass@1 = c / n exactly
    np.testing.assert_allclose(pass_at_k([10, 10], [3, 0], 1), [0.3, 0.0])


def test_stable_for_large_n_where_binomials_overflow_floats():
    n, c, k = 5000, 37, 200
    exact = 1 - math.comb(n - c, k) / math.comb(n, k)  # Python ints: exact
    with pytest.raises(OverflowError):
        float(math.comb(n, k))  # the naive float formula cannot even be evaluated
    np.testing.assert_allclose(pass_at_k(n, c, k), exact, rtol=1e-10)
    exact_hat = math.comb(c, 5) / math.comb(n, 5)
    np.testing.assert_allclose(pass_hat_k(n, c, 5), exact_hat, rtol=1e-10)


def test_vectorised_and_means():
    n = np.array([4, 4, 4])
    c = np.array([0, 2, 4])
    np.testing.assert_allclose(pass_at_k(n, c, 2), [0.0, 1 - 1 / 6, 1.0])
    assert mean_pass_at_k(n, c, ks=(1, 2, 10)) == pytest.approx(
        {"pass@1": 0.5, "pass@2": (5 / 6 + 1) / 3}
    )
    assert mean_pass_hat_k(n, c, ks=(1, 2)) == pytest.approx(
        {"pass^1": 0.5, "pass^2": (1 / 6 + 1) / 3}
    )


@pytest.mark.parametrize("n,c,k,field", [(3, 4, 1, "c="), (3, 1, 4, "k=4"), (3, 1, 0, "k=0")])
def test_bad_input_names_the_field(n, c, k, field):
    with pytest.raises(ValueError, match=field):
        pass_at_k(n, c, k)
