"""A fake tool environment with seeded latency, for pool tests, health checks and benchmarks.

Kept in the library (not in tests/) so that worker processes can unpickle it without importing
the test modules, and so users can run a pre-launch health check against their pool settings.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from jaxagent.envs.base import StepResult, Task


@dataclasses.dataclass(frozen=True)
class DyingEnvFactory:
    """An ``env_fn`` whose worker process dies while building the env (a broken native env)."""

    exit_code: int = 3

    def __call__(self, env_id: int):
        import os

        os._exit(self.exit_code)


@dataclasses.dataclass(frozen=True)
class FakeToolEnvFactory:
    """Picklable ``env_fn(env_id)`` building ``FakeToolEnv``s."""

    episode_len: int = 3  # steps per episode
    latency_s: float = 0.0  # mean simulated tool latency per call
    jitter: float = 0.0  # latency is uniform in latency_s * [1 - jitter, 1 + jitter]

    def __call__(self, env_id: int) -> FakeToolEnv:
        return FakeToolEnv(env_id, self.episode_len, self.latency_s, self.jitter)


class FakeToolEnv:
    """Echoes actions; the episode ends after ``episode_len`` steps with reward 1 if every
    action was ``"call <i>"`` with ``i`` the step index (so a test can check routing)."""

    def __init__(
        self, env_id: int, episode_len: int = 3, latency_s: float = 0.0, jitter: float = 0.0
    ):
        self.env_id, self.episode_len = env_id, episode_len
        self.latency_s, self.jitter = latency_s, jitter
        self._rng = np.random.default_rng(env_id)
        self._t, self._ok, self._task = 0, True, None

    def seed(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)

    def _sleep(self):
        if self.latency_s > 0:
            lo, hi = 1.0 - self.jitter, 1.0 + self.jitter
            time.sleep(self.latency_s * self._rng.uniform(lo, hi))

    def reset(self, task: Task) -> str:
        self._sleep()
        self._t, self._ok, self._task = 0, True, task
        return f"env {self.env_id} task {task.id}: {task.prompt}"

    def step(self, action: str) -> StepResult:
        self._sleep()
        self._ok &= action == f"call {self._t}"
        self._t += 1
        done = self._t >= self.episode_len
        reward = float(done and self._ok)
        terms = {"process": 0.0, "outcome": 0.0, "task": reward}
        info = {"reward_terms": terms, "success": bool(done and self._ok), "task_id": self._task.id}
        return StepResult(f"result {self._t} of {self._task.id}", reward, done, info)

    def close(self) -> None:
        pass
