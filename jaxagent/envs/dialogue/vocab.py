"""The dialogue suite's closed vocabulary (every word of its observations and acts)."""

from __future__ import annotations

from jaxagent.envs.dialogue import domain as D
from jaxagent.envs.dialogue.env import ACTS

_FIXED = (
    "user db system : , ? bad act flights price i need a flight meant sorry no yes that works "
    "actually want to fly instead which this takes too long bye any from on in the class none "
    "task book"
)


def vocabulary() -> list[str]:
    words = set(_FIXED.split()) | set(ACTS) | set(D.SLOTS)
    for values in D.VALUES.values():
        words.update(values)
    words.update(f["id"] for f in D.database())
    words.update(str(f["price"]) for f in D.database())
    words.update(str(n) for n in range(len(D.database()) + 1))  # "db : <n> flights"
    return sorted(words)
