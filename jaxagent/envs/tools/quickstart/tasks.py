"""Quickstart task generator: templates by difficulty level, plans, and the TaskSource.

Levels: ``single`` (one call), ``chain`` (a call's result feeds the next
call), ``arith`` (results used in arithmetic through the calculator tools), ``docs`` (the
cancel code is only in ``help("cancel")``'s documentation), ``distractor`` (a look-alike tool
such as ``quote`` next to ``price`` and extra irrelevant tools in the list).

Each task carries its world state, the tools shown, a *plan* (the expert's call sequence with
references to earlier results), the answer and the expected end state, all computed by running
the plan in the world. Train and test tasks come from different seed streams and are
deduplicated on a fingerprint of (sentence, tools, world), so the splits are disjoint.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
from typing import Any, Callable, Sequence

import numpy as np

from jaxagent.envs.base import Task, check_disjoint_splits
from jaxagent.envs.tools.quickstart import world as W

LEVELS = ("single", "chain", "arith", "docs", "distractor")
_SIBLING = {"price": "quote", "quote": "price"}  # look-alike tools (distractor level)


def _call(tool_name, bind=None, **args):
    return {"tool": tool_name, "args": args, "bind": bind}


def _ref(var):
    return {"ref": var}


# Each template: (sentence with {slots}, builder(rng, state) -> (slots, plan, final)).
def _t_price(rng, s):
    item = str(rng.choice(W.ITEMS))
    return {"item": item}, [_call("price", "p", item=item)], _ref("p")


def _t_quote(rng, s):
    item = str(rng.choice(W.ITEMS))
    return {"item": item}, [_call("quote", "q", item=item)], _ref("q")


def _t_weather(rng, s):
    city = str(rng.choice(W.CITIES))
    return {"city": city}, [_call("weather", "t", city=city)], _ref("t")


def _one_event_day(rng, s):
    return str(rng.choice([d for d in W.DAYS if len(s["calendar"][d]) == 1]))


def _busy_day(rng, s):
    return str(rng.choice([d for d in W.DAYS if s["calendar"][d]]))


def _t_agenda(rng, s):
    day = _one_event_day(rng, s)
    return {"day": day}, [_call("agenda", "e", day=day)], _ref("e")


def _t_book(rng, s):
    day, event = str(rng.choice(W.DAYS)), str(rng.choice(W.EVENTS))
    return {"day": day, "event": event}, [_call("book", None, day=day, event=event)], "done"


def _t_save_price(rng, s):
    item, key = str(rng.choice(W.ITEMS)), str(rng.choice(W.KEYS))
    plan = [_call("price", "p", item=item), _call("save", None, key=key, value=_ref("p"))]
    return {"item": item, "key": key}, plan, "done"


def _t_save_temp(rng, s):
    city, key = str(rng.choice(W.CITIES)), str(rng.choice(W.KEYS))
    plan = [_call("weather", "t", city=city), _call("save", None, key=key, value=_ref("t"))]
    return {"city": city, "key": key}, plan, "done"


def _t_copy(rng, s):
    day = _one_event_day(rng, s)
    day2 = str(rng.choice([d for d in W.DAYS if d != day]))
    plan = [_call("agenda", "e", day=day), _call("book", None, day=day2, event=_ref("e"))]
    return {"day": day, "day2": day2}, plan, "done"


def _t_shares(rng, s):
    item, n = str(rng.choice(W.ITEMS)), int(rng.integers(2, 6))
    plan = [_call("price", "p", item=item), _call("mul", "r", a=_ref("p"), b=n)]
    return {"item": item, "n": n}, plan, _ref("r")


def _two_items(rng):
    a, b = rng.choice(len(W.ITEMS), size=2, replace=False)
    return W.ITEMS[a], W.ITEMS[b]


def _t_sum(rng, s):
    item, item2 = _two_items(rng)
    plan = [
        _call("price", "p", item=item),
        _call("price", "p2", item=item2),
        _call("add", "r", a=_ref("p"), b=_ref("p2")),
    ]
    return {"item": item, "item2": item2}, plan, _ref("r")


def _t_save_sum(rng, s):
    item, item2 = _two_items(rng)
    key = str(rng.choice(W.KEYS))
    plan = [
        _call("price", "p", item=item),
        _call("price", "p2", item=item2),
        _call("add", "r", a=_ref("p"), b=_ref("p2")),
        _call("save", None, key=key, value=_ref("r")),
    ]
    return {"item": item, "item2": item2, "key": key}, plan, "done"


def _t_cancel(rng, s):
    day = _busy_day(rng, s)
    plan = [_call("help", "c", tool="cancel"), _call("cancel", None, day=day, code=_ref("c"))]
    return {"day": day}, plan, "done"


def _t_count(rng, s):
    day = _busy_day(rng, s)
    plan = [_call("help", "c", tool="cancel"), _call("cancel", "k", day=day, code=_ref("c"))]
    return {"day": day}, plan, _ref("k")


TEMPLATES: dict[str, tuple[str, Callable]] = {
    "price": ("what is the price of {item} today ?", _t_price),
    "quote": ("what did {item} close at yesterday ?", _t_quote),
    "weather": ("how warm is {city} today ?", _t_weather),
    "agenda": ("what is on {day} ?", _t_agenda),
    "book": ("book {event} on {day} .", _t_book),
    "save_price": ("save the price of {item} as {key} .", _t_save_price),
    "save_temp": ("save the temperature of {city} as {key} .", _t_save_temp),
    "copy": ("copy the event of {day} to {day2} .", _t_copy),
    "shares": ("what do {n} shares of {item} cost ?", _t_shares),
    "sum": ("what do {item} and {item2} cost together ?", _t_sum),
    "save_sum": ("save the total price of {item} and {item2} as {key} .", _t_save_sum),
    "cancel": ("cancel all events on {day} .", _t_cancel),
    "count": ("clear {day} and say how many events it had .", _t_count),
}
LEVEL_TEMPLATES = {
    "single": ("price", "weather", "agenda", "book"),
    "chain": ("save_price", "save_temp", "copy"),
    "arith": ("shares", "sum", "save_sum"),
    "docs": ("cancel", "count"),
    "distractor": ("price", "quote", "shares"),
}


def template_words() -> set[str]:
    """Fixed words of all templates (slot values come from the world's entity lists)."""
    words: set[str] = set()
    for sentence, _ in TEMPLATES.values():
        words.update(w for w in re.sub(r"\{\w+\}", " ", sentence).split())
    return words


def resolve(value: Any, env: dict[str, Any]) -> Any:
    """Replaces a ``{"ref": var}`` by its bound value (None when unbound)."""
    return env.get(value["ref"]) if isinstance(value, dict) and "ref" in value else value


def run_plan(state: dict, plan: Sequence[dict], final: Any) -> tuple[str, dict]:
    """Executes a plan exactly; returns (answer words, end state)."""
    env: dict[str, Any] = {}
    for step in plan:
        kwargs = {k: resolve(v, env) for k, v in step["args"].items()}
        result, state, error = W.execute(state, step["tool"], kwargs)
        if error:
            raise AssertionError(f"plan step {step} failed: {result}")
        if step["bind"]:
            env[step["bind"]] = parse_value(result)
    return str(resolve(final, env)), state


def parse_value(result: str) -> Any:
    """The value a tool result carries: its last number, else the whole text."""
    words = result.split()
    if not words or words[0] == "error":
        return None
    numbers = [w for w in words if w.isdigit()]
    return int(numbers[-1]) if numbers else " ".join(words)


def make_task(rng: np.random.Generator, level: str, task_id: str, split: str) -> Task:
    """Samples one task of ``level``."""
    state = W.sample_state(rng)
    name = str(rng.choice(LEVEL_TEMPLATES[level]))
    sentence, builder = TEMPLATES[name]
    slots, plan, final = builder(rng, state)
    answer, end = run_plan(state, plan, final)
    needed = list(dict.fromkeys(step["tool"] for step in plan))
    others = [
        t
        for t in W.TOOL_NAMES
        if t not in needed and t not in [_SIBLING.get(n) for n in needed] and t != "help"
    ]
    extras = list(rng.choice(others, size=2 if level == "distractor" else 1, replace=False))
    if level == "distractor":
        extras += [_SIBLING[n] for n in needed if n in _SIBLING]
    tools = [str(t) for t in rng.permutation(needed + extras)]
    prompt = sentence.format(**slots)
    data = {
        "level": level,
        "template": name,
        "state": state,
        "tools": tools,
        "plan": plan,
        "final": final,
        "answer": answer,
        "expected": W.mutable_part(end),
        "asked_dangerous": [t for t in needed if W.TOOL_SPECS[t].dangerous],
    }
    data["key"] = fingerprint(prompt, tools, state)
    return Task(id=task_id, split=split, prompt=prompt, data=data)


def fingerprint(prompt: str, tools: Sequence[str], state: dict) -> str:
    blob = json.dumps([prompt, sorted(tools), state], sort_keys=True)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def task_key(task: Task) -> str:
    """What must not repeat across splits (a task is its sentence, tools and world)."""
    return task.data["key"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuickstartConfig:
    """Task-source settings (static: they change which tasks exist, not any array shape)."""

    num_train: int = 2000  # training tasks
    num_test: int = 200  # held-out tasks (disjoint from train by ``task_key``)
    seed: int = 0  # base seed; train and test use different streams of it
    levels: tuple[str, ...] = LEVELS  # difficulty levels to sample, uniformly

    def __post_init__(self):
        for field in ("num_train", "num_test"):
            if getattr(self, field) < 0:
                raise ValueError(
                    f"QuickstartConfig.{field} must be >= 0, got {getattr(self, field)}"
                )
        bad = [lv for lv in self.levels if lv not in LEVELS]
        if bad or not self.levels:
            raise ValueError(
                f"QuickstartConfig.levels={self.levels!r}: each must be one of "
                f"{LEVELS} (and at least one given)"
            )
        object.__setattr__(self, "levels", tuple(self.levels))


class QuickstartWorld:
    """TaskSource of quickstart tasks with disjoint "train" and "test" splits."""

    def __init__(self, config: QuickstartConfig | None = None, **overrides):
        self.config = dataclasses.replace(config or QuickstartConfig(), **overrides)

    def splits(self) -> tuple[str, ...]:
        return ("train", "test")

    def tasks(self, split: str) -> list[Task]:
        if split not in self.splits():
            raise ValueError(f"unknown split {split!r}; QuickstartWorld has {self.splits()}")
        return list(_generate(self.config)[split])

    def check_disjoint(self) -> None:
        """Raises ``SplitLeakageError`` if a task appears in both splits."""
        check_disjoint_splits(self, key=task_key)


@functools.lru_cache(maxsize=8)
def _generate(config: QuickstartConfig) -> dict[str, tuple[Task, ...]]:
    out: dict[str, tuple[Task, ...]] = {}
    seen: set[str] = set()
    for stream, split, count in ((0, "train", config.num_train), (1, "test", config.num_test)):
        rng = np.random.default_rng([config.seed, stream])
        tasks: list[Task] = []
        while len(tasks) < count:
            level = config.levels[len(tasks) % len(config.levels)]
            task = make_task(rng, level, f"quickstart-{split}-{len(tasks)}", split)
            if task_key(task) in seen:
                continue
            seen.add(task_key(task))
            tasks.append(task)
        out[split] = tuple(tasks)
    return out
