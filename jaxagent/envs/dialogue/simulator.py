"""An agenda-based user simulator for flight booking (Schatzmann et al. 2007, simplified).

The user holds a goal (``domain.make_goal``) and an agenda of slots it has not said yet. It
opens with a request and, with probability ``verbosity`` each, volunteers further slots; it
answers ``request`` acts (``any <slot>`` for an optional slot it does not care about), affirms
or denies ``confirm`` acts (a denial states the right value), accepts or rejects offers (a
rejection names one slot the offer gets wrong, or says it changed its mind), mis-states a
value with probability ``error_rate`` and then corrects itself on its next turn with
probability ``correct_prob`` (otherwise only when that slot is confirmed or an offer gets it
wrong), changes its mind once with probability ``change_prob`` (at the first offer), and
hangs up when asked for one slot more than ``patience`` times or after ``max_user_turns``
system acts. Every draw comes from one generator seeded per episode.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxagent.envs.dialogue import domain as D


class UserSimulator:
    """One user for one episode. ``respond(act) -> (utterance, event)``; event is one of
    ``inform``, ``affirm``, ``deny``, ``accept``, ``reject``, ``change``, ``hangup``."""

    def __init__(self, data: dict[str, Any], sim: D.SimulatorConfig, rng: np.random.Generator):
        self.goal = dict(data["goal"])
        self.change = data.get("change")
        self.sim, self.rng = sim, rng
        self.will_change = self.change is not None and rng.random() < sim.change_prob
        self.asked: dict[str, int] = {}
        self.said: dict[str, str] = {}  # what the user last said for each slot
        self.pending_fix: str | None = None  # a mis-stated slot, to be corrected
        self.turns = 0
        self.hung_up = False

    def _say(self, slot: str, allow_error: bool = True) -> str:
        value = self.goal[slot]
        if allow_error and value != D.ANY and self.rng.random() < self.sim.error_rate:
            value = str(self.rng.choice([v for v in D.VALUES[slot] if v != value]))
            self.pending_fix = slot
        self.said[slot] = value
        return D.phrase(slot, value)

    def _volunteer(self, skip: str | None = None) -> list[str]:
        return [
            self._say(s)
            for s in D.SLOTS
            if s not in self.said and s != skip and self.rng.random() < self.sim.verbosity
        ]

    def opening(self) -> str:
        first = D.REQUIRED[int(self.rng.integers(len(D.REQUIRED)))]
        parts = [self._say(first)] + self._volunteer(skip=first)
        return "i need a flight " + " , ".join(parts)

    def _correction(self) -> list[str]:
        """The spontaneous correction of an earlier mis-statement, if it comes now."""
        slot = self.pending_fix
        if slot is None or self.rng.random() >= self.sim.correct_prob:
            return []
        self.pending_fix = None
        self.said[slot] = self.goal[slot]
        return ["sorry , i meant " + D.phrase(slot, self.goal[slot])]

    def respond(self, act: str, args: list[str], flight: dict | None) -> tuple[str, str]:
        self.turns += 1
        if self.turns > self.sim.max_user_turns:
            return self._hangup()
        fix = self._correction()
        if act == "request":
            slot = args[0]
            self.asked[slot] = self.asked.get(slot, 0) + 1
            if self.asked[slot] > self.sim.patience:
                return self._hangup()
            if self.pending_fix == slot:
                self.pending_fix = None  # asked again: says it right this time
            text = self._say(slot, allow_error=slot not in self.said)
            return " , ".join(fix + [text] + self._volunteer(skip=slot)), "inform"
        if act == "confirm":
            slot, value = args
            if value == self.goal[slot]:
                return " , ".join(fix + ["yes"]), "affirm"
            if self.pending_fix == slot:
                self.pending_fix = None
            self.said[slot] = self.goal[slot]
            return " , ".join(fix + ["no , " + D.phrase(slot, self.goal[slot])]), "deny"
        if act == "offer":
            if flight is None:
                return " , ".join(fix + ["which flight ?"]), "reject"
            if self.will_change:
                self.will_change = False
                slot, value = self.change
                self.goal[slot] = value
                self.said[slot] = value
                return "actually , i want to fly " + D.phrase(slot, value) + " instead", "change"
            wrong = [s for s in D.SLOTS if self.goal[s] != D.ANY and flight[s] != self.goal[s]]
            if not wrong:
                return " , ".join(fix + ["yes , that works"]), "accept"
            slot = wrong[0]
            if self.pending_fix == slot:
                self.pending_fix = None
            self.said[slot] = self.goal[slot]
            return "no , " + D.phrase(slot, self.goal[slot]), "reject"
        return " , ".join(fix + ["sorry ?"]), "inform"

    def _hangup(self) -> tuple[str, str]:
        self.hung_up = True
        return "this takes too long , bye", "hangup"

    def satisfied_by(self, flight: dict | None) -> bool:
        """Whether booking ``flight`` fulfils the user's (current) goal."""
        return flight is not None and D.matches(flight, self.goal)
