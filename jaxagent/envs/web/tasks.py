"""Task source of the embedded sites: train and test tasks on disjoint pools of layouts.

A task is (site, layout, catalog, instruction). Train tasks draw their layout from the train
pool and test tasks from the test pool (``layout.layout_pool``), so the test split measures
success on sites never seen in training; ``check_disjoint`` verifies that no layout is shared
(the split key is the layout's fingerprint, not the task's prompt).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from jaxagent.envs.base import Task, check_disjoint_splits
from jaxagent.envs.web.domain import DOMAINS, instruction, sample_catalog
from jaxagent.envs.web.layout import LABELS, layout_pool

SITES = tuple(DOMAINS)


@dataclasses.dataclass(frozen=True, kw_only=True)
class WebTasksConfig:
    """Task-source settings (they change which tasks exist, never an array shape)."""

    num_train: int = 2000  # training tasks
    num_test: int = 200  # held-out tasks, on held-out layouts
    train_layouts: int = 40  # layouts in the train pool
    test_layouts: int = 20  # layouts in the test pool (disjoint from train)
    num_items: int = 12  # items in a task's catalog (one target, the rest distractors)
    seed: int = 0  # base seed; layouts, train and test tasks use separate streams
    # The instruction quotes the target's title (see ``domain.instruction``): what a policy
    # must imitate from the expert's demonstrations is then visible to it.
    name_item: bool = False
    # The expert thinks before it presses a button, as ReAct's WebShop agents do
    # (``think ( " task : buy button purchase [8] " )``: the task's verb, the label it calls for
    # and its id).
    think: bool = False
    # "vary": each layout draws its buy and save labels ("purchase" / "place order" / "check
    # out", "add to wishlist" / "keep for later"); "fixed": every site shows the first pair,
    # and layouts differ in everything else (layout.LABELS).
    labels: str = "vary"

    def __post_init__(self):
        for name in ("num_train", "num_test"):
            if getattr(self, name) < 0:
                raise ValueError(f"WebTasksConfig.{name}={getattr(self, name)} must be >= 0")
        for name in ("train_layouts", "test_layouts"):
            if getattr(self, name) < 1:
                raise ValueError(f"WebTasksConfig.{name}={getattr(self, name)} must be >= 1")
        if self.labels not in LABELS:
            raise ValueError(f"WebTasksConfig.labels={self.labels!r}; choose one of {LABELS}")
        if not 2 <= self.num_items <= 40:
            raise ValueError(f"WebTasksConfig.num_items={self.num_items} must be in [2, 40]")


def layout_key(task: Task) -> str:
    return task.data["layout_id"]


class WebWorld:
    """``TaskSource`` of one embedded site ("shop" or "booking")."""

    def __init__(self, site: str, config: WebTasksConfig | None = None, **overrides):
        if site not in SITES:
            raise ValueError(f"site={site!r}; choose one of {SITES}")
        self.site = site
        self.config = dataclasses.replace(config or WebTasksConfig(), **overrides)

    def splits(self) -> tuple[str, ...]:
        return ("train", "test")

    def tasks(self, split: str) -> list[Task]:
        if split not in self.splits():
            raise ValueError(f"unknown split {split!r}; WebWorld has {self.splits()}")
        return list(_generate(self.site, self.config)[split])

    def layouts(self, split: str):
        c = self.config
        return layout_pool(self.site, c.seed, c.train_layouts, c.test_layouts, c.labels)[split]

    def check_disjoint(self) -> None:
        """Raises ``SplitLeakageError`` if a layout serves both splits."""
        check_disjoint_splits(self, key=layout_key)


def make_task(
    site: str,
    layout,
    rng: np.random.Generator,
    task_id: str,
    split: str,
    n: int,
    name_item: bool = False,
    think: bool = False,
):
    domain = DOMAINS[site]
    catalog = sample_catalog(domain, rng, n)
    data = {
        "site": site,
        "layout": layout.to_json(),
        "layout_id": layout.fingerprint(),
        "catalog": catalog,
        "think": think,
    }
    return Task(id=task_id, split=split, prompt=instruction(domain, catalog, name_item), data=data)


@functools.lru_cache(maxsize=8)
def _generate(site: str, config: WebTasksConfig) -> dict[str, tuple[Task, ...]]:
    pools = layout_pool(site, config.seed, config.train_layouts, config.test_layouts, config.labels)
    out = {}
    for stream, split, count in ((0, "train", config.num_train), (1, "test", config.num_test)):
        rng = np.random.default_rng([config.seed, 202, stream])
        tasks = []
        for i in range(count):
            layout = pools[split][i % len(pools[split])]
            tasks.append(
                make_task(
                    site,
                    layout,
                    rng,
                    f"{site}-{split}-{i}",
                    split,
                    config.num_items,
                    config.name_item,
                    config.think,
                )
            )
        out[split] = tuple(tasks)
    return out
