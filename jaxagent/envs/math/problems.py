"""Generated math problems: levels, templates, difficulties, and train/test splits.

Levels: ``arith`` (multi-step arithmetic), ``fraction`` (fractions and
percentages), ``word`` (word problems from templates, with distractor quantities that the
question does not use) and ``linear`` (linear equations in x). Each template builds, from a
generator and a difficulty (1 easy .. 3 hard: larger numbers, more steps), the problem text,
one calculator expression whose value is the answer (the expert's plan) and the exact answer
as a ``fractions.Fraction``. Every text is lower-case words separated by single spaces, with
integers in ``[-MAX_INT, MAX_INT]`` as single words, so a word-level tokenizer has a closed
vocabulary (``vocab.vocabulary``).

Splits are by template and difficulty (``holdout``): with ``"template"`` the last template of
each level is test-only, with ``"difficulty"`` the hardest difficulty is, with ``"none"`` the
splits share cells but no problem. ``check_leakage`` verifies that no problem text crosses
splits and that no held-out (template, difficulty) cell appears in train.
"""

from __future__ import annotations

import dataclasses
import functools
from fractions import Fraction
from typing import Callable

import numpy as np

from jaxagent.envs.base import SplitLeakageError, Task, check_disjoint_splits
from jaxagent.envs.math.calc import evaluate, format_value

MAX_INT = 999  # every number a text contains lies in [-MAX_INT, MAX_INT]
LEVELS = ("arith", "fraction", "word", "linear")
DIFFICULTIES = (1, 2, 3)
HOLDOUTS = ("template", "difficulty", "none")


@dataclasses.dataclass(frozen=True)
class Problem:
    text: str  # the question, words separated by single spaces
    expr: str  # a calculator expression equal to the answer (the expert's plan)
    answer: Fraction
    percent: bool = False  # the answer is a percentage ("25" and "25 %" both right)


def _hi(d: int) -> int:
    return {1: 9, 2: 20, 3: 40}[d]


def _n(rng, d, lo=2):
    return int(rng.integers(lo, _hi(d) + 1))


# --- arith -----------------------------------------------------------------------------------
def _sum_prod(rng, d):
    a, b, c = _n(rng, d), _n(rng, d), _n(rng, d, 2)
    return Problem(f"what is {a} + {b} * {c} ?", f"{a} + {b} * {c}", Fraction(a + b * c))


def _paren(rng, d):
    a, b, c = _n(rng, d), _n(rng, d), _n(rng, d, 2)
    return Problem(f"what is ( {a} + {b} ) * {c} ?", f"( {a} + {b} ) * {c}", Fraction((a + b) * c))


def _chain(rng, d):
    xs = [_n(rng, d, 1) for _ in range(2 + d)]
    signs = [str(rng.choice(["+", "-"])) for _ in xs[1:]]
    expr = " ".join([str(xs[0])] + [f"{s} {x}" for s, x in zip(signs, xs[1:])])
    return Problem(f"compute {expr} .", expr, evaluate(expr))


def _divide(rng, d):
    c, q, b = _n(rng, d), _n(rng, d), _n(rng, d)
    a = c * q  # divisible: a / c is the whole number q
    return Problem(f"what is {a} / {c} - {b} ?", f"{a} / {c} - {b}", Fraction(q - b))


# --- fraction and percent --------------------------------------------------------------------
def _frac_add(rng, d):
    a, b, c, e = _n(rng, d, 1), _n(rng, d), _n(rng, d, 1), _n(rng, d)
    expr = f"{a} / {b} + {c} / {e}"
    return Problem(f"what is {expr} ?", expr, evaluate(expr))


def _frac_mul(rng, d):
    a, b, c, e = _n(rng, d, 1), _n(rng, d), _n(rng, d, 1), _n(rng, d)
    expr = f"( {a} / {b} ) * ( {c} / {e} )"
    return Problem(f"what is {a} / {b} times {c} / {e} ?", expr, evaluate(expr))


def _pct_of(rng, d):
    p = int(rng.choice([10, 20, 25, 50, 75] if d == 1 else range(5, 100, 5)))
    n = 20 * _n(rng, d, 1)
    return Problem(f"what is {p} % of {n} ?", f"{p} * {n} / 100", Fraction(p * n, 100))


def _pct_what(rng, d):
    b = int(rng.choice([10, 20, 50, 100] if d == 1 else [20, 25, 40, 50, 80, 100, 200]))
    p = int(rng.choice(range(5, 100, 5)))
    a = Fraction(p * b, 100)
    if a.denominator != 1:
        a, p = Fraction(b, 2), 50
    text = f"{a} is what percent of {b} ?"
    return Problem(text, f"{a} * 100 / {b}", Fraction(p), percent=True)


# --- word problems with distractors ----------------------------------------------------------
_NAMES = ("ann", "bob", "eva", "tom", "mia", "sam")
_PETS = ("dogs", "cats", "birds")


def _w_buy(rng, d):
    who, a, b, x = str(rng.choice(_NAMES)), _n(rng, d), _n(rng, d), _n(rng, d)
    text = (
        f"{who} has {a} apples and {x} pears . {who} buys {b} more apples . "
        "how many apples are there now ?"
    )
    return Problem(text, f"{a} + {b}", Fraction(a + b))


def _w_shelves(rng, d):
    per, k, x = _n(rng, d), _n(rng, d), _n(rng, d)
    text = (
        f"a room has {k} shelves and {x} chairs . each shelf holds {per} books . "
        "how many books are on the shelves ?"
    )
    return Problem(text, f"{k} * {per}", Fraction(k * per))


def _w_spend(rng, d):
    b, c, age = _n(rng, d), _n(rng, d), _n(rng, d)
    a = b + c + _n(rng, d, 1)
    who = str(rng.choice(_NAMES))
    text = (
        f"{who} is {age} years old and has {a} dollars . {who} spends {b} dollars on lunch "
        f"and {c} dollars on a book . how many dollars are left ?"
    )
    return Problem(text, f"{a} - {b} - {c}", Fraction(a - b - c))


def _w_share(rng, d):
    k, q, x = _n(rng, d), _n(rng, d), _n(rng, d)
    pet = str(rng.choice(_PETS))
    text = (
        f"{k * q} cookies are shared equally by {k} kids who have {x} {pet} . "
        "how many cookies does each kid get ?"
    )
    return Problem(text, f"{k * q} / {k}", Fraction(q))


# --- linear equations ------------------------------------------------------------------------
def _lin_axb(rng, d):
    a, x, b = _n(rng, d), int(rng.integers(-_hi(d), _hi(d) + 1)), _n(rng, d, 1)
    c = a * x + b
    return Problem(f"solve for x : {a} * x + {b} = {c} .", f"( {c} - {b} ) / {a}", Fraction(x))


def _lin_sides(rng, d):
    a, c = _n(rng, d), _n(rng, d)
    if a == c:
        a += 1
    x, b = int(rng.integers(-_hi(d), _hi(d) + 1)), _n(rng, d, 1)
    e = a * x + b - c * x
    return Problem(
        f"solve for x : {a} * x + {b} = {c} * x + {e} .",
        f"( {e} - {b} ) / ( {a} - {c} )",
        Fraction(x),
    )


def _lin_div(rng, d):
    a, x, b = _n(rng, d), _n(rng, d), _n(rng, d, 1)
    x = a * x  # x / a is a whole number
    c = x // a + b
    return Problem(f"solve for x : x / {a} + {b} = {c} .", f"( {c} - {b} ) * {a}", Fraction(x))


Template = Callable[[np.random.Generator, int], Problem]
TEMPLATES: dict[str, dict[str, Template]] = {
    "arith": {"sum_prod": _sum_prod, "paren": _paren, "chain": _chain, "divide": _divide},
    "fraction": {"frac_add": _frac_add, "pct_of": _pct_of, "frac_mul": _frac_mul,
                 "pct_what": _pct_what},
    "word": {"buy": _w_buy, "shelves": _w_shelves, "spend": _w_spend, "share": _w_share},
    "linear": {"axb": _lin_axb, "sides": _lin_sides, "div": _lin_div},
}  # fmt: skip


def template_texts() -> list[str]:
    """One problem of every template and difficulty (their words span the vocabulary)."""
    rng = np.random.default_rng(0)
    return [
        fn(rng, d).text for level in TEMPLATES.values() for fn in level.values() for d in (1, 3)
    ]


@dataclasses.dataclass(frozen=True, kw_only=True)
class MathConfig:
    """Task-source settings (static: they change which tasks exist, not any array shape)."""

    num_train: int = 2000  # training problems
    num_test: int = 200  # held-out problems
    seed: int = 0  # base seed; train and test use different streams of it
    levels: tuple[str, ...] = LEVELS  # levels to sample, round-robin
    difficulties: tuple[int, ...] = DIFFICULTIES  # difficulties to sample
    holdout: str = "template"  # what the test split holds out: template | difficulty | none

    def __post_init__(self):
        for field in ("num_train", "num_test"):
            if getattr(self, field) < 0:
                raise ValueError(f"MathConfig.{field} must be >= 0, got {getattr(self, field)}")
        object.__setattr__(self, "levels", tuple(self.levels))
        object.__setattr__(self, "difficulties", tuple(self.difficulties))
        bad = [lv for lv in self.levels if lv not in LEVELS]
        if bad or not self.levels:
            raise ValueError(f"MathConfig.levels={self.levels!r}: each must be one of {LEVELS}")
        bad = [d for d in self.difficulties if d not in DIFFICULTIES]
        if bad or not self.difficulties:
            raise ValueError(
                f"MathConfig.difficulties={self.difficulties!r}: each must be one of {DIFFICULTIES}"
            )
        if self.holdout not in HOLDOUTS:
            raise ValueError(f"MathConfig.holdout={self.holdout!r}: choose one of {HOLDOUTS}")
        if self.holdout == "difficulty" and len(self.difficulties) < 2:
            raise ValueError(
                "MathConfig.holdout='difficulty' needs at least two difficulties "
                f"(got {self.difficulties}); add one or use holdout='template'"
            )

    def cells(self, split: str) -> list[tuple[str, str, int]]:
        """The (level, template, difficulty) cells a split samples from."""
        out = []
        top = max(self.difficulties)
        for level in self.levels:
            names = list(TEMPLATES[level])
            for name in names:
                for d in self.difficulties:
                    held = {
                        "template": name == names[-1],
                        "difficulty": d == top,
                        "none": split == "test",
                    }[self.holdout]
                    if held == (split == "test"):
                        out.append((level, name, d))
        return out


def make_task(rng, level: str, template: str, difficulty: int, task_id: str, split: str) -> Task:
    p = TEMPLATES[level][template](rng, difficulty)
    data = {
        "level": level,
        "template": template,
        "difficulty": difficulty,
        "expr": p.expr,
        "answer": format_value(p.answer),
        "percent": p.percent,
    }
    return Task(id=task_id, split=split, prompt=p.text, data=data)


def _in_range(task: Task) -> bool:
    """Every number of the problem, its plan and its answer is a vocabulary word."""
    words = f"{task.prompt} {task.data['expr']} {task.data['answer']}".split()
    return all(not w.lstrip("-").isdigit() or abs(int(w)) <= MAX_INT for w in words)


class MathSource:
    """TaskSource of generated problems with disjoint "train" and "test" splits."""

    def __init__(self, config: MathConfig | None = None, **overrides):
        self.config = dataclasses.replace(config or MathConfig(), **overrides)

    def splits(self) -> tuple[str, ...]:
        return ("train", "test")

    def tasks(self, split: str) -> list[Task]:
        if split not in self.splits():
            raise ValueError(f"unknown split {split!r}; the math suite has {self.splits()}")
        return list(_generate(self.config)[split])

    def check_leakage(self) -> None:
        """Raises ``SplitLeakageError`` when a problem text is in both splits, or a held-out
        (template, difficulty) cell shows up in train."""
        check_disjoint_splits(self)
        if self.config.holdout == "none":
            return
        held = {(lv, t, d) for lv, t, d in self.config.cells("test")}
        for task in self.tasks("train"):
            cell = (task.data["level"], task.data["template"], task.data["difficulty"])
            if cell in held:
                raise SplitLeakageError(
                    f"train task {task.id!r} comes from held-out cell {cell} "
                    f"(holdout={self.config.holdout!r})"
                )


@functools.lru_cache(maxsize=8)
def _generate(config: MathConfig) -> dict[str, tuple[Task, ...]]:
    out: dict[str, tuple[Task, ...]] = {}
    seen: set[str] = set()
    for stream, split, count in ((1, "test", config.num_test), (0, "train", config.num_train)):
        # Test first: train then skips every problem text the test split holds.
        rng = np.random.default_rng([config.seed, stream])
        cells = config.cells(split)
        tasks: list[Task] = []
        attempts = 0
        while len(tasks) < count and cells:
            attempts += 1
            if attempts > 50 * count + 1000:
                raise ValueError(
                    f"the math suite could not draw {count} distinct {split} problems from "
                    f"{len(cells)} cells; lower num_{split} or add levels / difficulties"
                )
            level, name, d = cells[attempts % len(cells)]  # an exhausted cell is skipped
            task = make_task(rng, level, name, d, f"math-{split}-{len(tasks)}", split)
            if task.prompt in seen or not _in_range(task):
                continue
            seen.add(task.prompt)
            tasks.append(task)
        out[split] = tuple(tasks)
    return {"train": out["train"], "test": out["test"]}
