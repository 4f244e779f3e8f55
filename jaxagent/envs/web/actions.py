"""The web action vocabulary, parsed by the shared tool-call parser (``jaxagent.envs.actions``).

``click(id)``, ``type(id, text)``, ``select(id, option)``, ``scroll(up|down)``, ``back()``,
``search(query)``, ``finish()``; each is a ``ToolSpec`` so that a wrong argument gets the shared
parser's readable message. ``scroll(down)`` (a bare word, as the list above writes it) is accepted
as ``scroll("down")``, and an id may be written as the view writes it, ``click ( [3] )``
(WebArena's ``click [id]``), so that one token names an element in the view and in the
action. The embedded sites and MiniWoB++ take the same vocabulary.

Error texts are short and built from the suite's closed vocabulary (``ERROR_TEXTS`` lists their
fixed words), so a word-level model can read them.
"""

from __future__ import annotations

import dataclasses
import re

from jaxagent.envs import actions as A
from jaxagent.envs.base import FailureMode

_INT = {"type": "integer", "minimum": 0}
_STR = {"type": "string"}
WEB_ACTIONS = {
    "click": A.ToolSpec(
        "click", "click an element", {"properties": {"id": _INT}, "required": ["id"]}
    ),
    "type": A.ToolSpec(
        "type",
        "type text into a text box",
        {"properties": {"id": _INT, "text": _STR}, "required": ["id", "text"]},
    ),
    "select": A.ToolSpec(
        "select",
        "choose an option of a select",
        {"properties": {"id": _INT, "option": _STR}, "required": ["id", "option"]},
    ),
    "scroll": A.ToolSpec(
        "scroll",
        "move the view",
        {
            "properties": {"direction": {"type": "string", "enum": ["up", "down"]}},
            "required": ["direction"],
        },
    ),
    "back": A.ToolSpec("back", "go to the previous page"),
    "search": A.ToolSpec(
        "search", "search the site", {"properties": {"query": _STR}, "required": ["query"]}
    ),
    "finish": A.ToolSpec("finish", "end the episode"),
    # ReAct's think[...]: reasoning written as an action; the page does not change
    "think": A.ToolSpec(
        "think", "note a thought", {"properties": {"thought": _STR}, "required": ["thought"]}
    ),
}
USAGE = {
    "click": "click ( id )",
    "type": 'type ( id , " text " )',
    "select": 'select ( id , " option " )',
    "scroll": "scroll ( down ) or scroll ( up )",
    "back": "back ( )",
    "search": 'search ( " words " )',
    "finish": "finish ( )",
    "think": 'think ( " words " )',
}
ERROR_TEXTS = (
    "error : bad syntax , write one action like click ( 3 )",
    "error : unknown action , use " + " ".join(WEB_ACTIONS),
    "error : bad arguments for",
    "error : no element on this page",
    "error : element is not in view , scroll to see it",
    "error : element is a , it is not a select",
    "error : element is text , it does nothing",
    "error : element is a select , use select ( id , option )",
    "error : only a searchbox takes type",
    "error : is not an option of element , options :",
    "error : no search box in view",
    "error : no page to go back to",
    "error : write",
    "at the top already",
    "at the bottom already",
)
_BARE_SCROLL = re.compile(r"scroll\s*\(\s*(up|down)\s*\)")
_BRACKET_ID = re.compile(r"([(,]\s*)\[(\d+)\](?=\s*[,)])")  # an argument, never inside a string


@dataclasses.dataclass(frozen=True)
class WebAction:
    """A well-formed action: its name and bound keyword arguments (strings stripped)."""

    name: str
    kwargs: dict

    def render(self) -> str:
        args = " , ".join(
            f'" {v} "' if isinstance(v, str) and k != "direction" else str(v)
            for k, v in self.kwargs.items()
        )
        return f"{self.name} ( {args} )" if args else f"{self.name} ( )"


def parse_web_action(text: str) -> WebAction | A.ActionError:
    """One web action from the agent's text, or an ``ActionError`` with a short message.

    ``Final : ...`` counts as ``finish()``; an empty action is giving up (``ErrorKind.EMPTY``).
    """
    text = _BRACKET_ID.sub(r"\1\2", _BARE_SCROLL.sub(r'scroll("\1")', text))
    parsed = A.parse_action(text)
    if isinstance(parsed, A.ActionError):
        if parsed.kind == A.ErrorKind.EMPTY:
            return parsed
        return A.ActionError(parsed.kind, ERROR_TEXTS[0])
    if parsed.is_final:
        return WebAction("finish", {})
    if len(parsed.calls) != 1:
        return A.ActionError(A.ErrorKind.NOT_A_CALL, ERROR_TEXTS[0])
    call = parsed.calls[0]
    spec = WEB_ACTIONS.get(call.name)
    if spec is None:
        return A.ActionError(A.ErrorKind.UNKNOWN_TOOL, ERROR_TEXTS[1], tool=call.name)
    strip = lambda v: v.strip() if isinstance(v, str) else v  # noqa: E731 (word detokenizer)
    call = A.ToolCall(
        call.name,
        {k: strip(v) for k, v in call.kwargs.items()},
        tuple(strip(v) for v in call.args),
        call.text,
    )
    bound = A.bind_call(call, spec)
    if isinstance(bound, A.ActionError):
        message = f"{ERROR_TEXTS[2]} {call.name} , write {USAGE[call.name]}"
        return A.ActionError(bound.kind, message, tool=call.name, argument=bound.argument)
    return WebAction(call.name, dict(bound.kwargs))


# The sites' own labels (``info["failure_detail"]``: what the health checks and rollouts show)
# and the project-wide ``FailureMode`` each one is (``info["failure_mode"]``: what evaluation
# aggregates across environments).
FAILURE_OF_DETAIL = {
    "wrong_item": FailureMode.WRONG_STATE,  # bought / saved an item of the wrong kind
    "wrong_option": FailureMode.WRONG_STATE,
    "over_budget": FailureMode.WRONG_STATE,
    "wrong_action": FailureMode.WRONG_STATE,  # saved when asked to buy
    "dangerous_action": FailureMode.WRONG_STATE,  # bought when told not to (info["dangerous"])
    "refused_action": FailureMode.TOOL_ERROR,  # the page refused the action (no such element)
    "invalid_action": FailureMode.STEP_BUDGET,  # the budget ran out on a refused action
    "gave_up": FailureMode.GAVE_UP,
    "step_budget": FailureMode.STEP_BUDGET,
    "wrong_state": FailureMode.WRONG_STATE,  # MiniWoB: the task's own check failed
    "timeout": FailureMode.TIMEOUT,  # MiniWoB: the task's clock ran out
}


def failure_fields(detail: str | None, parse_error: A.ActionError | None = None) -> dict:
    """``failure_mode`` (a FailureMode value) and ``failure_detail`` (the site's label) for an
    info dict; a parse error keeps its own kind (invalid_syntax, unknown_tool, ...)."""
    if detail is None:
        return {"failure_mode": None, "failure_detail": None}
    mode = parse_error.failure_mode if parse_error is not None else FAILURE_OF_DETAIL[detail]
    return {"failure_mode": mode.value, "failure_detail": detail}
