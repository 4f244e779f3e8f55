"""The reply record (``EnvReply``), episode seeds, and the one validation of env answers."""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

import numpy as np

from jaxagent.envs.base import (
    StepResult,
    Termination,
    env_error_info,
    env_error_message,
    is_env_error,
)


def episode_seed(pool_seed: int, env_id: int, episode: int, attempt: int = 0) -> int:
    """Deterministic 32-bit seed of one episode attempt (independent of timing)."""
    return int(np.random.SeedSequence([pool_seed, env_id, episode, attempt]).generate_state(1)[0])


@dataclasses.dataclass
class EnvReply:
    """One environment answer, the one record between the environments and the rollout
    driver: the pool hands it back (``kind`` "reset", observation only, or "step"), and the
    driver's runners (``jaxagent.agents.runner``) answer with it.

    An environment failure (a crash, hang or corrupt answer the pool or runner caught, or one
    the environment reports itself) is a final reply whose ``info`` is
    ``jaxagent.envs.base.env_error_info``: ``env_error`` is True, ``error`` says what failed,
    and its reward is 0.
    """

    observation: str
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    env_id: int = -1  # the pool env (or runner slot) that answered
    episode_id: int = -1  # unique per pool, in order of async_reset
    kind: str = "step"
    latency_s: float = 0.0

    @property
    def env_error(self) -> bool:
        return is_env_error(self.info)

    @property
    def error(self) -> str | None:
        """What failed when the environment failed, else None."""
        return env_error_message(self.info) if self.env_error else None

    @classmethod
    def failed(cls, reason: str, detail: str = "", **where: Any) -> "EnvReply":
        """The final reply of an episode whose environment failed (``reason``: "timeout",
        "crash", "corrupt", "exception")."""
        obs = f"[environment error: {reason}] {detail}".strip()
        return cls(obs, 0.0, True, env_error_info(reason, detail), **where)


def validate_answer(kind: str, value: Any) -> str:
    """Return a description of what is wrong with an env's answer, or '' if it is valid."""
    if kind == "reset":
        return "" if isinstance(value, str) else f"reset returned {type(value).__name__}, not str"
    if isinstance(value, tuple) and len(value) == 4:
        value = StepResult(*value)
    if not isinstance(value, StepResult):
        return f"step returned {type(value).__name__}, not StepResult"
    if not isinstance(value.observation, str):
        return f"step observation is {type(value.observation).__name__}, not str"
    if not isinstance(value.reward, numbers.Real) or not math.isfinite(value.reward):
        return f"step reward {value.reward!r} is not a finite number"
    if not isinstance(value.done, (bool, np.bool_)):
        return f"step done {value.done!r} is not a bool"
    if not isinstance(value.info, dict):
        return f"step info is {type(value.info).__name__}, not dict"
    return ""


def step_reply(value: Any, **where: Any) -> EnvReply:
    """The reply of a ``step`` answer that passed ``validate_answer``. An environment that
    reports its own failure (``info["termination"] == "env_error"``) ends the episode with
    reward 0 even without ``done``; a final reply carries ``info["termination"]``."""
    step = value if isinstance(value, StepResult) else StepResult(*value)
    info = dict(step.info)
    if is_env_error(info):
        return EnvReply(step.observation, 0.0, True, info, **where)
    if step.done:
        info.setdefault(
            "termination",
            Termination.TRUNCATED.value if step.truncated else Termination.TERMINATED.value,
        )
    return EnvReply(step.observation, float(step.reward), bool(step.done), info, **where)
