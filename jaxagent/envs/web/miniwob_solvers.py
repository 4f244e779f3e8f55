"""Scripted MiniWoB++ solvers: they read the text view (utterance + element lines) and answer
in the shared action vocabulary, as a policy would. One function a task:
``solver(utterance, elements, memory) -> action``; ``memory`` is a per-episode dict.
"""

from __future__ import annotations

import json
import re
from typing import Callable

from jaxagent.envs.web.expert import parse_view


def _quoted(utterance: str) -> list[str]:
    return re.findall(r'"([^"]*)"', utterance)


def _click(el: dict) -> str:
    return f"click ( {el['id']} )"


def _type(el: dict, text: str) -> str:
    return f"type ( {el['id']} , {json.dumps(text)} )"


def _find(els, role: str, text: str | None = None) -> list[dict]:
    return [e for e in els if e["role"] == role and (text is None or e["text"] == text)]


def _labelled(els, role: str, label: str) -> dict | None:
    """The checkbox / radio whose label (the text line after it) is ``label``."""
    for k, el in enumerate(els[:-1]):
        if el["role"] == role and els[k + 1]["role"] == "text" and els[k + 1]["text"] == label:
            return el
    return None


def _submit(els) -> str:
    buttons = [e for e in els if e["role"] == "button"]
    named = [e for e in buttons if e["text"].lower() in ("submit", "login")]
    return _click((named or buttons)[-1])


def _textbox_value(el: dict) -> str:
    return el["text"][2:] if el["text"].startswith(": ") else ""


def click_test(u, els, m):
    return _click(_find(els, "button")[0])


def click_button(u, els, m):
    return _click(_find(els, "button", _quoted(u)[0])[0])


def click_link(u, els, m):
    return _click(_find(els, "link", _quoted(u)[0])[0])


def click_test_2(u, els, m):
    return _click(_find(els, "button", re.search(r"button (\w+)", u).group(1))[0])


def click_button_sequence(u, els, m):
    name = "TWO" if m.get("one") else "ONE"
    m["one"] = True
    return _click(_find(els, "button", name)[0])


def click_tab(u, els, m):
    return _click(_find(els, "link", re.search(r"Tab #\d+", u).group(0))[0])


def click_dialog(u, els, m):
    return _click(_find(els, "button", "Close")[0])


def _choose(role: str):
    def solve(u, els, m):
        body = re.search(r"Select (.*) and click Submit", u).group(1)
        names = [] if body == "nothing" else [n.strip() for n in re.split(r",| and ", body)]
        for name in names:
            el = _labelled(els, role, name)
            if el is not None and "unchecked" in el["text"].split()[:1]:
                return _click(el)
        return _submit(els)

    return solve


def _enter(transform=lambda s: s):
    def solve(u, els, m):
        text = transform(_quoted(u)[0])
        box = _find(els, "textbox")[0]
        if _textbox_value(box) != text:
            return _type(box, text)
        return _submit(els)

    return solve


def _enter_case(u, els, m):
    case = str.upper if "upper case" in u else str.lower
    return _enter(case)(u, els, m)


def focus_text(u, els, m):
    return _click(_find(els, "textbox")[0])


def focus_text_2(u, els, m):
    n = int(re.search(r"(\d+)(st|nd|rd|th)", u).group(1))
    return _click(_find(els, "textbox")[n - 1])


def _fill_two(values_of: Callable[[str], list[str]]):
    def solve(u, els, m):
        values = values_of(u)
        for box, value in zip(_find(els, "textbox"), values):
            if _textbox_value(box) != value:
                return _type(box, value)
        return _submit(els)

    return solve


def choose_list(u, els, m):
    name = re.search(r"Select (.*) from the list", u).group(1)
    if not m.get("chosen"):
        m["chosen"] = True
        return f"select ( {_find(els, 'select')[0]['id']} , {json.dumps(name)} )"
    return _submit(els)


def use_autocomplete(u, els, m):
    start, *end = _quoted(u)
    box = _find(els, "textbox")[0]
    value = _textbox_value(box)
    done = value.startswith(start) and value.endswith(end[0] if end else "") and value != start
    if done:
        return _submit(els)
    picks = [
        e
        for e in els
        if e["role"] == "text"
        and e["text"].startswith(start)
        and (not end or e["text"].endswith(end[0]))
    ]
    if picks:
        return _click(picks[0])
    return _type(box, start)


def click_widget(u, els, m):
    kind = _quoted(u)[0]
    role = {"text": "textbox"}.get(kind, kind)
    return _click(_find(els, role)[0])


def click_collapsible(u, els, m):
    if not m.get("opened"):
        m["opened"] = True
        return _click([e for e in els if e["text"].startswith("Section")][0])
    return _submit(els)


SOLVERS: dict[str, Callable] = {
    "click-test": click_test,
    "click-test-2": click_test_2,
    "click-button": click_button,
    "click-button-sequence": click_button_sequence,
    "click-link": click_link,
    "click-tab": click_tab,
    "click-dialog": click_dialog,
    "click-checkboxes": _choose("checkbox"),
    "click-option": _choose("radio"),
    "click-collapsible": click_collapsible,
    "click-widget": click_widget,
    "enter-text": _enter(),
    "enter-text-2": _enter_case,
    "focus-text": focus_text,
    "focus-text-2": focus_text_2,
    "login-user": _fill_two(lambda u: _quoted(u)[:2]),
    "enter-password": _fill_two(lambda u: [_quoted(u)[0]] * 2),
    "choose-list": choose_list,
    "use-autocomplete": use_autocomplete,
}


class MiniWoBSolver:
    """``make_expert`` for MiniWoB tasks: ``act(observation) -> action`` (error_rate unused:
    the solvers are for checking the env and for demonstrations of correct play)."""

    def __init__(self, task, error_rate: float = 0.0, rng=None):
        del error_rate, rng
        name = task.data["task"]
        if name not in SOLVERS:
            raise KeyError(f"no scripted solver for MiniWoB task {name!r}; have {sorted(SOLVERS)}")
        self.solve = SOLVERS[name]
        self.utterance = ""
        self.memory: dict = {}

    def act(self, observation: str) -> str:
        if observation.startswith("task : "):
            self.utterance = observation.split("\n", 1)[0][len("task : ") :]
        els = parse_view(observation)["elements"]
        if not els:
            return "finish ( )"
        try:
            return self.solve(self.utterance, els, self.memory)
        except (IndexError, AttributeError):  # the page is not what the solver expects
            return "finish ( )"
