"""MiniWoB++ in a real headless browser, with the embedded sites' text view and actions.

The page's DOM (``core.getDOMInfo``) is flattened into the same element lines as the embedded
sites (``[3] button ok``, ``[5] textbox : typed``, ``[7] checkbox checked bar``, ``[8] select
options : a b``); ids are the line numbers, mapped to MiniWoB's element refs. Actions are the
same vocabulary: ``click(id)``, ``type(id, text)`` (real key strokes), ``select(id, option)``,
``scroll(up|down)`` (the text viewport), ``finish()``; ``back`` and ``search`` have no page to
act on and are refused with a readable error. The reward is MiniWoB's own
(``WOB_REWARD_GLOBAL``, in [-1, 1], time-discounted on its pages); success is a positive raw
reward.

Each environment owns one browser (so each pool worker owns one). A browser that dies or hangs
(any Selenium failure) ends the episode with ``env_error`` (``jaxagent.envs.base
.env_error_info``) and is restarted at the next ``reset``; a failed reset raises, so that the
pool retries it on a fresh browser.
"""

from __future__ import annotations

import dataclasses
import time

from jaxagent.envs.tool_spec import ActionError, ErrorKind
from jaxagent.envs.base import FailureMode, StepResult, Task, Termination, env_error_info
from jaxagent.envs.rewards import reward_terms
from jaxagent.envs.web.actions import ERROR_TEXTS, failure_fields, parse_web_action
from jaxagent.envs.web.browser import Browser, BrowserError

_ROLES = {
    "button": "button",
    "a": "link",
    "select": "select",
    "textarea": "textarea",
    "input_text": "textbox",
    "input_password": "textbox",
    "input_number": "textbox",
    "input_checkbox": "checkbox",
    "input_radio": "radio",
    "input_button": "button",
    "input_submit": "button",
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class MiniWoBEnvConfig:
    """Episode settings of the MiniWoB++ env."""

    viewport: int = 24  # element lines shown at once (MiniWoB pages rarely need scrolling)
    max_steps: int = 12  # actions before truncation
    max_ms: int = 10_000  # MiniWoB's episode clock (its own default 10 s); raise for slow LMs
    timeout_s: float = 20.0  # a Selenium call longer than this is a hung browser
    settle_ms: int = 0  # pause after each action (pages with animations)

    def __post_init__(self):
        if self.viewport < 2 or self.max_steps < 1 or self.max_ms < 100 or self.timeout_s <= 0:
            raise ValueError(
                f"MiniWoBEnvConfig(viewport={self.viewport}, max_steps={self.max_steps}, "
                f"max_ms={self.max_ms}, timeout_s={self.timeout_s}): need viewport >= 2, "
                "max_steps >= 1, max_ms >= 100 and timeout_s > 0"
            )


def _text(node: dict) -> str:
    if node.get("text") is not None:
        return " ".join(str(node["text"]).split())
    return " ".join(t for t in (_text(c) for c in node["children"]) if t)


def flatten_dom(node: dict, out: list[dict] | None = None, parent: int = 0) -> list[dict]:
    """Element lines of a ``getDOMInfo`` tree: interactive elements whole, other leaves as text.

    Each line is ``{"ref", "role", "text", "value", "focused"}``; a bare text node (tag ``t``,
    negative ref) is clicked through its parent element.
    """
    out = [] if out is None else out
    tag = node["tag"].lower()
    role = _ROLES.get(tag)
    if role is None and "alink" in str(node.get("classes", "")).split():
        role = "link"  # MiniWoB's links are styled spans
    if role is None and tag.startswith("input_"):
        role = "textbox"
    if role is not None:
        out.append(
            {
                "ref": node["ref"],
                "role": role,
                "text": _text(node),
                "value": node.get("value"),
                "focused": bool(node.get("focused")),
            }
        )
        return out
    if not node["children"]:
        text = _text(node)
        if text:
            ref = parent if tag == "t" else node["ref"]
            out.append({"ref": ref, "role": "text", "text": text, "value": None})
        return out
    for child in node["children"]:
        flatten_dom(child, out, node["ref"])
    return out


def element_line(i: int, el: dict) -> str:
    role, text, value = el["role"], el["text"], el["value"]
    if role in ("checkbox", "radio"):
        state = "checked" if value else "unchecked"
        return f"[{i}] {role} {state} {text}".rstrip()
    if role in ("textbox", "textarea"):
        typed = f" : {value}" if value else ""
        return f"[{i}] {role}{typed}"
    if role == "select":
        return f"[{i}] select options : {' '.join(el.get('options', []))}"
    return f"[{i}] {role} {text}".rstrip()


class MiniWoBEnv:
    """One MiniWoB++ episode at a time in this env's own browser (``TextEnv``)."""

    def __init__(self, config: MiniWoBEnvConfig | None = None, **overrides):
        self.config = dataclasses.replace(config or MiniWoBEnvConfig(), **overrides)
        self.browser = Browser(timeout_s=self.config.timeout_s)
        self._task: Task | None = None
        self.restarts = 0

    def reset(self, task: Task) -> str:
        self._task, self._steps, self._scroll, self._done = task, 0, 0, False
        try:
            self.browser.begin(task.data["task"], task.data["seed"], self.config.max_ms)
            return f"task : {self.browser.utterance()}\n{self._view()}"
        except BrowserError:
            self._restart()
            raise

    def _restart(self) -> None:
        self.browser.quit()  # the next reset starts a fresh one
        self.restarts += 1

    def _elements(self) -> list[dict]:
        els = flatten_dom(self.browser.dom())
        for el in els:
            if el["role"] == "select":
                el["options"] = self.browser.select_options(el["ref"])
        self._lines = els
        return els

    def _view(self) -> str:
        els = self._elements()
        lo = min(self._scroll, max(0, len(els) - self.config.viewport))
        shown = els[lo : lo + self.config.viewport]
        lines = [f"page lines {lo + 1} - {lo + len(shown)} of {len(els)}"]
        lines += [element_line(lo + k + 1, el) for k, el in enumerate(shown)]
        below = len(els) - lo - len(shown)
        lines.append(f"scroll down for {below} more" if below > 0 else "end of page")
        return "\n".join(lines)

    def render_frame(self):
        return self.browser.screenshot()

    def close(self) -> None:
        self.browser.quit()
        self._task = None

    def step(self, action: str) -> StepResult:
        if self._task is None or self._done:
            raise RuntimeError("MiniWoBEnv.step called before reset() or after the episode ended")
        self._steps += 1
        try:
            return self._step(action)
        except BrowserError as exc:
            self._done = True
            self._restart()
            return StepResult("", 0.0, True, env_error_info("crash", str(exc)))

    def _step(self, action: str) -> StepResult:
        parsed = parse_web_action(action)
        if isinstance(parsed, ActionError):
            if parsed.kind == ErrorKind.EMPTY:
                return self._end(FailureMode.GAVE_UP.value)
            return self._continue(parsed.message)
        name, kw = parsed.name, parsed.kwargs
        if name == "finish":
            return self._end(FailureMode.GAVE_UP.value)
        if name == "think":
            return self._continue("ok")
        if name == "scroll":
            step = self.config.viewport if kw["direction"] == "down" else -self.config.viewport
            self._scroll = max(0, min(self._scroll + step, len(self._lines) - 1))
            return self._continue(None)
        if name in ("back", "search"):
            return self._continue(ERROR_TEXTS[11] if name == "back" else ERROR_TEXTS[10])
        lo = min(self._scroll, max(0, len(self._lines) - self.config.viewport))
        eid = kw["id"]
        if not 1 <= eid <= len(self._lines):
            return self._continue(f"error : no element {eid} on this page")
        if not lo < eid <= lo + self.config.viewport:
            return self._continue(f"error : element {eid} is not in view , scroll to see it")
        el = self._lines[eid - 1]
        if name == "click":
            if not self.browser.click(el["ref"]):
                return self._continue(f"error : element {eid} is text , it does nothing")
        elif name == "type":
            if el["role"] not in ("textbox", "textarea"):
                return self._continue(ERROR_TEXTS[8].replace("searchbox", "textbox"))
            self.browser.type_text(el["ref"], kw["text"])
            self.browser.wait_for_suggestions()
        elif name == "select":
            if el["role"] != "select":
                return self._continue(
                    f"error : element {eid} is a {el['role']} , it is not a select"
                )
            if not self.browser.select_option(el["ref"], kw["option"]):
                options = " ".join(el.get("options", []))
                return self._continue(
                    f"error : {kw['option']} is not an option of element {eid} , options : {options}"
                )
        if self.config.settle_ms:
            time.sleep(self.config.settle_ms / 1000)
        return self._after_action()

    def _after_action(self) -> StepResult:
        meta = self.browser.metadata()
        if meta["done"]:
            return self._end(None, meta)
        return self._continue(None)

    def _continue(self, error: str | None) -> StepResult:
        meta = self.browser.metadata()
        if meta["done"]:  # MiniWoB's clock ran out while the policy thought
            return self._end(None, meta)
        if self._steps >= self.config.max_steps:
            return self._end("invalid_action" if error else "step_budget", truncated=True)
        obs = self._view() if error is None else f"{error}\n{self._view()}"
        info = {
            "reward_terms": reward_terms(process=float(error is None)),
            **failure_fields("refused_action" if error else None),
            "truncated": False,
            "success": False,
            "dangerous": [],
        }
        return StepResult(obs, 0.0, False, info)

    def _end(self, mode: str | None, meta: dict | None = None, truncated: bool = False):
        self._done = True
        reward, raw = 0.0, 0.0
        if meta is not None:
            reward, raw = float(meta["reward"]), float(meta["raw_reward"])
            if raw <= 0:
                timed_out = str(meta.get("reason") or "") == "timed out"
                mode = "timeout" if timed_out else "wrong_state"
        success = raw > 0
        info = {
            "reward_terms": reward_terms(process=1.0, outcome=float(success), task=float(success)),
            **failure_fields(None if success else mode),
            "truncated": truncated,
            "success": success,
            "dangerous": [],
            "miniwob_raw_reward": raw,
            "termination": (Termination.TRUNCATED if truncated else Termination.TERMINATED).value,
        }
        return StepResult("done" if not truncated else "step budget over", reward, True, info)


@dataclasses.dataclass(frozen=True)
class MiniWoBFactory:
    """Picklable ``env_fn(env_id)`` for the pool: each worker builds its own env (browser)."""

    config: MiniWoBEnvConfig = dataclasses.field(default_factory=MiniWoBEnvConfig)

    def __call__(self, env_id: int = 0) -> MiniWoBEnv:
        return MiniWoBEnv(self.config)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MiniWoBTasksConfig:
    """Which MiniWoB++ tasks and how many seeds of each (train and test seeds are disjoint)."""

    tasks: tuple[str, ...] = ()  # task names; () = every task with a scripted solver
    num_train: int = 200  # seeds a task in the train split
    num_test: int = 50  # seeds a task in the test split
    seed: int = 0  # base of the seed streams

    def __post_init__(self):
        from jaxagent.envs.web.browser import task_names

        known = set(task_names()) if self.tasks else set()
        bad = [t for t in self.tasks if t not in known]
        if bad:
            raise ValueError(
                f"MiniWoBTasksConfig.tasks: unknown MiniWoB++ task(s) {bad}; the miniwob "
                f"package ships {len(known)} tasks, e.g. click-button, enter-text"
            )
        object.__setattr__(self, "tasks", tuple(self.tasks))


TEST_SEED_OFFSET = 1_000_000  # test seeds start here: never a train seed


class MiniWoBTasks:
    """``TaskSource`` of MiniWoB++ episodes: (task name, page seed)."""

    def __init__(self, config: MiniWoBTasksConfig | None = None):
        from jaxagent.envs.web.miniwob_solvers import SOLVERS

        self.config = config or MiniWoBTasksConfig()
        self.names = self.config.tasks or tuple(SOLVERS)

    def splits(self) -> tuple[str, ...]:
        return ("train", "test")

    def tasks(self, split: str) -> list[Task]:
        if split not in self.splits():
            raise ValueError(f"unknown split {split!r}; MiniWoBTasks has {self.splits()}")
        c = self.config
        count = c.num_train if split == "train" else c.num_test
        base = c.seed * 10 * TEST_SEED_OFFSET + (TEST_SEED_OFFSET if split == "test" else 0)
        return [
            Task(f"miniwob-{name}-{base + i}", split, name, {"task": name, "seed": base + i})
            for i in range(count)
            for name in self.names
        ]
