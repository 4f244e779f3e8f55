"""A rule-based dialogue state tracker: observations -> belief -> features; act ids -> text.

Classic dialogue policies (the DQN, the rule policy, the scripted expert) choose among
``NUM_ACTS`` discrete system acts over this tracker's state; the tracker renders the chosen
act as the text the environment reads (``confirm`` uses the belief's value, ``query`` the
belief's phrases, ``offer`` / ``book`` the last database result), so every policy talks to
the same ``DialogueEnv``. Features (``features()``, float32 ``[NUM_FEATURES]``): per slot
filled / confirmed / "any" / times asked, the last event one-hot, whether a database result
exists, is stale (the belief changed since the query), was offered and was accepted, and the
turn count over the budget (Zhao & Eskenazi 2016: belief over slots, turn count, last user act).
"""

from __future__ import annotations

import re

import numpy as np

from jaxagent.envs.dialogue import domain as D
from jaxagent.envs.dialogue.env import parse_phrases

ACT_NAMES = (
    [f"request_{s}" for s in D.SLOTS]
    + [f"confirm_{s}" for s in D.SLOTS]
    + ["query", "offer", "book"]
)
NUM_ACTS = len(ACT_NAMES)
QUERY, OFFER, BOOK = NUM_ACTS - 3, NUM_ACTS - 2, NUM_ACTS - 1
EVENTS = (
    "greet", "inform", "affirm", "deny", "accept", "reject", "change", "correction",
    "db_some", "db_none", "bad",
)  # fmt: skip
NUM_FEATURES = 4 * len(D.SLOTS) + len(EVENTS) + 4 + 1
_DB = re.compile(r"^db : (\d+) flights(?: , (f\d+))?")


class Tracker:
    """Belief state of one dialogue. ``update(observation)`` after every env reply."""

    def __init__(self, max_turns: int = 20):
        self.max_turns = max_turns
        self.belief: dict[str, str] = {}
        self.confirmed: set[str] = set()
        self.asked = {s: 0 for s in D.SLOTS}
        self.event = "greet"
        self.turn = 0
        self.result: str | None = None  # top flight id of the last query
        self.result_belief: dict[str, str] | None = None
        self.offered: str | None = None
        self.accepted = False
        self._last_act: tuple[str, str | None] = ("", None)

    @property
    def stale(self) -> bool:
        return self.result_belief is not None and self.result_belief != self.belief

    def update(self, observation: str) -> None:
        text = observation.strip()
        if text.startswith("db :"):
            m = _DB.match(text)
            n, top = (int(m.group(1)), m.group(2)) if m else (0, None)
            self.event = "db_some" if n else "db_none"
            self.result, self.result_belief = top, dict(self.belief)
            self.offered, self.accepted = None, False
            return
        if text.startswith("system :"):
            self.event = "bad"
            return
        said = text.split(":", 1)[-1].strip()
        values = parse_phrases(said)
        act, slot = self._last_act
        if act == "":
            self.event = "greet"
        elif "sorry , i meant" in said:
            self.event = "correction"
        elif said.startswith("actually"):
            self.event = "change"
        elif said.startswith("yes , that works"):
            self.event, self.accepted = "accept", True
        elif said.startswith("no ,"):
            self.event = "deny" if act == "confirm" else "reject"
        elif said.startswith("yes") and act == "confirm":
            self.event = "affirm"
            self.confirmed.add(slot)
        elif said.endswith("?"):
            self.event = "bad"
        else:
            self.event = "inform"
        for s, v in values.items():
            if self.belief.get(s) != v:
                self.confirmed.discard(s)
            self.belief[s] = v
        if self.event in ("deny", "reject", "change", "correction"):
            self.confirmed.update(values)  # an explicit statement in reply to a check
            if self.event in ("reject", "change"):
                self.accepted = False

    def act_text(self, act_id: int) -> str:
        """Records the act and returns its text for the environment."""
        self.turn += 1
        name = ACT_NAMES[act_id]
        if name.startswith("request_"):
            slot = name.split("_", 1)[1]
            self.asked[slot] += 1
            self._last_act = ("request", slot)
            return f"request {slot}"
        if name.startswith("confirm_"):
            slot = name.split("_", 1)[1]
            self._last_act = ("confirm", slot)
            return f"confirm {slot} {self.belief.get(slot, D.ANY)}"
        if act_id == QUERY:
            self._last_act = ("query", None)
            phrases = " , ".join(D.phrase(s, v) for s, v in self.belief.items() if v != D.ANY)
            return f"query {phrases}".strip()
        if act_id == OFFER:
            self._last_act = ("offer", None)
            self.offered = self.result
            return f"offer {self.result or 'none'}"
        self._last_act = ("book", None)
        return f"book {self.result or 'none'}"

    def features(self) -> np.ndarray:
        out = []
        for s in D.SLOTS:
            out += [
                float(s in self.belief),
                float(s in self.confirmed),
                float(self.belief.get(s) == D.ANY),
                min(self.asked[s], 3) / 3.0,
            ]
        out += [float(self.event == e) for e in EVENTS]
        out += [
            float(self.result is not None),
            float(self.stale),
            float(self.offered is not None and self.offered == self.result),
            float(self.accepted and not self.stale),
        ]
        out.append(min(self.turn, self.max_turns) / self.max_turns)
        return np.asarray(out, np.float32)
