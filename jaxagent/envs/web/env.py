"""WebEnv: an embedded site as a ``TextEnv`` (and a ``SnapshotEnv``), with WebShop's reward.

The observation is an accessibility-tree-like text view of the *viewport* only::

    task : buy a blue jacket that is wool in size m under 50 dollars
    results lines 1 - 6 of 14
    [1] link home
    [2] searchbox search
    [3] button search
    [4] link 42 dollars blue nordic jacket
    ...
    scroll down for 8 more

Reward (Yao et al., WebShop, arXiv 2207.01206, §3.2): when the episode ends on a purchase
(or a save), ``score = r_type * (|U_att ∩ Y_att| + 1[option matches] + 1[price <= budget]) /
(|U_att| + 2)`` with ``r_type`` = 1 when the category matches, else 0; success is the exact
match (score 1). Failure labels (``info["failure_detail"]``; ``info["failure_mode"]`` is the
project-wide ``FailureMode`` each maps to, ``actions.FAILURE_OF_DETAIL``): ``wrong_item``
(category or an attribute wrong), ``wrong_option``, ``over_budget``, ``dangerous_action`` (a
purchase the task did not ask for: it said save, do not buy), ``wrong_action`` (saved when
asked to buy), ``refused_action`` (a step the page refused), ``invalid_action`` (the budget ran
out after a refused action), ``gave_up``, ``step_budget``.
"""

from __future__ import annotations

import copy
import dataclasses

from jaxagent.envs.tool_spec import ActionError, ErrorKind
from jaxagent.envs.base import StepResult, Task, Termination
from jaxagent.envs.rewards import reward_terms
from jaxagent.envs.web.actions import ERROR_TEXTS, WebAction, failure_fields, parse_web_action
from jaxagent.envs.web.layout import Layout
from jaxagent.envs.web.site import LANDINGS, Element, Site, initial_state

REWARDS = ("score", "success")
INSTRUCTIONS = ("first", "every")
IDS = ("before", "after")


@dataclasses.dataclass(frozen=True, kw_only=True)
class WebEnvConfig:
    """Episode settings of the embedded sites."""

    viewport: int = 6  # page elements visible at once (the rest needs scroll or navigation)
    max_steps: int = 12  # actions before truncation (the expert needs at most about 8)
    reward: str = "score"  # "score": WebShop's partial credit; "success": 1 for an exact match
    landing: str = "layout"  # "search": start on WebShop's search page (site.LANDINGS)
    # "every": each page view opens with the task line, as WebShop shows the instruction on
    # every page; "first": only the first observation carries it (the history keeps it).
    instruction: str = "first"
    # Where a line writes its element's id: "before" (``[7] button purchase``, the
    # accessibility-tree habit) or "after" (``button purchase [7]``): a left-to-right reader
    # has then read the label when it reaches the id, so naming the id of a label it has
    # just written is a copy of the token that followed that label on the page.
    ids: str = "before"

    def __post_init__(self):
        if self.viewport < 2:
            raise ValueError(f"WebEnvConfig.viewport={self.viewport} must be >= 2")
        if self.max_steps < 1:
            raise ValueError(f"WebEnvConfig.max_steps={self.max_steps} must be >= 1")
        if self.reward not in REWARDS:
            raise ValueError(f"WebEnvConfig.reward={self.reward!r}; choose one of {REWARDS}")
        if self.landing not in LANDINGS:
            raise ValueError(f"WebEnvConfig.landing={self.landing!r}; choose one of {LANDINGS}")
        if self.ids not in IDS:
            raise ValueError(f"WebEnvConfig.ids={self.ids!r}; choose one of {IDS}")
        if self.instruction not in INSTRUCTIONS:
            raise ValueError(
                f"WebEnvConfig.instruction={self.instruction!r}; choose one of {INSTRUCTIONS}"
            )


def score_purchase(site: Site, want: dict, item_index: int, option: str | None) -> dict:
    """WebShop's reward parts for buying item ``item_index`` with ``option``."""
    item = site.items[item_index]
    have = {item["attr"], *item["features"]}
    att = [want["attr"] in have, want["feature"] in have]
    opt = option == want["option"]
    price = item["price"] <= want["budget"]
    r_type = float(item["category"] == want["category"])
    score = r_type * (sum(att) + opt + price) / (len(att) + 2)
    if r_type < 1 or not all(att):
        mode = "wrong_item"
    elif not opt:
        mode = "wrong_option"
    elif not price:
        mode = "over_budget"
    else:
        mode = None
    return {"score": score, "failure_mode": mode}


def render_view(site: Site, state: dict, viewport: int, ids: str = "before") -> str:
    elements = site.page(state)
    lo = state["scroll"]
    shown = elements[lo : lo + viewport]
    lines = [f"{state['page']} lines {lo + 1} - {lo + len(shown)} of {len(elements)}"]
    lines += [e.line(ids) for e in shown]
    below = len(elements) - lo - len(shown)
    lines.append(f"scroll down for {below} more" if below > 0 else "end of page")
    return "\n".join(lines)


class WebEnv:
    """One episode at a time on an embedded site (``TextEnv`` + ``SnapshotEnv``)."""

    def __init__(self, config: WebEnvConfig | None = None, **overrides):
        self.config = dataclasses.replace(config or WebEnvConfig(), **overrides)
        self._task: Task | None = None

    # ------------------------------------------------------------ protocol

    def reset(self, task: Task) -> str:
        data = task.data
        self._task = task
        layout = Layout.from_json(data["layout"])
        self.site = Site(data["site"], layout, data["catalog"]["items"], self.config.landing)
        self._want = data["catalog"]["want"]
        self._kind = data["catalog"]["kind"]
        self._s = {
            "state": initial_state(layout, self.config.landing),
            "steps": 0,
            "invalid": 0,
            "done": False,
        }
        return self._with_task(self.view())

    def _with_task(self, view: str) -> str:
        return f"task : {self._task.prompt}\n{view}"

    def _page(self) -> str:
        """The observation after a page-changing action."""
        return self._with_task(self.view()) if self.config.instruction == "every" else self.view()

    def view(self) -> str:
        return render_view(self.site, self._s["state"], self.config.viewport, self.config.ids)

    def visible(self) -> list[Element]:
        state = self._s["state"]
        return self.site.page(state)[state["scroll"] : state["scroll"] + self.config.viewport]

    def snapshot(self):
        return copy.deepcopy(self._s)

    def restore(self, snapshot) -> None:
        self._s = copy.deepcopy(snapshot)

    def close(self) -> None:
        self._task = None

    def step(self, action: str) -> StepResult:
        if self._task is None or self._s["done"]:
            raise RuntimeError("WebEnv.step called before reset() or after the episode ended")
        self._s["steps"] += 1
        parsed = parse_web_action(action)
        if isinstance(parsed, ActionError):
            if parsed.kind == ErrorKind.EMPTY:
                return self._finish("gave_up")
            return self._refuse(parsed.message, parsed)
        if parsed.name == "think":  # a thought changes nothing; ReAct's WebShop answers OK
            return self._continue("ok", None)
        error = self._apply(parsed)
        if error:
            return self._refuse(error)
        end = self._s["state"]["end"]
        if end is not None:
            return self._finish(None)
        return self._continue(self._page(), None)

    # ------------------------------------------------------------ actions

    def _element(self, eid: int) -> Element | str:
        state = self._s["state"]
        elements = self.site.page(state)
        if not 1 <= eid <= len(elements):
            return f"error : no element {eid} on this page"
        if not state["scroll"] < eid <= state["scroll"] + self.config.viewport:
            return f"error : element {eid} is not in view , scroll to see it"
        return elements[eid - 1]

    def _apply(self, act: WebAction) -> str | None:
        """Changes the state; returns an error text for a refused action (state unchanged)."""
        state, site = self._s["state"], self.site
        if act.name == "finish":
            state["end"] = {"action": "finish"}
        elif act.name == "scroll":
            n = len(site.page(state))
            step = (
                self.config.viewport if act.kwargs["direction"] == "down" else -self.config.viewport
            )
            new = max(0, min(state["scroll"] + step, max(0, n - self.config.viewport)))
            state["scroll"] = new
        elif act.name == "back":
            if not site.back(state):
                return ERROR_TEXTS[11]
        elif act.name == "search":
            if not any(e.role == "searchbox" for e in self.visible()):
                return ERROR_TEXTS[10]
            site.search(state, act.kwargs["query"])
        else:
            el = self._element(act.kwargs["id"])
            if isinstance(el, str):
                return el
            return getattr(self, f"_{act.name}")(el, act.kwargs)
        return None

    def _click(self, el: Element, kwargs) -> str | None:
        state, site = self._s["state"], self.site
        if el.role == "text":
            return f"error : element {el.id} is text , it does nothing"
        if el.role == "select":
            return f"error : element {el.id} is a select , use select ( {el.id} , option )"
        kind = el.target[0]
        if kind == "nav":
            if el.target[1] == "home":
                site.home(state)
            else:
                site.navigate(state, page="info", info=el.target[1], item=None)
        elif kind == "item":
            site.navigate(state, page="item", item=el.target[1], selected=None)
        elif kind == "page":
            site.navigate(state, page_no=el.target[1])
        elif kind == "back":
            site.back(state)
        elif kind == "search":
            site.search(state, state["typed"])
        elif kind == "form_search":
            city = state["form_city"] if state["form_city"] not in ("", "any") else "all"
            site.navigate(state, page="results", category=city, page_no=0)
        elif kind in ("buy", "save"):
            state["end"] = {"action": kind, "item": state["item"], "option": state["selected"]}
        elif kind == "searchbox":
            pass  # focusing the box does nothing visible
        return None

    def _type(self, el: Element, kwargs) -> str | None:
        if el.role != "searchbox":
            return ERROR_TEXTS[8]
        self._s["state"]["typed"] = " ".join(kwargs["text"].split())
        return None

    def _select(self, el: Element, kwargs) -> str | None:
        option = kwargs["option"]
        if el.role != "select":
            return f"error : element {el.id} is a {el.role} , it is not a select"
        if option not in el.options:
            return (
                f"error : {option} is not an option of element {el.id} , options : "
                f"{' '.join(el.options)}"
            )
        state = self._s["state"]
        field = el.target[0]
        if field == "option":
            state["selected"] = option
        elif field == "category":
            self.site.navigate(state, category=option, page_no=0)
        else:
            state[field] = option
        return None

    # ------------------------------------------------------------ endings

    def _refuse(self, message: str, parse_error: ActionError | None = None) -> StepResult:
        self._s["invalid"] += 1
        return self._continue(f"{message}\n{self.view()}", "refused_action", parse_error)

    def _continue(
        self, obs: str, mode: str | None, parse_error: ActionError | None = None
    ) -> StepResult:
        if self._s["steps"] >= self.config.max_steps:
            return self._finish("invalid_action" if mode else "step_budget", truncated=True)
        info = {
            "reward_terms": reward_terms(process=float(mode is None)),
            **failure_fields(mode, parse_error),
            "truncated": False,
            "success": False,
            "dangerous": [],
        }
        return StepResult(obs, 0.0, False, info)

    def _finish(self, mode: str | None, truncated: bool = False) -> StepResult:
        self._s["done"] = True
        end = self._s["state"]["end"] or {"action": "finish"}
        score, dangerous = 0.0, []
        if end["action"] == "finish" and mode is None:
            mode = "gave_up"
        elif end["action"] in ("buy", "save"):
            parts = score_purchase(self.site, self._want, end["item"], end["option"])
            score, mode = parts["score"], parts["failure_mode"]
            if end["action"] == "buy" and self._kind == "save":
                dangerous = [f"buy {self.site.items[end['item']]['title']}"]
                score, mode = 0.0, "dangerous_action"
            elif end["action"] != ("save" if self._kind == "save" else "buy"):
                score, mode = 0.0, "wrong_action"
        success = mode is None
        reward = score if self.config.reward == "score" else float(success)
        info = {
            "reward_terms": reward_terms(process=1.0, outcome=score, task=float(success)),
            **failure_fields(mode),
            "truncated": truncated,
            "success": success,
            "dangerous": dangerous,
            "score": score,
            "termination": (Termination.TRUNCATED if truncated else Termination.TERMINATED).value,
        }
        obs = "step budget over" if truncated else f"done , score {round(100 * score)}"
        return StepResult(obs, reward, True, info)
