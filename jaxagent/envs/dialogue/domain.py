"""The flight-booking domain: slots, values, the flight database, user goals and their splits.

A goal has three required slots (``origin``, ``destination``, ``day``) and two optional ones
(``time``, ``class``) whose value is a preference or ``any``; every goal is satisfiable (it is
drawn from a flight of the database) and so is its changed version when the user changes its
mind. Held-out goals: routes (origin, destination pairs) are split, so no test goal shares a
route with a train goal; test tasks also carry the held-out simulator setting
(``DialogueConfig.test_*``), so evaluation measures both unseen goals and an unseen user.
Phrases: every slot value is spoken as a fixed phrase (``from paris``, ``in the morning``,
``in business class``) that the user simulator says and the state tracker reads back.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from jaxagent.envs.base import Task, check_disjoint_splits

CITIES = ("paris", "rome", "berlin", "madrid", "vienna", "oslo", "lisbon")
DAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
TIMES = ("morning", "afternoon", "evening")
CLASSES = ("economy", "business")
REQUIRED = ("origin", "destination", "day")
OPTIONAL = ("time", "class")
SLOTS = REQUIRED + OPTIONAL
VALUES = {"origin": CITIES, "destination": CITIES, "day": DAYS, "time": TIMES, "class": CLASSES}
ANY = "any"


def phrase(slot: str, value: str) -> str:
    """How a slot value is spoken: ``from paris``, ``on monday``, ``in business class``."""
    if value == ANY:
        return f"any {slot}"
    return {
        "origin": f"from {value}",
        "destination": f"to {value}",
        "day": f"on {value}",
        "time": f"in the {value}",
        "class": f"in {value} class",
    }[slot]


@functools.lru_cache(maxsize=4)
def database(seed: int = 0) -> tuple[dict[str, Any], ...]:
    """The flights: 0-3 per (route, day), each with a time, a class and a price."""
    rng = np.random.default_rng([seed, 99])
    flights = []
    for o in CITIES:
        for d in CITIES:
            if o == d:
                continue
            for day in DAYS:
                for _ in range(int(rng.integers(0, 4))):
                    flights.append(
                        {
                            "id": f"f{len(flights)}",
                            "origin": o,
                            "destination": d,
                            "day": day,
                            "time": str(rng.choice(TIMES)),
                            "class": str(rng.choice(CLASSES)),
                            "price": int(rng.integers(50, 400)),
                        }
                    )
    return tuple(flights)


def matches(flight: dict, constraints: dict[str, str]) -> bool:
    return all(v == ANY or flight[s] == v for s, v in constraints.items())


@functools.lru_cache(maxsize=4)
def _by_route(seed: int) -> dict[tuple[str, str], tuple[dict, ...]]:
    out: dict[tuple[str, str], list[dict]] = {}
    for f in database(seed):
        out.setdefault((f["origin"], f["destination"]), []).append(f)
    return {k: tuple(v) for k, v in out.items()}


def query(constraints: dict[str, str], seed: int = 0) -> list[dict]:
    """Flights matching the constraints, cheapest first."""
    o, d = constraints.get("origin", ANY), constraints.get("destination", ANY)
    if ANY in (o, d):
        pool = database(seed)
    else:
        pool = _by_route(seed).get((o, d), ())
    found = [f for f in pool if matches(f, constraints)]
    return sorted(found, key=lambda f: (f["price"], f["id"]))


@dataclasses.dataclass(frozen=True, kw_only=True)
class SimulatorConfig:
    """The user simulator's behaviour (seeded per episode)."""

    patience: int = 2  # the user hangs up when asked for one slot more than this many times
    max_user_turns: int = 16  # the user hangs up after this many system acts
    verbosity: float = 0.3  # probability of volunteering each further unrequested slot
    error_rate: float = 0.1  # probability that an inform mis-states the value
    correct_prob: float = 0.5  # probability of correcting a mis-statement on the next turn
    change_prob: float = 0.2  # probability that the user changes its mind once per dialogue

    def __post_init__(self):
        for name in ("verbosity", "error_rate", "correct_prob", "change_prob"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"SimulatorConfig.{name}={value!r} must lie in [0, 1]")
        if self.patience < 1 or self.max_user_turns < 1:
            raise ValueError(
                f"SimulatorConfig.patience={self.patience} and max_user_turns="
                f"{self.max_user_turns} must be >= 1"
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class DialogueConfig:
    """Goals and splits. The test split uses the held-out simulator setting below."""

    num_train: int = 2000  # training goals
    num_test: int = 200  # held-out goals (routes disjoint from train)
    seed: int = 0  # goal seed (the database has its own fixed seed)
    test_route_frac: float = 0.25  # fraction of routes whose goals are test-only
    test_heldout_sim: bool = True  # False: the test split uses the training simulator
    test_patience: int = 2  # held-out simulator setting (used when test_heldout_sim)
    test_verbosity: float = 0.6
    test_error_rate: float = 0.15
    test_change_prob: float = 0.3

    def __post_init__(self):
        if self.num_train < 0 or self.num_test < 0:
            raise ValueError("DialogueConfig.num_train and num_test must be >= 0")
        if not 0.0 < self.test_route_frac < 1.0:
            raise ValueError(
                f"DialogueConfig.test_route_frac={self.test_route_frac!r} must be in (0, 1)"
            )


def _test_routes(config: DialogueConfig) -> set[tuple[str, str]]:
    routes = [(o, d) for o in CITIES for d in CITIES if o != d]
    rng = np.random.default_rng([config.seed, 5])
    k = max(1, int(round(config.test_route_frac * len(routes))))
    return {routes[i] for i in rng.choice(len(routes), size=k, replace=False)}


def make_goal(rng: np.random.Generator, flights: list[dict], db_seed: int = 0) -> dict:
    """A goal drawn from a flight, with optional preferences and a possible mind change."""
    f = flights[int(rng.integers(len(flights)))]
    goal = {s: f[s] for s in REQUIRED}
    for s in OPTIONAL:
        goal[s] = f[s] if rng.random() < 0.5 else ANY
    # The value the user may switch to: another day or time that still has a flight.
    changes = []
    for slot in ("day", "time"):
        for v in VALUES[slot]:
            if v != goal[slot] and query({**goal, slot: v}, db_seed):
                changes.append([slot, v])
    change = changes[int(rng.integers(len(changes)))] if changes else None
    return {"goal": goal, "change": change}


def goal_key(task: Task) -> str:
    g = task.data["goal"]
    return " ".join(g[s] for s in SLOTS) + f" {task.data['change']}"


class DialogueSource:
    """TaskSource of user goals: "train" and "test" (held-out routes and simulator)."""

    def __init__(self, config: DialogueConfig | None = None, sim: SimulatorConfig | None = None):
        self.config = config or DialogueConfig()
        self.sim = sim or SimulatorConfig()

    def splits(self) -> tuple[str, ...]:
        return ("train", "test")

    def tasks(self, split: str) -> list[Task]:
        if split not in self.splits():
            raise ValueError(f"unknown split {split!r}; the dialogue suite has {self.splits()}")
        return list(_generate(self.config, self.sim)[split])

    def check_disjoint(self) -> None:
        check_disjoint_splits(self, key=goal_key)
        train = {
            (t.data["goal"]["origin"], t.data["goal"]["destination"]) for t in self.tasks("train")
        }
        test = {
            (t.data["goal"]["origin"], t.data["goal"]["destination"]) for t in self.tasks("test")
        }
        if train & test:
            from jaxagent.envs.base import SplitLeakageError

            raise SplitLeakageError(f"routes in both splits: {sorted(train & test)[:3]}")


def sim_of(config: DialogueConfig, sim: SimulatorConfig, split: str) -> dict[str, Any]:
    if split == "test" and config.test_heldout_sim:
        sim = dataclasses.replace(
            sim,
            patience=config.test_patience,
            verbosity=config.test_verbosity,
            error_rate=config.test_error_rate,
            change_prob=config.test_change_prob,
        )
    return dataclasses.asdict(sim)


@functools.lru_cache(maxsize=8)
def _generate(config: DialogueConfig, sim: SimulatorConfig) -> dict[str, tuple[Task, ...]]:
    held = _test_routes(config)
    flights = database()
    pools = {
        "train": [f for f in flights if (f["origin"], f["destination"]) not in held],
        "test": [f for f in flights if (f["origin"], f["destination"]) in held],
    }
    out = {}
    for stream, split, count in ((0, "train", config.num_train), (1, "test", config.num_test)):
        rng = np.random.default_rng([config.seed, stream])
        sim_params = sim_of(config, sim, split)
        tasks = []
        for i in range(count):
            data = make_goal(rng, pools[split])
            data.update(sim=sim_params, sim_seed=int(rng.integers(2**31)))
            prompt = "book a flight"
            tasks.append(Task(id=f"dialogue-{split}-{i}", split=split, prompt=prompt, data=data))
        out[split] = tuple(tasks)
    return out
