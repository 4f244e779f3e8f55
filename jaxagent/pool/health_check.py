"""Pre-launch health check: run episodes through a pool with injected faults.

    report = run_health_check(make_env, tasks, policy=lambda obs: "...",
                              pool_config=PoolConfig(num_envs=16, backend="process",
                                                     step_timeout_s=2.0),
                              faults=FaultConfig(hang=0.1, crash=0.05, corrupt=0.05))
    print(report.summary()); assert report.ok

``ok`` holds when every episode came back exactly once, every failed one is labelled
env_error, and the pool's timeout / crash / corrupt counters equal the injected faults: the
settings (timeouts, retries, restarts) contain the failures the environment will have.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from jaxagent.envs.base import Task
from jaxagent.envs.faults import FaultConfig, FaultLog, FaultyEnvFactory
from jaxagent.pool.config import PoolConfig
from jaxagent.pool.pool import EnvPool, PoolStep


@dataclasses.dataclass
class HealthReport:
    episodes_in: int
    episodes_out: int
    duplicates: int  # episodes answered more than once (must be 0)
    unlabelled_failures: int  # env failures without the env_error label (must be 0)
    env_error_episodes: int
    injected: dict[str, int]
    health: dict[str, float]
    finals: list[PoolStep]

    @property
    def counters_match(self) -> bool:
        h, inj = self.health, self.injected
        return (h["timeouts"], h["crashes"], h["corrupt"]) == (
            inj["hang"],
            inj["crash"],
            inj["corrupt"],
        )

    @property
    def ok(self) -> bool:
        complete = self.episodes_out == self.episodes_in and self.duplicates == 0
        return complete and self.unlabelled_failures == 0 and self.counters_match

    def summary(self) -> str:
        h, inj = self.health, self.injected
        return (
            f"episodes in {self.episodes_in}, out {self.episodes_out} (duplicates "
            f"{self.duplicates}); env_error {self.env_error_episodes} (unlabelled "
            f"{self.unlabelled_failures}); injected hang/crash/corrupt {inj['hang']}/"
            f"{inj['crash']}/{inj['corrupt']} vs pool timeouts/crashes/corrupt {h['timeouts']}/"
            f"{h['crashes']}/{h['corrupt']}; restarts {h['restarts']}, retries {h['retries']}; "
            f"latency p50/p99 {h['latency_p50_ms']:.1f}/{h['latency_p99_ms']:.1f} ms; "
            f"{'OK' if self.ok else 'FAILED'}"
        )


def run_health_check(
    make_env: Callable[[int], Any],
    tasks: Sequence[Task],
    policy: Callable[[str], str],
    pool_config: PoolConfig,
    faults: FaultConfig,
) -> HealthReport:
    """Run every task once through a fault-injected pool; see the module docstring."""
    log = FaultLog.create(pool_config.start_method)
    env_fn = FaultyEnvFactory(make_env, faults, log)
    n = pool_config.num_envs
    finals: list[PoolStep] = []
    with EnvPool(env_fn, pool_config) as pool:
        first = list(tasks[:n])
        pool.async_reset(range(len(first)), first)
        next_task = len(first)
        while len(finals) < len(tasks):
            for r in pool.recv(min_batch=1):
                if not r.done:
                    pool.send([r.env_id], [policy(r.observation)])
                    continue
                finals.append(r)
                if next_task < len(tasks):
                    pool.async_reset([r.env_id], [tasks[next_task]])
                    next_task += 1
        health = pool.health.snapshot()
    ids = [r.episode_id for r in finals]
    unlabelled = sum(
        1 for r in finals if r.info.get("env_error") and r.info.get("failure_mode") != "env_error"
    )
    return HealthReport(
        episodes_in=len(tasks),
        episodes_out=len(set(ids)),
        duplicates=len(ids) - len(set(ids)),
        unlabelled_failures=unlabelled,
        env_error_episodes=sum(r.env_error for r in finals),
        injected=log.counts(),
        health=health,
        finals=finals,
    )
