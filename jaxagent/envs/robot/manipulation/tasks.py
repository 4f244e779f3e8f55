"""Instructions with multi-step plans, random layouts, sub-goals checked on the simulator state.

A task is an instruction ("put the red block in the blue cup , then move the blue cup to the
tray"), a layout (where every object starts), the plan a scripted planner follows (skill
calls) and the sub-goals, each a conjunction of predicates on the final simulated state:

  ``["in", block, cup]``: the block rests inside the (upright) cup;
  ``["on_tray", obj]``: the object rests on the tray pad;
  ``["pushed", obj, direction, x0, y0]``: moved >= 5 cm that way from (x0, y0), still on
  the table.

The world's colours are the first ``block_colours`` / ``cup_colours`` of the scene's palettes;
a task's scene holds the objects its plan uses plus others drawn to make ``N_BLOCKS`` blocks
and ``N_CUPS`` cups. With the defaults (3 and 2) every scene holds the same five objects and
there are 41 instructions; 6 and 4 give 210, so a policy has to read the colours it is told
rather than recall the few combinations of a small world.

Splits hold out whole instructions, stratified by kind: a test instruction never appears in
train (the layouts differ per task as well), and every kind is in both splits, so held-out
success measures generalisation to new object combinations.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools

import numpy as np

from jaxagent.envs.base import Task
from jaxagent.envs.robot.manipulation import scene as S
from jaxagent.envs.robot.manipulation.skills import DIRECTIONS


@functools.cache
def templates(block_colours: int = S.N_BLOCKS, cup_colours: int = S.N_CUPS) -> tuple:
    """(kind, instruction, plan, subgoals, needs) for every instruction of the world whose
    colours are the palettes' first ``block_colours`` and ``cup_colours``."""
    out = []
    blocks = [f"{c} block" for c in S.BLOCK_PALETTE[:block_colours]]
    cups = [f"{c} cup" for c in S.CUP_PALETTE[:cup_colours]]
    for b, c in itertools.product(blocks, cups):
        pick_place = [("move_to", b), ("grasp", b), ("place", b, c)]
        out.append(("put", f"put the {b} in the {c}", pick_place, [[["in", b, c]]], {}))
        then_tray = [("move_to", c), ("grasp", c), ("place", c, "tray")]
        out.append(
            (
                "put_then_tray",
                f"put the {b} in the {c} , then move the {c} to the tray",
                pick_place + then_tray,
                [[["in", b, c]], [["in", b, c], ["on_tray", c]]],
                {},
            )
        )
    for b in blocks:
        out.append(
            (
                "tray",
                f"put the {b} on the tray",
                [("move_to", b), ("grasp", b), ("place", b, "tray")],
                [[["on_tray", b]]],
                {},
            )
        )
        for d in DIRECTIONS:
            out.append(("push", f"push the {b} {d}", [("push", b, d)], [[["pushed", b, d]]], {}))
    for c1, c2 in itertools.permutations(cups, 2):
        for b in blocks:  # the block that starts in c1 (not named by the instruction)
            out.append(
                (
                    "pour",
                    f"pour the {c1} into the {c2}",
                    [("move_to", c1), ("grasp", c1), ("pour", c1, c2)],
                    [[["in", b, c2]]],
                    {"inside": (b, c1)},
                )
            )
    for b1, b2 in itertools.permutations(blocks, 2):
        for c in cups:
            out.append(
                (
                    "tray_then_put",
                    f"put the {b1} on the tray , then put the {b2} in the {c}",
                    [("move_to", b1), ("grasp", b1), ("place", b1, "tray")]
                    + [("move_to", b2), ("grasp", b2), ("place", b2, c)],
                    [[["on_tray", b1]], [["in", b2, c]]],
                    {},
                )
            )
    return tuple(out)


TEMPLATES = templates()  # the default world: 45 templates, 41 instruction texts


def template_words() -> list[str]:
    """Every word of every instruction over the whole palettes (the word vocabulary)."""
    every = templates(len(S.BLOCK_PALETTE), len(S.CUP_PALETTE))
    return sorted({w for t in every for w in t[1].split()})


@dataclasses.dataclass(frozen=True, kw_only=True)
class ManipulationConfig:
    """The task source."""

    num_train: int = 400  # train tasks (layouts drawn per task)
    num_test: int = 100  # test tasks, over the held-out instructions
    test_fraction: float = 0.25  # share of instructions held out for test
    unreachable_prob: float = 0.3  # chance that an object the plan does not use is out of reach
    block_colours: int = S.N_BLOCKS  # the first n of scene.BLOCK_PALETTE
    cup_colours: int = S.N_CUPS  # the first n of scene.CUP_PALETTE
    balance_kinds: bool = False  # draw the kind uniformly, then an instruction of it
    seed: int = 0

    def __post_init__(self):
        if self.num_train < 1 or self.num_test < 1:
            raise ValueError(
                f"num_train={self.num_train} and num_test={self.num_test} must be >= 1"
            )
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError(f"test_fraction={self.test_fraction} must lie in (0, 1)")
        for name, n, lo, palette in (
            ("block_colours", self.block_colours, S.N_BLOCKS, S.BLOCK_PALETTE),
            ("cup_colours", self.cup_colours, S.N_CUPS, S.CUP_PALETTE),
        ):
            if not lo <= n <= len(palette):
                raise ValueError(
                    f"{name}={n} must lie in [{lo}, {len(palette)}]: a scene holds {lo}, "
                    f"the palette has {len(palette)} ({', '.join(palette)})"
                )


def _hash01(instruction: str) -> float:
    return int(hashlib.sha256(instruction.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF


def split_templates(templates, test_fraction: float) -> dict[str, list]:
    """Stratified by kind: the ``test_fraction`` of each kind's instructions with the lowest
    hash (at least one, never all) is test-only. A split over all 41 instructions at once
    drew half of the six ``pour`` instructions into test and one of the six ``put``: the test
    mix of kinds then differs from train's, and held-out success measures the mix as much as
    generalisation to new object combinations."""
    by_kind: dict[str, list[str]] = {}  # kind -> its distinct instruction texts
    for t in templates:  # a pour's text names the cups only: one text, several templates
        if t[1] not in by_kind.setdefault(t[0], []):
            by_kind[t[0]].append(t[1])
    test: set[str] = set()
    for texts in by_kind.values():
        ranked = sorted(texts, key=_hash01)
        test.update(ranked[: min(max(1, round(test_fraction * len(ranked))), len(ranked) - 1)])
    return {
        "train": [t for t in templates if t[1] not in test],
        "test": [t for t in templates if t[1] in test],
    }


USED_RANGE = 0.22  # |x|, |y| of the objects a plan uses


def scene_objects(rng: np.random.Generator, used: set[str], blocks, cups) -> tuple[str, ...]:
    """The ``used`` objects plus others of ``blocks`` / ``cups`` drawn to fill the scene
    (no draw when the world has exactly the scene's objects), in palette order."""
    out: list[str] = []
    for pool, n in ((blocks, S.N_BLOCKS), (cups, S.N_CUPS)):
        rest = [o for o in pool if o not in used]
        k = n - (len(pool) - len(rest))
        pick = set(rng.choice(rest, size=k, replace=False).tolist()) if len(rest) > k else rest
        out += [o for o in pool if o in used or o in pick]
    return tuple(out)


def sample_layout(
    rng: np.random.Generator,
    used: set[str],
    inside: tuple | None,
    far_prob: float,
    objects: tuple[str, ...] = S.OBJECTS,
):
    """Positions ``{obj: (x, y, z)}`` of the scene's ``objects``: used objects within reach,
    >= 12 cm apart, off the tray; an unused one out of reach with probability ``far_prob``;
    ``inside = (block, cup)`` starts the block in the cup."""
    layout: dict[str, tuple[float, float, float]] = {}
    taken: list[np.ndarray] = [np.array(S.TRAY_XY)]
    unused = [o for o in objects if o not in used and not (inside and o == inside[0])]
    far = rng.choice(unused) if unused and rng.random() < far_prob else None
    for obj in objects:
        if inside and obj == inside[0]:
            continue
        for _ in range(1000):
            if obj == far:
                x = rng.choice([-1, 1]) * rng.uniform(S.REACH + 0.02, S.TABLE_HALF - 0.025)
                xy = np.array([x, rng.uniform(-0.3, 0.1)])
            else:
                # what the plan uses stays 10 cm + a margin from the edges (a push keeps it on
                # the table), out of the tray's row; the others anywhere within reach
                lim = USED_RANGE if obj in used or (inside and obj == inside[1]) else 0.3
                xy = rng.uniform(-lim, lim, size=2)
                xy[1] = min(xy[1], 0.12)
            if all(np.linalg.norm(xy - t) > 0.13 for t in taken):
                break
        else:
            raise RuntimeError(f"no free place for {obj} after 1000 draws (layout {layout})")
        taken.append(xy)
        z = S.BLOCK_HALF if obj.endswith("block") else 0.0
        layout[obj] = (float(xy[0]), float(xy[1]), z)
    if inside:
        b, c = inside
        cx, cy, _ = layout[c]
        layout[b] = (cx, cy, S.CUP_WALL * 2 + S.BLOCK_HALF + 0.002)
    return layout


class ManipulationWorld:
    """Task source (``splits()``, ``tasks(split)``) with instruction-level held-out test."""

    def __init__(self, config: ManipulationConfig | None = None):
        self.config = c = config or ManipulationConfig()
        self._colours = (
            [f"{k} block" for k in S.BLOCK_PALETTE[: c.block_colours]],
            [f"{k} cup" for k in S.CUP_PALETTE[: c.cup_colours]],
        )
        by_split = split_templates(templates(c.block_colours, c.cup_colours), c.test_fraction)
        self._tasks = {
            split: self._make(split, by_split[split], n, c.seed + k)
            for k, (split, n) in enumerate((("train", c.num_train), ("test", c.num_test)))
        }

    def _make(self, split: str, templates, n: int, seed: int) -> list[Task]:
        rng = np.random.default_rng(seed)
        tasks = []
        by_kind: dict[str, list] = {}
        for t in templates:
            by_kind.setdefault(t[0], []).append(t)
        kinds = sorted(by_kind)
        for i in range(n):
            pool = templates
            if self.config.balance_kinds:
                pool = by_kind[kinds[int(rng.integers(len(kinds)))]]
            kind, text, plan, subgoals, extra = pool[int(rng.integers(len(pool)))]
            inside = extra.get("inside")
            used = {a for step in plan for a in step[1:] if a in S.PALETTE_OBJECTS}
            used.update(inside or ())
            objects = scene_objects(rng, used, *self._colours)
            layout = sample_layout(rng, used, inside, self.config.unreachable_prob, objects)
            goals = [
                [g + list(layout[g[1]][:2]) if g[0] == "pushed" else list(g) for g in goal]
                for goal in subgoals
            ]
            data = {
                "kind": kind,
                "layout": {k: list(v) for k, v in layout.items()},
                "plan": [list(s) for s in plan],
                "subgoals": goals,
            }
            tasks.append(Task(id=f"{split}-{i}", split=split, prompt=text, data=data))
        return tasks

    def splits(self):
        return ("train", "test")

    def tasks(self, split: str):
        if split not in self._tasks:
            raise KeyError(f"split {split!r}; available: {list(self._tasks)}")
        return self._tasks[split]


def check_subgoal(scene: S.Scene, goal) -> bool:
    """Whether every predicate of one sub-goal holds in the scene now."""
    return all(_holds(scene, p) for p in goal)


def _holds(scene: S.Scene, pred) -> bool:
    kind, obj = pred[0], pred[1]
    p = scene.pos(obj)
    if kind == "in":
        c = scene.pos(pred[2])
        inner = S.CUP_HALF - S.CUP_WALL
        return bool(
            scene.upright(pred[2])
            and np.all(np.abs(p[:2] - c[:2]) < inner)
            and c[2] - 0.005 < p[2] < c[2] + S.CUP_HEIGHT
        )
    if kind == "on_tray":
        off = np.abs(p[:2] - np.array(S.TRAY_XY))
        return bool(
            np.all(off < np.array(S.TRAY_HALF) + 0.02)
            and -0.01 < p[2] < 0.05
            and scene.upright(obj)
        )
    if kind == "pushed":
        u = np.array(DIRECTIONS[pred[2]])
        moved = float(np.dot(p[:2] - np.array(pred[3:5]), u))
        on_table = bool(np.all(np.abs(p[:2]) < S.TABLE_HALF) and p[2] > -0.01)
        return moved >= 0.05 and on_table
    raise ValueError(f"unknown predicate {kind!r}")
