"""Run an agent harness per task against the server and collect its conversations as episodes.

A harness is any function ``harness(task, base_url, api_key) -> reward`` (a number, or an
``Outcome``: the reward with the world's success and failure mode; ``load_harness``
reads a ``"module:function"`` entry point) that talks to the policy through an OpenAI client
pointed at ``base_url``. ``collect_harness_episodes`` runs one call per (task, sample),
``concurrency`` at a time, each with its own session URL (``/s/{id}/v1``: the harness needs no
session header), and returns the episodes in the rollout driver's order and groups (episode
``i * K + k`` is sample ``k`` of task ``i``, group ``group_offset + i``), as
``jaxagent.agents.rollout.collect_episodes`` does.

Each session samples from the rollout's key, on the episode's row and its turn number
(``row_uniforms``), as the built-in driver draws for the same episode: a harness whose loop
renders the same conversation samples the same tokens. A harness that raises, returns no
number or runs past ``timeout_s`` gives an ``ENV_ERROR`` episode (kept, never dropped, out of
the gradient) with the tokens it had recorded, never a policy failure.

A reward function (``harness.reward``: ``"module:function"``, ``reward(messages, task) ->
float``) scores a conversation from the server's side, for a harness that cannot report one:
``messages`` are the session's messages as the server recorded them (``{"role", "content"[,
"tool_calls": [{"name", "arguments"}]]}``, the policy's last answer last), ``task`` the
episode's ``Task`` here, or the JSON ``task`` a client sends to ``POST
/v1/sessions/{id}/end`` under ``jaxagent serve`` (None without one). With it, a harness
returns None to have its episode scored by it; a number it returns still wins.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import importlib
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from jaxagent.agents.episode import Episode
from jaxagent.envs.base import FailureMode, Task, Termination
from jaxagent.errors import FROZEN, ConfigError, check_positive

Harness = Callable[[Task, str, str], Any]
RewardFn = Callable[[list, Any], float]


@dataclasses.dataclass(**FROZEN)
class HarnessConfig:
    """Train through an agent harness (``harness.<field>`` in a config): the trainer serves
    its policy on localhost (``jaxagent serve``'s app) and runs ``entry`` once per (task,
    sample) instead of its own rollout driver; a session's turns become the episode."""

    entry: str = ""  # "package.module:function(task, base_url, api_key) -> reward"; "" = off
    timeout_s: float = 600.0  # one harness call's limit (past it: an env_error episode)
    concurrency: int = 16  # harness calls at once
    slots: int = 16  # the server's KV slots (sessions decoded together)
    # "package.module:function(messages, task) -> reward" scoring a session the harness ends
    # without a reward (module docstring); "" = the harness / client reports the reward
    reward: str = ""
    # a file every harness episode is appended to as a JSON line (``sessions.episode_record``:
    # tokens, loss mask, log-probs, versions, reward, messages); under ``jaxagent serve``, the
    # default of ``--episodes``; "" = none
    episodes_out: str = ""

    def __post_init__(self):
        check_positive("harness.timeout_s", self.timeout_s)
        check_positive("harness.concurrency", self.concurrency)
        check_positive("harness.slots", self.slots)
        if self.reward:  # a bad entry point stops the config, before any model is built
            load_harness(self.reward, field="harness.reward")

    def reward_fn(self) -> RewardFn | None:
        """The function ``reward`` names, or None."""
        return load_harness(self.reward, field="harness.reward") if self.reward else None


def load_harness(spec: str, field: str = "harness.entry") -> Callable:
    """The function an entry point ``"package.module:function"`` names (``field``: the config
    key it came from, for the error)."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ConfigError(f"{field}={spec!r} must be 'package.module:function'")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise ConfigError(f"{field}={spec!r} cannot be loaded ({err}); check the name") from None
    if not callable(fn):
        raise ConfigError(f"{field}={spec!r} is not callable")
    return fn


def _call(
    harness: Harness, task: Task, base_url: str, api_key: str, timeout_s: float, scored: bool
):
    """(reward, None) or (None, error message); the harness runs in a thread of its own so a
    hung one is abandoned at ``timeout_s`` (its later requests go to an ended session).
    ``scored``: a reward function scores the episode, so the harness may return None."""
    out: dict = {}

    def run():
        try:
            out["reward"] = harness(task, base_url, api_key)
        except BaseException as err:  # noqa: BLE001 -- any harness failure is an env error
            out["error"] = f"{type(err).__name__}: {err}"

    t = threading.Thread(target=run, name="jaxagent-harness", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        return None, f"the harness ran past its {timeout_s:g} s timeout"
    if "error" in out:
        return None, out["error"]
    r = out.get("reward")
    if r is None and scored:
        return None, None
    if isinstance(r, Outcome):
        return r, None
    if isinstance(r, bool) or not isinstance(r, (int, float)):
        return None, f"the harness returned {r!r}, not a reward (a number) or an Outcome"
    return Outcome(float(r)), None


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a harness may return instead of a bare reward: the world's own verdict, so the
    episode keeps the world's failure mode (``FailureMode``: wrong_answer, step_budget, ...)
    as the built-in driver records it, instead of the generic "harness_reward"."""

    reward: float
    success: bool | None = None  # None: reward > 0
    failure_mode: str | None = None  # a FailureMode value; None: "harness_reward"
    truncated: bool = False  # the turn budget ended it (the driver's TRUNCATED)


def collect_harness_episodes(
    server,
    harness: Harness,
    tasks: Sequence[Task],
    *,
    samples_per_task: int,
    key,
    group_offset: int = 0,
    row_offset: int = 0,
    concurrency: int = 16,
    timeout_s: float = 600.0,
    api_key: str = "jaxagent",
    reward_fn: RewardFn | None = None,
) -> list[Episode]:
    """Run ``harness`` on every (task, sample) against ``server`` (a ``ServerThread``).

    Args:
      server: the running server (its ``state`` holds the sessions).
      harness: ``harness(task, base_url, api_key) -> reward``.
      tasks, samples_per_task: K samples of each task.
      key: the rollout's sampling key (the driver's ``key``).
      group_offset: added to group ids; row_offset: the first episode's sampling row.
      concurrency: harness calls at once.
      timeout_s: one call's limit.
      api_key: passed to the harness (the server does not check it).
      reward_fn: scores the episodes whose harness returned None
        (``reward_fn(session messages, task)``; it raising is an env_error episode).
    """
    state = server.state
    run_id = uuid.uuid4().hex[:12]
    key_id = ("harness", run_id)
    jobs = [(i, t) for i, t in enumerate(tasks) for _ in range(samples_per_task)]
    sids = [f"h{run_id}-{e}" for e in range(len(jobs))]
    root = server.base_url[: -len("/v1")]
    for e, sid in enumerate(sids):
        state.streams[sid] = (key, key_id, row_offset + e)
    try:
        with concurrent.futures.ThreadPoolExecutor(max(1, concurrency)) as pool:
            futures = [
                pool.submit(
                    _call,
                    harness,
                    task,
                    f"{root}/s/{sid}/v1",
                    api_key,
                    timeout_s,
                    reward_fn is not None,
                )
                for (_, task), sid in zip(jobs, sids)
            ]
            outcomes = [f.result() for f in futures]
    finally:
        for sid in sids:
            state.streams.pop(sid, None)
    episodes = []
    for (i, task), sid, (reward, error) in zip(jobs, sids, outcomes):
        session = state.store.sessions.pop(sid, None)
        state.backend.release(sid)
        if error is None and session is None:
            error = "the harness made no request to its base_url"
        if error is None and reward is None:
            try:
                reward = Outcome(session.score(reward_fn, task))
            except Exception as err:  # noqa: BLE001 -- the user's function failing
                error = f"harness.reward: {type(err).__name__}: {err}"
        group = group_offset + i
        if session is None:
            ep = Episode(task=task, group=group)
        else:
            o = reward if reward is not None else Outcome(0.0)
            ep = session.episode(
                o.reward,
                success=o.success,
                group=group,
                failure_mode=o.failure_mode,
                truncated=o.truncated,
            )
            ep.task = task
        if error is not None:
            ep.finish(Termination.ENV_ERROR, FailureMode.ENV_ERROR, error=error)
        episodes.append(ep)
    if state.store.out is not None:  # harness.episodes_out
        state.store.out.write(episodes)
    return episodes
