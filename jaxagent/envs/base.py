"""The environment protocol: text environments, array environments, tasks.

Text environments (tool APIs, sandboxed code, web, dialogue) are plain host objects:
``reset(task) -> observation`` and ``step(action_text) -> StepResult``. A tool failure or a
malformed action comes back as a readable error observation, never as an exception that ends
the rollout. Array environments (MuJoCo) are batched over numpy arrays with ``terminated`` and
``truncated`` kept apart, following Gymnasium's vector API.

Nothing in this module imports JAX (DESIGN.md: ``envs`` knows nothing of JAX).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np


class FailureMode(str, enum.Enum):
    """Why an episode (or a step) failed. ``ENV_ERROR`` is never a policy failure."""

    INVALID_SYNTAX = "invalid_syntax"  # the action could not be parsed
    UNKNOWN_TOOL = "unknown_tool"  # a call to a tool that does not exist
    BAD_ARGUMENTS = "bad_arguments"  # arguments failed the tool's JSON Schema
    TOOL_ERROR = "tool_error"  # the tool ran and reported an error (e.g. missing file)
    WRONG_STATE = "wrong_state"  # finished, but the world's end state is wrong
    WRONG_ANSWER = "wrong_answer"  # finished, but the final answer is wrong
    GAVE_UP = "gave_up"  # the agent ended without an answer / produced nothing
    STEP_BUDGET = "step_budget"  # turn or token budget exhausted (a truncation)
    TESTS_FAILED = "tests_failed"  # code ran, unit tests failed
    TIMEOUT = "timeout"  # the agent's code / call exceeded its time limit
    ENV_ERROR = "env_error"  # the environment itself failed (crash, hang, corrupt data)
    # The first prompt alone leaves no room for a turn within the episode's token budget: the
    # policy never acted (a configuration problem, not the policy's failure).
    PROMPT_OVERFLOW = "prompt_overflow"


class Termination(str, enum.Enum):
    """How an episode ended. Only ``TERMINATED`` is a real end for bootstrapping."""

    TERMINATED = "terminated"  # the task ended (success or failure)
    TRUNCATED = "truncated"  # cut by a budget or a timeout: bootstrap, do not treat as an end
    ENV_ERROR = "env_error"  # the environment failed; excluded from policy statistics
    PROMPT_OVERFLOW = "prompt_overflow"  # the first prompt exceeded the token budget: no turn


REWARD_TERMS = ("process", "outcome", "task")


@dataclasses.dataclass
class StepResult:
    """What ``TextEnv.step`` returns.

    ``info`` keys used across jaxagent (all optional):
      ``reward_terms``: dict with "process", "outcome", "task" floats (``envs/rewards.py``);
      ``failure_mode``: a ``FailureMode`` value (str) or None;
      ``truncated``: bool, True when ``done`` came from a budget or timeout rather than a real end;
      ``success``: bool, the task's verifiable success at the end of the episode;
      ``dangerous``: list[str] of dangerous actions taken in this step (safety accounting).
    """

    observation: str
    reward: float
    done: bool
    info: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def truncated(self) -> bool:
        return bool(self.info.get("truncated", False))

    @property
    def terminated(self) -> bool:
        return self.done and not self.truncated


@dataclasses.dataclass(frozen=True)
class Task:
    """One task instance. ``data`` holds whatever the environment needs (JSON-serialisable)."""

    id: str
    split: str
    prompt: str
    data: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@runtime_checkable
class TaskSource(Protocol):
    """A named collection of tasks with disjoint splits ("train", "validation", "test")."""

    def splits(self) -> Sequence[str]: ...

    def tasks(self, split: str) -> Sequence[Task]: ...


@runtime_checkable
class TextEnv(Protocol):
    """A text environment. One instance runs one episode at a time."""

    def reset(self, task: Task) -> str: ...

    def step(self, action: str) -> StepResult: ...

    def close(self) -> None: ...


@runtime_checkable
class ArrayEnv(Protocol):
    """A batched array environment over ``num_envs`` instances (Gymnasium vector conventions).

    ``reset(seed)`` returns ``(obs [N, obs_dim], info)``; ``step(actions [N, act_dim])`` returns
    ``(obs, reward [N], terminated [N] bool, truncated [N] bool, info)``; ``step_envs(env_ids
    [K], actions [K, act_dim])`` steps only those K envs (the others keep their state) and
    returns the same tuple over the K (``jaxagent.pool.ArrayEnvPool`` calls it when only some
    envs have an action pending).
    """

    num_envs: int
    obs_dim: int
    act_dim: int

    def reset(self, seed: int | Sequence[int] | None = None) -> tuple[np.ndarray, dict]: ...

    def step(
        self, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]: ...

    def step_envs(
        self, env_ids: np.ndarray, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]: ...

    def close(self) -> None: ...


class SplitLeakageError(ValueError):
    """Raised when the same task appears in two splits."""


def check_disjoint_splits(
    source: TaskSource, key=lambda task: task.prompt, splits: Iterable[str] | None = None
) -> None:
    """Raise ``SplitLeakageError`` if any two splits share a task id or a task key.

    Args:
      source: the task source.
      key: maps a task to the content that must not repeat across splits (default: its prompt).
      splits: the splits to compare (default: all of ``source.splits()``).
    """
    seen_ids: dict[str, str] = {}
    seen_keys: dict[Any, str] = {}
    for split in splits if splits is not None else source.splits():
        for task in source.tasks(split):
            for table, k in ((seen_ids, task.id), (seen_keys, key(task))):
                other = table.setdefault(k, split)
                if other != split:
                    raise SplitLeakageError(
                        f"task {task.id!r} of split {split!r} also appears in split {other!r}; "
                        "splits must be disjoint (regenerate with a different seed or dedupe)"
                    )


# --- Additions for the environment pool. Additive only: names above are stable. ---


@runtime_checkable
class SeedableEnv(Protocol):
    """An environment that accepts a per-episode seed before ``reset``.

    ``EnvPool`` calls ``seed(s)`` before every ``reset`` when the env has this method, with
    ``s`` derived deterministically from (pool seed, env id, episode index, retry attempt).
    """

    def seed(self, seed: int) -> None: ...


@runtime_checkable
class SnapshotEnv(Protocol):
    """An optional capability: save and restore the whole environment state mid-episode.

    Tree search over actions (DFSDT) and best-of-N from a shared prefix need it.
    ``snapshot()`` returns an opaque, picklable value that does not alias the live state (later
    steps must not change it); ``restore(s)`` puts the environment back exactly there, so that
    the same actions after it give the same observations, rewards and ``info``. A snapshot is
    only valid for the environment instance (and episode) that made it.
    """

    def snapshot(self) -> Any: ...

    def restore(self, snapshot: Any) -> None: ...


def supports_snapshot(env: Any) -> bool:
    """Whether ``env`` declares ``SnapshotEnv`` (both methods)."""
    return isinstance(env, SnapshotEnv)


TRUNCATION_MARKER = "\n[... {omitted} characters truncated ...]\n"


def run_episode(
    env: TextEnv, task: Task, policy: Callable[[str], str]
) -> tuple[list[str], list[str], StepResult]:
    """One episode of ``policy`` (observation -> action text) in ``env``: (observations,
    actions, the last ``StepResult``); ``observations[0]`` is the reset observation and
    ``observations[i + 1]`` follows ``actions[i]``. The scripted experts' checks run their
    episodes through it."""
    observations, actions = [env.reset(task)], []
    while True:
        action = policy(observations[-1])
        result = env.step(action)
        actions.append(action)
        observations.append(result.observation)
        if result.done:
            return observations, actions, result


def truncate_observation(text: str, max_chars: int, *, keep_tail: float = 0.25) -> str:
    """Cut ``text`` to at most ``max_chars`` characters with a visible marker in the middle.

    The head is kept (most tool outputs say what they are first) and ``keep_tail`` of the
    budget goes to the tail (errors and totals tend to come last). The marker states how many
    characters were removed, so the policy can tell a truncated observation from a short one.

    Args:
      text: the observation.
      max_chars: the budget, marker included; must leave room for the marker.
      keep_tail: fraction of the remaining budget kept from the end of ``text`` (0 to 1).

    Returns:
      ``text`` unchanged when it fits, else ``head + marker + tail`` with ``len <= max_chars``.
    """
    if not 0.0 <= keep_tail <= 1.0:
        raise ValueError(f"keep_tail={keep_tail!r} must lie in [0, 1]")
    if len(text) <= max_chars:
        return text
    omitted = len(text)
    # The marker's own length depends on the number it prints; iterate to a fixed point.
    for _ in range(3):
        marker = TRUNCATION_MARKER.format(omitted=omitted)
        budget = max_chars - len(marker)
        if budget < 0:
            raise ValueError(
                f"max_chars={max_chars} is too small to hold the truncation marker "
                f"({len(marker)} characters); use max_chars >= {len(marker) + 16}"
            )
        omitted = len(text) - budget
    tail = int(budget * keep_tail)
    head = budget - tail
    return text[:head] + marker + (text[len(text) - tail :] if tail else "")


def env_error_info(reason: str, detail: str = "") -> dict[str, Any]:
    """The ``info`` of a step that ends an episode because the environment failed.

    Such episodes carry ``Termination.ENV_ERROR`` and ``FailureMode.ENV_ERROR`` and are excluded
    from policy-failure statistics; ``env_error`` says what failed ("timeout", "crash",
    "corrupt", "exception") and ``env_error_detail`` the message, for logs.
    """
    return {
        "failure_mode": FailureMode.ENV_ERROR.value,
        "termination": Termination.ENV_ERROR.value,
        "truncated": False,
        "env_error": reason,
        "env_error_detail": detail,
        "success": False,
    }


def is_env_error(info: Mapping[str, Any] | None) -> bool:
    """Whether a step's ``info`` says the environment failed (``env_error_info``)."""
    return bool(info) and info.get("termination") == Termination.ENV_ERROR.value


def env_error_message(info: Mapping[str, Any]) -> str:
    """A one-line description of an environment failure, for ``Episode.error`` and logs."""
    reason = str(info.get("env_error") or "env_error")
    detail = str(info.get("env_error_detail") or "")
    return f"{reason}: {detail}" if detail else reason
