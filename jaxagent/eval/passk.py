"""pass@k and pass^k from n samples per task of which c are correct.

pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", eq. 1): the
probability that at least one of k samples drawn without replacement from the n is correct,
estimated without bias as ``1 - C(n-c, k) / C(n, k)``. The binomial ratio overflows for
realistic n, so it is computed in the stable product form

    C(n-c, k) / C(n, k) = prod_{i = n-c+1}^{n} (1 - k / i).

pass^k (Yao et al. 2024, tau-bench): the probability that *all* k samples drawn without
replacement are correct, ``C(c, k) / C(n, k) = prod_{i=0}^{k-1} (c - i) / (n - i)``.

Pure numpy; inputs are per-task counts. Shapes: ``n``, ``c`` broadcast to [T]; results [T].
"""

from __future__ import annotations

import numpy as np


def _check(n, c, k) -> tuple[np.ndarray, np.ndarray]:
    n = np.asarray(n, dtype=np.int64)
    c = np.asarray(c, dtype=np.int64)
    n, c = np.broadcast_arrays(n, c)
    if not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k={k!r} is invalid: use an integer >= 1")
    if np.any(c < 0) or np.any(c > n):
        raise ValueError(f"c={c.tolist()} is invalid for n={n.tolist()}: need 0 <= c <= n")
    if np.any(n < k):
        raise ValueError(
            f"k={k} exceeds the number of samples n={n.tolist()}: need n >= k "
            "(draw more samples or lower k)"
        )
    return n, c


def pass_at_k(n, c, k: int) -> np.ndarray:
    """Unbiased pass@k per task.

    Args:
      n: [T] samples drawn per task (or a scalar).
      c: [T] correct samples per task.
      k: samples allowed.

    Returns:
      [T] float64 estimates in [0, 1] (a 0-d array for scalar inputs).
    """
    n, c = _check(n, c, k)
    out = np.ones(n.shape, dtype=np.float64)
    for idx in np.ndindex(n.shape):
        ni, ci = int(n[idx]), int(c[idx])
        if ni - ci < k:  # every k-subset contains a correct sample
            continue
        out[idx] = 1.0 - np.prod(1.0 - k / np.arange(ni - ci + 1, ni + 1, dtype=np.float64))
    return out


def pass_hat_k(n, c, k: int) -> np.ndarray:
    """pass^k per task: probability that k samples (without replacement) all pass. [T]."""
    n, c = _check(n, c, k)
    out = np.zeros(n.shape, dtype=np.float64)
    for idx in np.ndindex(n.shape):
        ni, ci = int(n[idx]), int(c[idx])
        if ci >= k:
            i = np.arange(k, dtype=np.float64)
            out[idx] = np.prod((ci - i) / (ni - i))
    return out


def mean_pass_at_k(n, c, ks=(1, 10, 100)) -> dict[str, float]:
    """Mean pass@k over tasks for every k <= min(n); keys "pass@k"."""
    n = np.asarray(n)
    return {f"pass@{k}": float(np.mean(pass_at_k(n, c, k))) for k in ks if k <= n.min()}


def mean_pass_hat_k(n, c, ks=(1, 2, 4, 8)) -> dict[str, float]:
    """Mean pass^k over tasks for every k <= min(n); keys "pass^k"."""
    n = np.asarray(n)
    return {f"pass^{k}": float(np.mean(pass_hat_k(n, c, k))) for k in ks if k <= n.min()}
