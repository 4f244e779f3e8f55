"""The embedded site: pages built from (catalog, layout, browsing state), and what actions do.

Everything the site remembers lives in one JSON-like ``state`` dict (page, query, filter,
result page, open item, selected option, scroll offset, history, the final purchase), so a
snapshot is a deep copy and a restored site answers the same actions identically. Pages are
rebuilt from the state on every view: there is no hidden browser state to go stale.

A page is a list of ``Element`` s numbered from 1 in page order; the text view shows only the
``viewport`` elements from the scroll offset on, and acting on an element outside the view is
refused (``not in view``): the agent must scroll or navigate to reveal the rest.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxagent.envs.web.domain import DOMAINS, Domain
from jaxagent.envs.web.layout import REVIEWS, Layout

ROLES = ("link", "button", "text", "searchbox", "select")
# Where an episode starts: "layout" (the layout's page: the results, or the booking form) or
# "search", WebShop's start page, which holds only the search box (the policy's first act
# is a query, and the instruction is the only text before it that names an item).
LANDINGS = ("layout", "search")


@dataclasses.dataclass(frozen=True)
class Element:
    """One line of a page. ``target`` says what a click does (links and buttons)."""

    id: int
    role: str  # one of ROLES
    text: str
    target: tuple = ()  # ("item", i) | ("page", n) | ("nav", word) | ("back",) | ("buy",) ...
    options: tuple[str, ...] = ()  # a select's values
    value: str = ""  # a select's choice / a searchbox's typed text

    def line(self, ids: str = "before") -> str:
        """``[7] button purchase`` (``ids="before"``) or ``button purchase [7]`` ("after")."""
        if self.role == "select":
            chosen = f" : {self.value}" if self.value else ""
            body = f"select {self.text}{chosen} options : {' '.join(self.options)}"
        elif self.role == "searchbox":
            typed = f" : {self.value}" if self.value else ""
            body = f"searchbox {self.text}{typed}"
        else:
            body = f"{self.role} {self.text}"
        return f"[{self.id}] {body}" if ids == "before" else f"{body} [{self.id}]"


def landing_page(layout: Layout, landing: str = "layout") -> str:
    if landing == "search":
        return "home"
    return "form" if layout.form_landing else "results"


def initial_state(layout: Layout, landing: str = "layout") -> dict[str, Any]:
    return {
        "page": landing_page(layout, landing),
        "query": "",
        "typed": "",
        "category": "all",
        "form_city": "",
        "page_no": 0,
        "item": None,
        "selected": None,
        "info": "",
        "scroll": 0,
        "history": [],
        "end": None,  # {"action": "buy" | "save" | "finish", "item": i, "option": o}
    }


class Site:
    """Builds the pages of one task's site; ``apply`` changes the state for one action."""

    def __init__(
        self, domain: Domain | str, layout: Layout, items: list[dict], landing: str = "layout"
    ):
        if landing not in LANDINGS:
            raise ValueError(f"landing={landing!r}; choose one of {LANDINGS}")
        self.domain = DOMAINS[domain] if isinstance(domain, str) else domain
        self.layout = layout
        self.items = items
        self.landing = landing

    # --------------------------------------------------------------- pages

    def results(self, state: dict) -> list[int]:
        """Indices of the items the results page lists (all pages), in display order.

        A query ranks rather than filters, as WebShop's BM25 search does: items whose title
        shares more of the query's words come first, an item sharing none is not listed, and
        ties keep the layout's order. A query with one wrong word still finds the item."""
        words = set(state["query"].split())
        shared = [len(words & set(item["title"].split())) for item in self.items]
        hits = [
            i
            for i, item in enumerate(self.items)
            if (not words or shared[i] > 0) and state["category"] in ("all", item["category"])
        ]
        if self.layout.sort == "price":
            hits.sort(key=lambda i: (self.items[i]["price"], self.items[i]["title"]))
        elif self.layout.sort == "name":
            hits.sort(key=lambda i: self.items[i]["title"])
        if words:
            hits.sort(key=lambda i: -shared[i])  # stable: the layout's order within a rank
        return hits

    def page(self, state: dict) -> list[Element]:
        parts: list[tuple] = [("link", w, ("nav", w)) for w in self.layout.nav]
        parts += [("text", b) for b in self.layout.banners]
        builder = getattr(self, f"_{state['page']}_parts")
        parts += builder(state)
        return [self._element(i + 1, part) for i, part in enumerate(parts)]

    @staticmethod
    def _element(eid: int, part: tuple) -> Element:
        role, text = part[0], part[1]
        if role == "select":
            return Element(eid, role, text, part[2], options=part[3], value=part[4])
        if role == "searchbox":
            return Element(eid, role, text, ("searchbox",), value=part[2])
        return Element(eid, role, text, part[2] if len(part) > 2 else ())

    def _form_parts(self, state: dict) -> list[tuple]:
        cities = ("any", *self.domain.categories)
        return [
            ("text", "find a place to stay"),
            ("select", "city", ("form_city",), cities, state["form_city"]),
            ("button", "search", ("form_search",)),
        ]

    def _home_parts(self, state: dict) -> list[tuple]:
        return [("text", f"search the {self.domain.name}"), *self._search_parts(state)]

    def _search_parts(self, state: dict) -> list[tuple]:
        return [("searchbox", "search", state["typed"]), ("button", "search", ("search",))]

    def _results_parts(self, state: dict) -> list[tuple]:
        hits = self.results(state)
        per = self.layout.per_page
        pages = max(1, -(-len(hits) // per))
        page_no = min(state["page_no"], pages - 1)
        parts: list[tuple] = []
        if self.layout.search == "top":
            parts += self._search_parts(state)
        if self.layout.category_filter:
            choice = "" if state["category"] == "all" else state["category"]
            cats = ("all", *self.domain.categories)
            parts.append(("select", "category", ("category",), cats, choice))
        if not hits:
            parts.append(("text", "no results"))
        shown = hits[page_no * per : (page_no + 1) * per]
        for i in shown:
            item = self.items[i]
            price = f"{item['price']} {self.domain.unit}"
            first_price = self.layout.row_price_first
            text = f"{price} {item['title']}" if first_price else f"{item['title']} {price}"
            parts.append(("link", text, ("item", i)))
        if pages > 1:
            parts.append(("text", f"page {page_no + 1} of {pages}"))
            if page_no > 0:
                parts.append(("link", "previous page", ("page", page_no - 1)))
            if page_no + 1 < pages:
                parts.append(("link", "next page", ("page", page_no + 1)))
        if self.layout.search == "bottom":
            parts += self._search_parts(state)
        return parts

    def _item_parts(self, state: dict) -> list[tuple]:
        item = self.items[state["item"]]
        blocks: dict[str, list[tuple]] = {
            "title": [("text", item["title"])],
            "price": [("text", f"price : {item['price']} {self.domain.unit}")],
            "features": [("text", f"features : {' '.join(item['features'])}")],
            "reviews": [("text", r) for r in REVIEWS[: self.layout.num_reviews]],
            "option": [
                (
                    "select",
                    self.domain.option_name,
                    ("option",),
                    tuple(item["options"]),
                    state["selected"] or "",
                )
            ],
        }
        buttons = [("button", self.layout.buy_label, ("buy",))]
        save = ("button", self.layout.save_label, ("save",))
        buttons.insert(0 if self.layout.save_first else 1, save)
        blocks["buttons"] = buttons + [("link", "back to results", ("back",))]
        return [part for name in self.layout.item_parts for part in blocks[name]]

    def _info_parts(self, state: dict) -> list[tuple]:
        return [("text", f"{state['info']} : nothing sold here")]

    # --------------------------------------------------------------- transitions

    def navigate(self, state: dict, **changes) -> None:
        """Go to another page: the current one is pushed for ``back``; the view resets."""
        keep = ("page", "query", "typed", "category", "page_no", "item", "selected", "info")
        state["history"].append({k: state[k] for k in keep})
        state.update(changes, scroll=0)

    def back(self, state: dict) -> bool:
        if not state["history"]:
            return False
        state.update(state["history"].pop(), scroll=0)
        return True

    def home(self, state: dict) -> None:
        page = landing_page(self.layout, self.landing)
        self.navigate(state, page=page, query="", typed="", category="all", page_no=0, item=None)

    def search(self, state: dict, query: str) -> None:
        self.navigate(state, page="results", query=query, typed=query, page_no=0, item=None)
