"""Running observation normalisation and reward scaling for continuous-control PPO.

Both live on the host in float64 numpy: the statistics are a few hundred numbers updated once
per rollout (observations) or once per env step (rewards), and float64 keeps a million-sample
running variance exact where float32 Welford updates drift. The policy sees the observation
statistics as two float32 arrays (``ObsStats.mean``, ``ObsStats.inv_std``) passed into the
jitted functions, so a new rollout's statistics never recompile anything.

References: Engstrom et al. 2020 ("Implementation Matters in Deep RL", observation
normalisation and reward scaling by the running std of the discounted return); Chan et al.'s
parallel variance merge (the same as ``gymnasium.wrappers.utils.RunningMeanStd``).
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class RunningMoments:
    """Count, mean and variance of everything seen so far (``mean, var [D]`` or scalars)."""

    count: float
    mean: np.ndarray
    var: np.ndarray

    @classmethod
    def zeros(cls, shape: tuple[int, ...] = ()) -> RunningMoments:
        # count 1e-4 as Gymnasium's RunningMeanStd: the first batch essentially replaces the
        # prior (mean 0, var 1) instead of being averaged with it.
        return cls(1e-4, np.zeros(shape), np.ones(shape))


def update_moments(m: RunningMoments, x: np.ndarray) -> RunningMoments:
    """Merge a batch ``x [K, *shape]`` into the moments (parallel-variance formula)."""
    x = np.asarray(x, np.float64)
    if x.shape[0] == 0:
        return m
    b_count, b_mean, b_var = x.shape[0], x.mean(axis=0), x.var(axis=0)
    delta = b_mean - m.mean
    total = m.count + b_count
    mean = m.mean + delta * b_count / total
    m2 = m.var * m.count + b_var * b_count + delta**2 * m.count * b_count / total
    return RunningMoments(total, mean, m2 / total)


@dataclasses.dataclass(frozen=True)
class ObsStats:
    """What the jitted policy needs: ``(obs - mean) * inv_std``, then clipped to +-clip."""

    mean: np.ndarray  # [D] float32
    inv_std: np.ndarray  # [D] float32


def obs_stats(m: RunningMoments | None, obs_dim: int, eps: float = 1e-8) -> ObsStats:
    """The normaliser of moments ``m`` (None: the identity, for ``normalize_obs: false``)."""
    if m is None:
        return ObsStats(np.zeros(obs_dim, np.float32), np.ones(obs_dim, np.float32))
    return ObsStats(m.mean.astype(np.float32), (1.0 / np.sqrt(m.var + eps)).astype(np.float32))


def normalize_obs(obs: np.ndarray, stats: ObsStats, clip: float) -> np.ndarray:
    """``obs [N, D]`` -> float32 ``clip((obs - mean) * inv_std, -clip, clip)`` (the policy's
    input; the same formula as ``PPOLearner.normalize`` on device)."""
    z = (np.asarray(obs, np.float32) - stats.mean) * stats.inv_std
    return np.clip(z, -clip, clip)


@dataclasses.dataclass
class RewardScaler:
    """Divides rewards by the running std of the per-env discounted return (not centred:
    shifting rewards would change the task), as ``gymnasium.wrappers.NormalizeReward``.

    ``scale(reward [N], done [N], valid [N])`` updates the return of every valid env, then the
    moments, and returns the scaled reward clipped to +-clip; ``done`` resets an env's return
    after its reward is counted. Rows with ``valid == 0`` (next-step autoreset rows, whose
    reward is a placeholder) leave everything untouched.
    """

    num_envs: int
    gamma: float
    clip: float = 10.0
    eps: float = 1e-8

    def __post_init__(self):
        self.returns = np.zeros(self.num_envs)
        self.moments = RunningMoments.zeros()

    def scale(self, reward: np.ndarray, done: np.ndarray, valid: np.ndarray) -> np.ndarray:
        reward = np.asarray(reward, np.float64)
        valid = np.asarray(valid, bool)
        self.returns = np.where(valid, self.returns * self.gamma + reward, self.returns)
        self.moments = update_moments(self.moments, self.returns[valid])
        self.returns = np.where(valid & np.asarray(done, bool), 0.0, self.returns)
        scaled = reward / np.sqrt(self.moments.var + self.eps)
        return np.clip(scaled, -self.clip, self.clip) * valid
