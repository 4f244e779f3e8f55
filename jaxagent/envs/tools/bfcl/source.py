"""BFCLSource: a BFCL multi-turn category as a ``TaskSource`` with disjoint splits."""

from __future__ import annotations

import dataclasses
import hashlib

from jaxagent.envs.base import SplitLeakageError, Task, check_disjoint_splits
from jaxagent.envs.tools.bfcl import data as D


@dataclasses.dataclass(frozen=True, kw_only=True)
class BFCLSourceConfig:
    category: str = "multi_turn_base"  # a multi-turn category of the installed bfcl-eval
    # share of entries in "test": a seeded hash of each group of entries that share a user
    # turn (an entry alone is its own group), so a recurring request stays in one split
    test_fraction: float = 0.25
    seed: int = 0  # changes which entries are held out
    limit: int | None = None  # use only the first ``limit`` entries (quick runs)

    def __post_init__(self):
        if not 0.0 <= self.test_fraction <= 1.0:
            raise ValueError(
                f"BFCLSourceConfig.test_fraction must be in [0, 1], got {self.test_fraction}"
            )
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"BFCLSourceConfig.limit must be >= 1 or None, got {self.limit}")


class BFCLSource:
    """Entries of one BFCL category split into "train" and "test", disjoint by id and by
    user-turn text: entries that share a turn (short ones such as "Let's do 100 shares."
    recur) form one group (connected components over shared turns), and the seeded hash
    assigns whole groups."""

    def __init__(self, config: BFCLSourceConfig | None = None, **overrides):
        self.config = dataclasses.replace(config or BFCLSourceConfig(), **overrides)
        entries = D.load_entries(self.config.category)[: self.config.limit]
        self._tasks: dict[str, list[Task]] = {"train": [], "test": []}
        groups = turn_groups(entries)
        for entry in entries:
            split = "test" if self._in_test(groups[entry["id"]]) else "train"
            self._tasks[split].append(D.entry_to_task(entry, split))
        self.check_disjoint()  # SFT demonstrations come from train: nothing of test may be there

    def _in_test(self, group: str) -> bool:
        digest = hashlib.sha1(f"{self.config.seed}:{group}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < self.config.test_fraction

    def splits(self) -> tuple[str, ...]:
        return ("train", "test")

    def tasks(self, split: str) -> list[Task]:
        if split not in self._tasks:
            raise ValueError(f"unknown split {split!r}; BFCLSource has {self.splits()}")
        return list(self._tasks[split])

    def check_disjoint(self) -> None:
        """Raise ``SplitLeakageError`` when an entry id or any user turn's text (the request
        a ground-truth demonstration answers) appears in both splits."""
        check_disjoint_splits(self, key=lambda t: t.id)
        seen = {text: t.id for t in self._tasks["train"] for text in user_turns(t)}
        for task in self._tasks["test"]:
            for text in user_turns(task):
                if text in seen:
                    raise SplitLeakageError(
                        f"a user turn of test entry {task.id!r} is also a turn of train entry "
                        f"{seen[text]!r}: {text[:80]!r}; change env.options.seed or dedupe"
                    )


def user_turns(task: Task) -> list[str]:
    """The user messages of each turn of a BFCL entry. Turns without a user message (the
    miss-function categories add a tool there instead) are left out: they request nothing."""
    return entry_turns(task.data)


def entry_turns(entry: dict) -> list[str]:
    texts = (
        " ".join(m["content"] for m in turn if m.get("role") == "user").strip()
        for turn in entry["question"]
    )
    return [t for t in texts if t]


def turn_groups(entries) -> dict[str, str]:
    """``{entry id: group key}``: entries joined when they share a user turn, transitively
    (union-find). The key is the group's first entry id in data order, so an entry that
    shares nothing keeps its own id (and the split it had before groups existed)."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    order = {e["id"]: i for i, e in enumerate(entries)}
    owner: dict[str, str] = {}  # turn text -> the first entry that has it
    for entry in entries:
        parent[entry["id"]] = entry["id"]
        for text in entry_turns(entry):
            other = owner.setdefault(text, entry["id"])
            a, b = find(other), find(entry["id"])
            if a != b:  # the earlier root stays: a group's key is its first entry
                first, later = sorted((a, b), key=order.__getitem__)
                parent[later] = first
    return {e["id"]: find(e["id"]) for e in entries}
