"""Site layouts drawn from seeds: what is where on each page, apart from what is sold.

A layout fixes the chrome around the content (navigation links, banners, where the search box
sits, whether a category filter exists), how results are listed (rows per page, sort order,
how a row reads) and the order of the item page's parts (title, price, features, reviews, the
option select, the buy / save buttons and their labels). Train and test tasks draw layouts
from disjoint pools (``layout_pool``), so held-out success measures generalisation to sites
the policy never saw, not only to unseen items.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import numpy as np

NAV_WORDS = ("home", "deals", "help", "account", "orders", "about", "contact", "gifts")
BANNERS = (
    "free delivery today",
    "new season sale",
    "members get more",
    "best prices guaranteed",
    "top rated by guests",
    "secure checkout",
)
REVIEWS = (
    "review : great value",
    "review : fast and easy",
    "review : would recommend",
    "review : not bad",
    "review : exactly as shown",
)
# No label, banner or instruction word repeats an instruction's verb (buy / save, book / hold):
# the verb then occurs once in an episode, where the task states it, and which button it
# calls for is a learned mapping from verb to label, as on real sites, not a string match
# that a label ("buy now") or a save task's "do not buy" would make ambiguous.
BUY_LABELS = {
    "shop": ("purchase", "place order", "check out"),
    "booking": ("confirm stay", "complete booking"),
}
SAVE_LABELS = {
    "shop": ("add to wishlist", "keep for later"),
    "booking": ("add to favourites", "remember room"),
}
ITEM_PARTS = ("title", "price", "features", "reviews", "option", "buttons")
PER_PAGE = (4, 6, 100)  # 100: everything on one page
SORTS = ("price", "name", "shuffle")


@dataclasses.dataclass(frozen=True)
class Layout:
    """One site's layout (every field is data, JSON-serialisable into ``Task.data``)."""

    nav: tuple[str, ...]  # navigation links at the top of every page
    banners: tuple[str, ...]  # text lines under the navigation
    search: str  # "top" | "bottom" (of the results page)
    category_filter: bool  # a select that narrows the results to one category
    per_page: int  # result rows a page (then a "next page" link)
    sort: str  # order of the results
    row_price_first: bool  # "[7] link 42 dollars blue nordic jacket" vs title first
    item_parts: tuple[str, ...]  # order of the item page's parts
    num_reviews: int  # review lines on the item page
    buy_label: str
    save_label: str
    save_first: bool  # the save button comes before the buy button
    form_landing: bool  # the episode starts on a search form (booking) instead of results

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Layout":
        data = dict(data)
        for key in ("nav", "banners", "item_parts"):
            data[key] = tuple(data[key])
        return cls(**data)

    def fingerprint(self) -> str:
        blob = json.dumps(self.to_json(), sort_keys=True)
        return hashlib.sha1(blob.encode()).hexdigest()[:12]


LABELS = ("vary", "fixed")  # button labels drawn per layout, or each site's first pair


def sample_layout(site: str, rng: np.random.Generator, labels: str = "vary") -> Layout:
    nav = tuple(str(w) for w in rng.choice(NAV_WORDS, size=int(rng.integers(1, 4)), replace=False))
    banners = tuple(
        str(b) for b in rng.choice(BANNERS, size=int(rng.integers(0, 3)), replace=False)
    )
    # the option select and the buttons stay in order (select first): the content parts move
    parts = [str(p) for p in rng.permutation(["title", "price", "features", "reviews"])]
    parts.insert(int(rng.integers(1, len(parts) + 1)), "option")
    parts.insert(int(rng.integers(parts.index("option") + 1, len(parts) + 1)), "buttons")
    layout = Layout(
        nav=nav,
        banners=banners,
        search=str(rng.choice(["top", "bottom"])),
        category_filter=bool(rng.random() < 0.5),
        per_page=int(rng.choice(PER_PAGE)),
        sort=str(rng.choice(SORTS)),
        row_price_first=bool(rng.random() < 0.5),
        item_parts=tuple(parts),
        num_reviews=int(rng.integers(0, 4)),
        buy_label=str(rng.choice(BUY_LABELS[site])),
        save_label=str(rng.choice(SAVE_LABELS[site])),
        save_first=bool(rng.random() < 0.5),
        form_landing=site == "booking" and bool(rng.random() < 0.5),
    )
    if labels == "fixed":  # drawn all the same: every other field is as "vary" draws it
        layout = dataclasses.replace(
            layout, buy_label=BUY_LABELS[site][0], save_label=SAVE_LABELS[site][0]
        )
    return layout


def layout_pool(
    site: str, seed: int, num_train: int, num_test: int, labels: str = "vary"
) -> dict[str, list[Layout]]:
    """Disjoint pools of layouts: ``{"train": [...], "test": [...]}`` from separate streams,
    deduplicated on the whole layout (no test layout equals a train layout)."""
    pools: dict[str, list[Layout]] = {}
    seen: set[str] = set()
    for stream, split, count in ((0, "train", num_train), (1, "test", num_test)):
        rng = np.random.default_rng([seed, 101, stream])
        pools[split] = []
        while len(pools[split]) < count:
            layout = sample_layout(site, rng, labels)
            if layout.fingerprint() in seen:
                continue
            seen.add(layout.fingerprint())
            pools[split].append(layout)
    return pools


def layout_words() -> set[str]:
    words = set(NAV_WORDS)
    for group in (BANNERS, REVIEWS, *BUY_LABELS.values(), *SAVE_LABELS.values()):
        for text in group:
            words.update(text.split())
    return words
