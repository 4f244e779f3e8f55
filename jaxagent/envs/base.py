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
from typing import Any, Iterable, Mapping, Protocol, Sequence, runtime_checkable

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


class Termination(str, enum.Enum):
    """How an episode ended. Only ``TERMINATED`` is a real end for bootstrapping."""

    TERMINATED = "terminated"  # the task ended (success or failure)
    TRUNCATED = "truncated"  # cut by a budget or a timeout: bootstrap, do not treat as an end
    ENV_ERROR = "env_error"  # the environment failed; excluded from policy statistics


REWARD_TERMS = ("process", "outcome", "task")


@dataclasses.dataclass
class StepResult:
    """What ``TextEnv.step`` returns.

    ``info`` keys used across jaxagent (all optional):
      ``reward_terms``: dict with "process", "outcome", "task" floats (survey §3.3 reward ladder);
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
    ``(obs, reward [N], terminated [N] bool, truncated [N] bool, info)``.
    """

    num_envs: int

    def reset(self, seed: int | Sequence[int] | None = None) -> tuple[np.ndarray, dict]: ...

    def step(
        self, actions: np.ndarray
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
