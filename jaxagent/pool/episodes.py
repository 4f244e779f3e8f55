"""The pool's episode loop: every task run to its end, one policy per episode.

    run = run_episodes(pool, tasks, lambda task: Expert(task).act)
    run.episodes   # one EpisodeEnd per task, in the order they finished
    run.env_steps, run.wall_s, run.health

Each free env takes the next task (``async_reset``); each answer that is not final gets the
episode's policy's action (``send``); a final answer (``done``, an env error included) is
recorded and frees its env for the next task. The pool's guarantees (one final answer per
episode, env failures labelled ``env_error``) make ``len(run.episodes) == len(tasks)``. This is
the loop of the environment check (``jaxagent check``); the rollout driver reaches the pool
through ``jaxagent.agents.pool_runner`` instead, because it steps whole batches in lock-step
with the sampler.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from jaxagent.envs.base import Task
from jaxagent.pool.steps import EnvReply

Policy = Callable[[str], str]  # observation -> action text


@dataclasses.dataclass
class EpisodeEnd:
    """One finished episode: its task, its final answer, and the steps it took."""

    task: Task
    final: EnvReply
    steps: int

    @property
    def success(self) -> bool:
        return bool(self.final.info.get("success")) and not self.final.env_error


@dataclasses.dataclass
class EpisodeRun:
    episodes: list[EpisodeEnd]
    env_steps: int
    wall_s: float
    health: dict[str, Any]


def run_episodes(
    pool: Any,
    tasks: Sequence[Task],
    make_policy: Callable[[Task], Policy],
    *,
    recv_timeout_s: float | None = None,
) -> EpisodeRun:
    """Run every task once through ``pool`` (an ``EnvPool``) with ``make_policy(task)``.

    ``recv_timeout_s`` bounds one wait for answers; the pool's own step timeouts are what end
    a hung env, so this only guards against a pool that stops answering altogether.
    """
    queue = list(tasks)[::-1]
    running: dict[int, tuple[Task, Policy, int]] = {}  # env_id -> (task, policy, steps)
    episodes: list[EpisodeEnd] = []
    env_steps = 0
    start = time.perf_counter()

    def launch(env_id: int) -> None:
        task = queue.pop()
        running[env_id] = (task, make_policy(task), 0)
        pool.async_reset([env_id], [task])

    for env_id in range(min(pool.num_envs, len(queue))):
        launch(env_id)
    while running:
        answers = pool.recv(min_batch=1, timeout=recv_timeout_s)
        if not answers and recv_timeout_s is not None:
            raise TimeoutError(
                f"the pool answered nothing for {recv_timeout_s} s with {len(running)} "
                "episodes running"
            )
        for r in answers:
            task, policy, steps = running[r.env_id]
            if r.kind == "step":
                steps += 1
                env_steps += 1
            if r.done:
                episodes.append(EpisodeEnd(task, r, steps))
                del running[r.env_id]
                if queue:
                    launch(r.env_id)
                continue
            running[r.env_id] = (task, policy, steps)
            pool.send([r.env_id], [policy(r.observation)])
    return EpisodeRun(episodes, env_steps, time.perf_counter() - start, pool.health.snapshot())
