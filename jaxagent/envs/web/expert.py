"""Scripted policies for the embedded sites: the expert (with errors), random, no-scroll.

The expert reads only the text view it is given (closed loop, like a user): it finds the
target's row by its title, searches when a search box is in view, otherwise scrolls and pages,
then selects the option and presses the button the task asks for. It names elements as the
view writes them (``click ( [4] )``), so a policy imitating it copies the id's token. It
knows the task (target title, option, buy or save, the layout's button labels) from
``Task.data``.

With ``error_rate`` p it makes, at each decision with probability q = 1 - (1-p)^(1/4), one
mistake RL can fix: opening a wrong item (and buying it), choosing a wrong option, pressing
the other button (a purchase when asked to save is the dangerous one), or giving up; each
makes the episode fail, so its success is about 1 - p.
"""

from __future__ import annotations

import re

import numpy as np

from jaxagent.envs.base import Task
from jaxagent.envs.web.domain import DOMAINS
from jaxagent.envs.web.site import ROLES

_LINE = re.compile(r"^\[(\d+)\] (\w+) ?(.*)$")
_LINE_AFTER = re.compile(rf"^({'|'.join(ROLES)}) ?(.*?) \[(\d+)\]$")  # WebEnvConfig.ids="after"


def parse_view(observation: str) -> dict:
    """The structure of a text view: page kind, visible elements, whether more lies below."""
    lines = observation.split("\n")
    page, els = "", []
    for line in lines:
        m = _LINE.match(line)
        if m:
            els.append({"id": int(m.group(1)), "role": m.group(2), "text": m.group(3)})
        elif m := _LINE_AFTER.match(line):
            els.append({"id": int(m.group(3)), "role": m.group(1), "text": m.group(2)})
        elif " lines " in line and not page:
            page = line.split(" lines ")[0]
    below = any(line.startswith("scroll down for") for line in lines)
    return {"page": page, "elements": els, "below": below}


def _select_value(text: str) -> str:
    """``size : m options : s m l`` -> ``m``; no choice -> ''."""
    head = text.split(" options : ")[0]
    return head.split(" : ", 1)[1] if " : " in head else ""


class ExpertPolicy:
    """Closed-loop scripted expert for one task. ``act(observation) -> action text``."""

    def __init__(
        self,
        task: Task,
        error_rate: float = 0.0,
        rng: np.random.Generator | None = None,
        *,
        scroll: bool = True,
    ):
        if not 0.0 <= error_rate <= 1.0:
            raise ValueError(f"error_rate must be in [0, 1], got {error_rate}")
        data = task.data
        catalog = data["catalog"]
        self.domain = DOMAINS[data["site"]]
        self.target = catalog["items"][catalog["target"]]["title"]
        self.want = catalog["want"]
        self.kind = catalog["kind"]
        layout = data["layout"]
        self.labels = {"buy": layout["buy_label"], "save": layout["save_label"]}
        self.rng = rng if rng is not None else np.random.default_rng(0)
        self.q = 1.0 - (1.0 - error_rate) ** 0.25
        self.scroll = scroll  # False: never scrolls, searches, pages or submits the form
        self.searched = False
        self.committed = False  # after a mistaken item: buy it anyway (the mistake sticks)
        self.think = bool(data.get("think", False))
        self.pending: str | None = None  # the click a thought announced, done next

    def _err(self) -> bool:
        return self.q > 0 and self.rng.random() < self.q

    def act(self, observation: str) -> str:
        if self.pending is not None:  # the answer to a thought is "ok", not a page
            action, self.pending = self.pending, None
            return action
        view = parse_view(observation)
        handler = getattr(self, f"_{view['page']}", None)
        if handler is None:
            return "back ( )"
        return handler(view)

    def _more(self, view) -> str:
        return "scroll ( down )" if self.scroll and view["below"] else "finish ( )"

    def _form(self, view) -> str:
        if not self.scroll:
            return "finish ( )"  # submitting the form is navigating
        for el in view["elements"]:
            if el["role"] == "select" and el["text"].startswith("city"):
                if _select_value(el["text"]) != self.want["category"]:
                    return f'select ( [{el["id"]}] , " {self.want["category"]} " )'
            if el["role"] == "button" and el["text"] == "search":
                return f"click ( [{el['id']}] )"
        return self._more(view)

    def _home(self, view) -> str:
        box = [e for e in view["elements"] if e["role"] == "searchbox"]
        if box and self.scroll:
            self.searched = True
            return f'search ( " {self.target} " )'
        return self._more(view)

    def _results(self, view) -> str:
        links = [e for e in view["elements"] if e["role"] == "link"]
        items = [e for e in links if " dollars" in f" {e['text']}"]
        hit = [e for e in items if self.target in e["text"]]
        if hit:
            others = [e for e in items if e not in hit]
            if others and self._err():
                self.committed = True
                return f"click ( [{others[int(self.rng.integers(len(others)))]['id']}] )"
            return f"click ( [{hit[0]['id']}] )"
        box = [e for e in view["elements"] if e["role"] == "searchbox"]
        if box and self.scroll and not self.searched:
            self.searched = True
            return f'search ( " {self.target} " )'
        if view["below"] and self.scroll:
            return "scroll ( down )"
        nxt = [e for e in links if e["text"] == "next page"]
        if nxt and self.scroll:
            return f"click ( [{nxt[0]['id']}] )"
        return "finish ( )"

    def _item(self, view) -> str:
        els = view["elements"]
        select = [e for e in els if e["role"] == "select"]
        if select:
            options = select[0]["text"].split(" options : ")[1].split()
            chosen = _select_value(select[0]["text"])
            want = self.want["option"] if self.want["option"] in options else options[0]
            if not chosen:
                if self._err():
                    wrong = [o for o in options if o != want] or options
                    want = str(self.rng.choice(wrong))
                return f'select ( [{select[0]["id"]}] , " {want} " )'
        buttons = {e["text"]: e["id"] for e in els if e["role"] == "button"}
        press = self.labels[self.kind]
        if press in buttons:  # the select comes first: set on the way down
            verb = self.kind
            if self._err():
                verb = "save" if self.kind == "buy" else "buy"
                if self.labels[verb] not in buttons:
                    return "finish ( )"
            eid = buttons[self.labels[verb]]
            click = f"click ( [{eid}] )"
            if not self.think:
                return click
            # The thought restates the task's verb after the observation's own "task :", names
            # the label that verb calls for and the label's id (the press then repeats the id
            # just written); a mistaken press is a mistaken thought, which RL can correct.
            self.pending = click
            return f'think ( " task : {verb} button {self.labels[verb]} [{eid}] " )'
        return self._more(view)

    def _info(self, view) -> str:
        return "back ( )"


def random_action(observation: str, rng: np.random.Generator) -> str:
    """A uniformly random action over the visible elements (and scroll, back, finish)."""
    view = parse_view(observation)
    els = view["elements"]
    choice = int(rng.integers(0, 8))
    if els and choice < 4:
        el = els[int(rng.integers(len(els)))]
        if el["role"] == "select":
            options = el["text"].split(" options : ")[-1].split()
            return f'select ( [{el["id"]}] , " {rng.choice(options)} " )'
        if el["role"] == "searchbox":
            return f'type ( [{el["id"]}] , " {rng.choice(DOMAINS["shop"].title_attrs)} " )'
        return f"click ( [{el['id']}] )"
    return ["scroll ( down )", "scroll ( up )", "back ( )", "finish ( )"][choice % 4]
