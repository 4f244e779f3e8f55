"""DialogueEnv: flight booking against the user simulator, as a ``TextEnv``.

System acts, one per step (words separated by spaces):

  ``request <slot>``                       ask the user for a slot
  ``confirm <slot> <value>``               ask the user to confirm a value
  ``query <phrases>``                      search the database, e.g. ``query from paris , to
                                           rome , on monday , in the morning``
  ``offer <flight>``                       propose a flight (``offer f12``) to the user
  ``book <flight>``                        book it: ends the dialogue
  ``end``                                  end without booking

Observations are ``user : <utterance>`` or ``db : <n> flights , <best flight>`` (cheapest
match first). Reward (Zhao & Eskenazi 2016): ``success_reward`` for booking
a flight that fulfils the user's current goal, ``-turn_cost`` every step,
``-wrong_booking_penalty`` for booking a wrong flight and ``-wrong_confirm_penalty`` for
confirming a value the user does not want. Failure modes: ``wrong_state`` (wrong booking),
``gave_up`` (``end``, or the user hung up: ``info["hangup"]``), ``invalid_syntax`` (an act
that does not parse; per step), ``step_budget`` (``max_turns``; a truncation), ``env_error``
(a simulator exception).
"""

from __future__ import annotations

import dataclasses
import re
import zlib

import numpy as np

from jaxagent.envs.base import FailureMode, StepResult, Task, Termination, env_error_info
from jaxagent.envs.dialogue import domain as D
from jaxagent.envs.dialogue.simulator import UserSimulator
from jaxagent.envs.rewards import reward_terms

ACTS = ("request", "confirm", "query", "offer", "book", "end")
_PHRASE = re.compile(
    r"\b(?:any (origin|destination|day|time|class)"
    r"|from (\w+)|to (\w+)|on (\w+)|in the (\w+)|in (\w+) class)\b"
)


def parse_phrases(text: str) -> dict[str, str]:
    """Slot values spoken in ``text`` (``domain.phrase`` read back; later ones win)."""
    out: dict[str, str] = {}
    for m in _PHRASE.finditer(text):
        any_slot, *values = m.groups()
        if any_slot:
            out[any_slot] = D.ANY
            continue
        for slot, value in zip(("origin", "destination", "day", "time", "class"), values):
            if value is not None and value in D.VALUES[slot]:
                out[slot] = value
    return out


def describe(flight: dict) -> str:
    phrases = " ".join(D.phrase(s, flight[s]) for s in D.SLOTS)
    return f"{flight['id']} {phrases} price {flight['price']}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class DialogueEnvConfig:
    """Episode settings and the reward."""

    max_turns: int = 20  # system acts before truncation
    success_reward: float = 1.0  # booking a flight that fulfils the goal
    turn_cost: float = 0.05  # paid every step
    wrong_booking_penalty: float = 1.0  # booking a flight that does not
    wrong_confirm_penalty: float = 0.3  # confirming a value the user does not want

    def __post_init__(self):
        if self.max_turns < 1:
            raise ValueError(f"DialogueEnvConfig.max_turns must be >= 1, got {self.max_turns}")
        for name in ("turn_cost", "wrong_booking_penalty", "wrong_confirm_penalty"):
            if getattr(self, name) < 0:
                raise ValueError(f"DialogueEnvConfig.{name} must be >= 0 (it is subtracted)")


class DialogueEnv:
    """One dialogue at a time (``TextEnv``; ``seed(s)`` varies the user between samples)."""

    def __init__(self, config: DialogueEnvConfig | None = None, **overrides):
        self.config = dataclasses.replace(config or DialogueEnvConfig(), **overrides)
        self._task: Task | None = None
        self._done = True
        self._seed: int | None = None

    def seed(self, seed: int) -> None:
        self._seed = int(seed)

    def reset(self, task: Task) -> str:
        self._task, self._steps, self._done = task, 0, False
        sim = D.SimulatorConfig(**task.data["sim"])
        parts = [int(task.data["sim_seed"]), zlib.crc32(task.id.encode())]
        rng = np.random.default_rng(parts + ([self._seed] if self._seed is not None else []))
        self._seed = None  # one episode per seed
        self.user = UserSimulator(task.data, sim, rng)
        return "user : " + self.user.opening()

    def step(self, action: str) -> StepResult:
        if self._task is None or self._done:
            raise RuntimeError("DialogueEnv.step called before reset() or after the end")
        self._steps += 1
        words = (action or "").split()
        try:
            return self._act(words)
        except Exception as exc:  # a simulator bug is the environment's failure
            self._done = True
            info = env_error_info("exception", f"{type(exc).__name__}: {exc}")
            return StepResult("user : bye", 0.0, True, info)

    def _act(self, words: list[str]) -> StepResult:
        cfg = self.config
        act, args = (words[0], words[1:]) if words else ("", [])
        if act not in ACTS or not self._valid(act, args):
            return self._continue("system : bad act", -cfg.turn_cost, FailureMode.INVALID_SYNTAX)
        if act == "end":
            return self._finish(-cfg.turn_cost, FailureMode.GAVE_UP)
        if act == "query":
            found = D.query(parse_phrases(" ".join(args)))
            text = f"db : {len(found)} flights" + (f" , {describe(found[0])}" if found else "")
            return self._continue(text, -cfg.turn_cost, None)
        flight = _flight(args[0]) if act in ("offer", "book") else None
        if act == "book":
            if self.user.satisfied_by(flight):
                return self._finish(cfg.success_reward - cfg.turn_cost, None)
            reward = -cfg.wrong_booking_penalty - cfg.turn_cost
            return self._finish(reward, FailureMode.WRONG_STATE)
        reward = -cfg.turn_cost
        if act == "confirm" and args[1] != self.user.goal[args[0]]:
            reward -= cfg.wrong_confirm_penalty
        text, event = self.user.respond(act, args, flight)
        if event == "hangup":
            return self._finish(reward, FailureMode.GAVE_UP, text=text, hangup=True)
        return self._continue("user : " + text, reward, None)

    @staticmethod
    def _valid(act: str, args: list[str]) -> bool:
        if act == "request":
            return len(args) == 1 and args[0] in D.SLOTS
        if act == "confirm":
            return len(args) == 2 and args[0] in D.SLOTS and args[1] in (*D.VALUES[args[0]], D.ANY)
        if act in ("offer", "book"):
            return len(args) == 1
        return act == "query" or not args

    def _continue(self, text: str, reward: float, mode) -> StepResult:
        if self._steps >= self.config.max_turns:
            return self._finish(reward, FailureMode.STEP_BUDGET, truncated=True)
        info = {
            "reward_terms": reward_terms(process=float(mode is None)),
            "failure_mode": mode and mode.value,
            "truncated": False,
            "success": False,
        }
        return StepResult(text, float(reward), False, info)

    def _finish(self, reward, mode, *, text="user : bye", truncated=False, hangup=False):
        self._done = True
        success = mode is None
        info = {
            "reward_terms": reward_terms(1.0, float(success), float(success)),
            "failure_mode": mode and mode.value,
            "truncated": truncated,
            "success": success,
            "hangup": hangup,
            "termination": (Termination.TRUNCATED if truncated else Termination.TERMINATED).value,
        }
        if not text.startswith("user :"):
            text = "user : " + text
        return StepResult(text, float(reward), True, info)

    def close(self) -> None:
        self._task = None


_FLIGHTS: dict[str, dict] | None = None


def _flight(flight_id: str) -> dict | None:
    global _FLIGHTS
    if _FLIGHTS is None:
        _FLIGHTS = {f["id"]: f for f in D.database()}
    return _FLIGHTS.get(flight_id)
