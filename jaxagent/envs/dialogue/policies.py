"""Policies over the tracker: the hand-written rule policy, the scripted expert, random.

Each is ``choose(tracker) -> act id`` (``tracker.ACT_NAMES``); ``TextPolicy`` wraps one into
the suite's ``act(observation) -> text`` expert interface (SFT demonstrations, evaluation).

* ``rule_policy``: the classic ask-confirm-answer script a developer would write: for each
  slot in order, request it if unknown and explicitly confirm it if not yet confirmed; then
  query, offer, and book once the user accepts (re-query after a rejection or a change).
* ``expert_policy``: requests what is unknown (never twice), skips explicit confirmation and
  lets the offer do the checking (a rejection names the wrong slot), confirms only when the
  database finds nothing, books once accepted. It is the demonstrator, not the baseline.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from jaxagent.envs.base import Task
from jaxagent.envs.dialogue import domain as D
from jaxagent.envs.dialogue import tracker as TR

Choose = Callable[[TR.Tracker], int]
_REQUEST = {s: i for i, s in enumerate(D.SLOTS)}
_CONFIRM = {s: len(D.SLOTS) + i for i, s in enumerate(D.SLOTS)}


def _after_search(t: TR.Tracker) -> int | None:
    """The shared end game: query when needed, offer the result, book when accepted."""
    if t.result is None or t.stale or t.event in ("reject", "change"):
        return TR.QUERY
    if t.accepted:
        return TR.BOOK
    if t.offered != t.result:
        return TR.OFFER
    return None


def rule_policy(t: TR.Tracker) -> int:
    for s in D.SLOTS:
        if s not in t.belief:
            return _REQUEST[s]
        if s not in t.confirmed and t.belief[s] != D.ANY:
            return _CONFIRM[s]
    act = _after_search(t)
    return TR.QUERY if act is None or (act == TR.OFFER and t.event == "db_none") else act


def expert_policy(t: TR.Tracker) -> int:
    for s in D.SLOTS:
        if s not in t.belief and t.asked[s] < 1:
            return _REQUEST[s]
    if t.event == "db_none":  # some value is wrong: check the unconfirmed ones
        for s in D.SLOTS:
            if s not in t.confirmed and t.belief.get(s, D.ANY) != D.ANY:
                return _CONFIRM[s]
    act = _after_search(t)
    if act is None or (act == TR.OFFER and t.event == "db_none"):
        missing = [s for s in D.SLOTS if s not in t.belief]
        return _REQUEST[missing[0]] if missing else TR.QUERY
    return act


def random_policy(rng: np.random.Generator) -> Choose:
    return lambda t: int(rng.integers(TR.NUM_ACTS))


def random_text_action(rng: np.random.Generator) -> str:
    """A uniformly random act with random arguments (a flight id drawn from the database)."""
    act = str(rng.choice(["request", "confirm", "query", "offer", "book", "end"]))
    slot = str(rng.choice(D.SLOTS))
    if act == "request":
        return f"request {slot}"
    if act == "confirm":
        return f"confirm {slot} {rng.choice(D.VALUES[slot])}"
    if act in ("offer", "book"):
        return f"{act} f{int(rng.integers(len(D.database())))}"
    if act == "query":
        return "query " + D.phrase(slot, str(rng.choice(D.VALUES[slot])))
    return "end"


class TextPolicy:
    """``act(observation) -> act text`` for one dialogue, over a fresh tracker."""

    def __init__(self, choose: Choose, max_turns: int = 20):
        self.choose, self.tracker = choose, TR.Tracker(max_turns)

    def act(self, observation: str) -> str:
        self.tracker.update(observation)
        return self.tracker.act_text(self.choose(self.tracker))


def make_expert(task: Task, error_rate: float = 0.0, rng: np.random.Generator | None = None):
    """The suite's expert: ``expert_policy``; with probability ``error_rate`` per step it
    takes a random act instead (the mistakes SFT data carries)."""
    del task
    rng = rng if rng is not None else np.random.default_rng(0)

    def choose(t: TR.Tracker) -> int:
        if error_rate and rng.random() < error_rate:
            return int(rng.integers(TR.NUM_ACTS))
        return expert_policy(t)

    return TextPolicy(choose)
