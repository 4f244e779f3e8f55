"""BFCLSource: a BFCL multi-turn category as a ``TaskSource`` with disjoint splits."""

from __future__ import annotations

import dataclasses
import hashlib

from jaxagent.envs.base import SplitLeakageError, Task, check_disjoint_splits
from jaxagent.envs.tools.bfcl import data as D


@dataclasses.dataclass(frozen=True, kw_only=True)
class BFCLSourceConfig:
    category: str = "multi_turn_base"  # a multi-turn category of the installed bfcl-eval
    test_fraction: float = 0.25  # share of entries in "test" (by a seeded hash of the id)
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
    """Entries of one BFCL category split into "train" and "test" (disjoint by id)."""

    def __init__(self, config: BFCLSourceConfig | None = None, **overrides):
        self.config = dataclasses.replace(config or BFCLSourceConfig(), **overrides)
        entries = D.load_entries(self.config.category)[: self.config.limit]
        self._tasks: dict[str, list[Task]] = {"train": [], "test": []}
        for entry in entries:
            split = "test" if self._in_test(entry["id"]) else "train"
            self._tasks[split].append(D.entry_to_task(entry, split))
        self.check_disjoint()  # SFT demonstrations come from train: nothing of test may be there

    def _in_test(self, entry_id: str) -> bool:
        digest = hashlib.sha1(f"{self.config.seed}:{entry_id}".encode()).digest()
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
    texts = (
        " ".join(m["content"] for m in turn if m.get("role") == "user").strip()
        for turn in task.data["question"]
    )
    return [t for t in texts if t]
