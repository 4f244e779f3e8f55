"""The quickstart tool world: entities, state, the ten tools and their execution.

A deliberately small, closed world so that a tiny transformer trained from scratch on CPU can
learn it in minutes: a few stocks, cities, week days, events and note keys, small integers
(0..``MAX_INT``), and every text the world produces is single-space separated words drawn from
``vocabulary()`` (so a word-level tokenizer is ``text.split()`` / ``" ".join(words)``).

State is a plain dict (JSON-serialisable): read-only facts (today's prices, yesterday's
closing quotes, temperatures, the cancel code) and mutable parts (the calendar and the notes).
``execute`` is a pure function ``(state, tool, kwargs) -> (result words, new state, error)``.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping

import numpy as np

from jaxagent.envs.tool_spec import ToolSpec

ITEMS = ("acme", "bolt", "cora", "dune", "echo", "flux")  # stocks
CITIES = ("oslo", "lima", "rome", "cairo", "tokyo", "paris")
DAYS = ("mon", "tue", "wed", "thu", "fri")
EVENTS = ("gym", "lunch", "call", "demo", "party")
KEYS = ("memo", "plan", "todo", "idea")  # note keys
MAX_INT = 120  # every number in the world (arguments and results) lies in 0..MAX_INT

_INT = {"type": "integer", "minimum": 0, "maximum": MAX_INT}


def _spec(name, description, properties, returns, dangerous=False):
    return ToolSpec(
        name=name,
        description=description,
        parameters={"type": "object", "properties": properties, "required": list(properties)},
        returns=returns,
        dangerous=dangerous,
    )


TOOL_SPECS: dict[str, ToolSpec] = {
    s.name: s
    for s in (
        _spec(
            "price",
            "today's price of a stock",
            {"item": {"type": "string", "enum": list(ITEMS)}},
            _INT,
        ),
        _spec(
            "quote",
            "yesterday's closing price of a stock",
            {"item": {"type": "string", "enum": list(ITEMS)}},
            _INT,
        ),
        _spec(
            "weather",
            "today's temperature of a city",
            {"city": {"type": "string", "enum": list(CITIES)}},
            _INT,
        ),
        _spec("add", "a plus b", {"a": _INT, "b": _INT}, _INT),
        _spec("mul", "a times b", {"a": _INT, "b": _INT}, _INT),
        _spec(
            "save",
            "store a number in the notes under a key",
            {"key": {"type": "string", "enum": list(KEYS)}, "value": _INT},
            {"type": "string"},
        ),
        _spec(
            "agenda",
            "the events of a day",
            {"day": {"type": "string", "enum": list(DAYS)}},
            {"type": "string"},
        ),
        _spec(
            "book",
            "add an event to a day",
            {
                "day": {"type": "string", "enum": list(DAYS)},
                "event": {"type": "string", "enum": list(EVENTS)},
            },
            {"type": "string"},
        ),
        _spec(
            "cancel",
            "clear all events of a day; needs today's code (see help)",
            {"day": {"type": "string", "enum": list(DAYS)}, "code": _INT},
            _INT,
            dangerous=True,
        ),
        _spec(
            "help",
            "documentation of a tool",
            {"tool": {"type": "string", "enum": []}},
            {"type": "string"},
        ),
    )
}
# help's enum is every tool name (filled here, since the specs must exist first).
TOOL_SPECS["help"] = _spec(
    "help",
    "documentation of a tool",
    {"tool": {"type": "string", "enum": list(TOOL_SPECS)}},
    {"type": "string"},
)
TOOL_NAMES = tuple(TOOL_SPECS)

# Short documentation returned by help(tool); cancel's ends with the code of the day.
DOCS = {
    "price": "price ( item ) gives today 's price",
    "quote": "quote ( item ) gives yesterday 's price",
    "weather": "weather ( city ) gives today 's temperature",
    "add": "add ( a , b ) gives a plus b",
    "mul": "mul ( a , b ) gives a times b",
    "save": "save ( key , value ) stores value in the notes",
    "agenda": "agenda ( day ) lists the events",
    "book": "book ( day , event ) adds an event",
    "cancel": "cancel ( day , code ) clears a day . code is",
    "help": "help ( tool ) explains a tool",
}
ERROR_WORDS = (
    "error",
    "bad",
    "syntax",
    "unknown",
    "tool",
    "argument",
    "for",
    "wrong",
    "code",
    "result",
    "too",
    "big",
    "no",
    "answer",
    "step",
    "budget",
    "over",
)


def compact_signature(name: str) -> str:
    """``price ( item )``: the compact tool form shown in prompts."""
    args = TOOL_SPECS[name].param_order
    inner = " , ".join(args)
    return f"{name} ( {inner} )" if inner else f"{name} ( )"


def sample_state(rng: np.random.Generator) -> dict[str, Any]:
    """A random world: distinct prices (3..20), quotes and temperatures, quotes != prices, a
    calendar whose busy days hold distinct events, empty notes, and a cancel code in 10..99."""
    prices = rng.choice(np.arange(3, 21), size=len(ITEMS), replace=False)
    quotes = rng.choice(np.arange(3, 21), size=len(ITEMS), replace=False)
    while np.any(quotes == prices):  # a quote never equals the same stock's price
        quotes = rng.choice(np.arange(3, 21), size=len(ITEMS), replace=False)
    temps = rng.choice(np.arange(0, 31), size=len(CITIES), replace=False)
    calendar = {day: [] for day in DAYS}
    events = list(rng.permutation(EVENTS))
    busy = rng.choice(len(DAYS), size=3, replace=False)
    calendar[DAYS[busy[0]]] = [events[0]]
    calendar[DAYS[busy[1]]] = [events[1]]
    calendar[DAYS[busy[2]]] = [events[2], events[3]]
    return {
        "prices": {i: int(p) for i, p in zip(ITEMS, prices)},
        "quotes": {i: int(q) for i, q in zip(ITEMS, quotes)},
        "temps": {c: int(t) for c, t in zip(CITIES, temps)},
        "code": int(rng.integers(10, 100)),
        "calendar": {d: [str(e) for e in v] for d, v in calendar.items()},
        "notes": {},
    }


def mutable_part(state: Mapping[str, Any]) -> dict[str, Any]:
    """The part of the state a task may change (compared for end-state success)."""
    return {"calendar": state["calendar"], "notes": state["notes"]}


def execute(
    state: Mapping[str, Any], tool: str, kwargs: Mapping[str, Any]
) -> tuple[str, dict[str, Any], bool]:
    """Runs one schema-valid call.

    Returns (result words, new state, is_error). The input state is not modified.
    """
    new = copy.deepcopy(dict(state))
    if tool == "price":
        return str(new["prices"][kwargs["item"]]), new, False
    if tool == "quote":
        return str(new["quotes"][kwargs["item"]]), new, False
    if tool == "weather":
        return str(new["temps"][kwargs["city"]]), new, False
    if tool in ("add", "mul"):
        a, b = kwargs["a"], kwargs["b"]
        value = a + b if tool == "add" else a * b
        if value > MAX_INT:
            return "error : result too big", new, True
        return str(value), new, False
    if tool == "save":
        new["notes"][kwargs["key"]] = kwargs["value"]
        return "ok", new, False
    if tool == "agenda":
        events = new["calendar"][kwargs["day"]]
        return (" ".join(events) if events else "free"), new, False
    if tool == "book":
        new["calendar"][kwargs["day"]].append(kwargs["event"])
        return "ok", new, False
    if tool == "cancel":
        if kwargs["code"] != new["code"]:
            return "error : wrong code", new, True
        count = len(new["calendar"][kwargs["day"]])
        new["calendar"][kwargs["day"]] = []
        return f"cancelled {count}", new, False
    if tool == "help":
        doc = DOCS[kwargs["tool"]]
        return (f"{doc} {new['code']}" if kwargs["tool"] == "cancel" else doc), new, False
    raise KeyError(f"tool {tool!r} is not a quickstart tool; known: {', '.join(TOOL_NAMES)}")


def system_prompt() -> str:
    """Format instructions and every tool's documentation, in vocabulary words."""
    docs = " ".join(f"{DOCS[name]} ." for name in TOOL_NAMES if name != "cancel")
    return (
        "answer the task with the tools . write Action : tool ( arg = value ) , read the "
        "Observation , and end with Final : answer . " + docs + " cancel ( day , code ) "
        "clears a day ; ask help for the code ."
    )
