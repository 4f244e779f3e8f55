"""Loading BFCL multi-turn tasks and app backends from the installed ``bfcl-eval`` package.

Nothing of the package is copied: the task files, function documents and app classes are read
from the installed package (``pip install --no-deps bfcl-eval``; the app backends need only the
standard library and ``mpmath``). The adapter follows the data format generally: any category
whose entries have ``involved_classes``, an ``initial_config`` and per-turn ground truth works
(``multi_turn_base``, ``multi_turn_miss_func`` with its held-out functions,
``multi_turn_miss_param``, ``multi_turn_long_context`` with the long-context scenarios).
"""

from __future__ import annotations

import ast
import copy
import functools
import importlib
import inspect
import json
import re
from pathlib import Path
from typing import Any

from jaxagent.envs.tool_spec import ToolSpec
from jaxagent.envs.base import Task

INSTALL_HINT = (
    "bfcl-eval is not installed. Install it without its dependency list (huge and "
    "conflicting; the multi-turn app backends need only the standard library and mpmath):\n"
    "    pip install --no-deps bfcl-eval && pip install mpmath"
)

# Calls that delete, trade, order, book or publish: counted as safety violations when the
# current turn's ground truth did not ask for them.
DANGEROUS_METHODS = frozenset(
    {
        "rm",
        "rmdir",
        "send_message",
        "delete_message",
        "post_tweet",
        "retweet",
        "comment",
        "place_order",
        "cancel_order",
        "withdraw_funds",
        "book_flight",
        "cancel_booking",
        "purchase_insurance",
    }
)


class BFCLMissingError(ImportError):
    """Raised when ``bfcl-eval`` is not importable; the message says how to install it."""


def require_bfcl():
    """Imports and returns ``bfcl_eval``, or raises ``BFCLMissingError`` with the fix."""
    try:
        import bfcl_eval  # noqa: F401
        from bfcl_eval.constants import eval_config, executable_backend_config
    except ImportError as err:
        raise BFCLMissingError(f"{INSTALL_HINT}\n(import failed: {err})") from err
    return eval_config, executable_backend_config


def _category_files() -> dict[str, Path]:
    eval_config, _ = require_bfcl()
    out = {}
    for path in sorted(Path(eval_config.PROMPT_PATH).glob("BFCL_*.json")):
        match = re.match(r"BFCL_v\d+_(.+)\.json$", path.name)
        if match:
            out[match.group(1)] = path
    return out


def _read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def is_multi_turn(entries: list[dict]) -> bool:
    return bool(entries) and all("involved_classes" in e and "initial_config" in e for e in entries)


def list_categories() -> dict[str, dict[str, Any]]:
    """``{category: {"tasks": N, "multi_turn": bool}}`` for every data file in the package."""
    out = {}
    for name, path in _category_files().items():
        try:
            entries = _read_jsonl(path)
        except ValueError:  # not a JSON-lines task file (e.g. a list of ids)
            continue
        if entries and all(isinstance(e, dict) and "id" in e for e in entries):
            out[name] = {"tasks": len(entries), "multi_turn": is_multi_turn(entries)}
    return out


@functools.lru_cache(maxsize=16)
def load_entries(category: str) -> tuple[dict, ...]:
    """The category's entries, each with its per-turn ``ground_truth`` merged in."""
    eval_config, _ = require_bfcl()
    files = _category_files()
    if category not in files:
        multi = [c for c in files if c.startswith("multi_turn")]
        raise ValueError(
            f"unknown BFCL category {category!r}; multi-turn categories in the "
            f"installed bfcl-eval: {multi}"
        )
    entries = _read_jsonl(files[category])
    if not is_multi_turn(entries):
        raise ValueError(
            f"BFCL category {category!r} is not a multi-turn stateful category "
            "(its entries have no involved_classes / initial_config)"
        )
    answers_path = Path(eval_config.POSSIBLE_ANSWER_PATH) / files[category].name
    answers = {a["id"]: a["ground_truth"] for a in _read_jsonl(answers_path)}
    out = []
    for entry in entries:
        if entry["id"] not in answers:
            raise ValueError(f"BFCL entry {entry['id']!r} has no ground truth in {answers_path}")
        turns = answers[entry["id"]]
        if len(turns) != len(entry["question"]):
            raise ValueError(
                f"BFCL entry {entry['id']!r}: {len(entry['question'])} turns but "
                f"{len(turns)} ground-truth turns"
            )
        out.append({**entry, "ground_truth": turns, "category": category})
    return tuple(out)


def entry_to_task(entry: dict, split: str = "test") -> Task:
    first = " ".join(m["content"] for m in entry["question"][0] if m.get("role") == "user")
    return Task(id=entry["id"], split=split, prompt=first, data=entry)


def is_long_context(category: str) -> bool:
    return "long_context" in category or "composite" in category


def make_instances(entry: dict) -> dict[str, Any]:
    """Fresh app instances for an entry: ``{class_name: instance}`` loaded with its config."""
    _, backend = require_bfcl()
    instances = {}
    for class_name in entry["involved_classes"]:
        module = importlib.import_module(backend.CLASS_FILE_PATH_MAPPING[class_name])
        instance = getattr(module, class_name)()
        if class_name not in backend.STATELESS_CLASSES:
            config = copy.deepcopy(entry["initial_config"].get(class_name, {}))
            instance._load_scenario(config, long_context=is_long_context(entry["category"]))
        instances[class_name] = instance
    return instances


def public_methods(instances: dict[str, Any]) -> dict[str, Any]:
    """``{method name: bound method}`` over the instances (later classes win on a clash,
    as in BFCL's own executor)."""
    methods = {}
    for instance in instances.values():
        for name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
            if not name.startswith("_"):
                methods[name] = method
    return methods


@functools.lru_cache(maxsize=32)
def _class_docs(class_name: str) -> tuple[dict, ...]:
    eval_config, backend = require_bfcl()
    path = (
        Path(eval_config.MULTI_TURN_FUNC_DOC_PATH)
        / (backend.MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name])
    )
    return tuple(_read_jsonl(path))


def offered_docs(entry: dict) -> list[dict]:
    """BFCL's function docs (name, description, JSON Schema parameters) of the entry's
    classes, less the functions the entry holds out (``missed_function``: offered only at a
    later turn)."""
    held = {n for names in entry.get("missed_function", {}).values() for n in names}
    return [
        doc
        for class_name in entry["involved_classes"]
        for doc in _class_docs(class_name)
        if doc["name"] not in held
    ]


def tool_specs(entry: dict, methods: dict[str, Any]) -> dict[str, ToolSpec]:
    """Specs of every documented function of the entry's classes (held-out ones included);
    positional order comes from the Python method's signature."""
    specs = {}
    for class_name in entry["involved_classes"]:
        for doc in _class_docs(class_name):
            method = methods.get(doc["name"])
            order = None
            if method is not None:
                order = tuple(p for p in inspect.signature(method).parameters)
            specs[doc["name"]] = _spec(class_name, doc["name"], order)
    return specs


@functools.lru_cache(maxsize=1024)
def _spec(class_name: str, name: str, order: tuple[str, ...] | None) -> ToolSpec:
    # Building a spec validates its JSON Schema (milliseconds): once per function, not per
    # episode reset or generated task.
    doc = next(d for d in _class_docs(class_name) if d["name"] == name)
    return ToolSpec.from_json(doc, param_order=order, dangerous=name in DANGEROUS_METHODS)


def format_result(value: Any) -> str:
    """A call's result as BFCL's checker compares it: strings as they are, dicts as JSON
    (``str`` when not serialisable), anything else through ``str``."""
    if type(value) is str:
        return value
    if type(value) is dict:
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


def keyword_text(value: Any) -> str:
    """A result in the syntax of a call's arguments: ``{"price": 102.8}`` is
    ``price=102.8``, strings are ``repr``-quoted, a list of dicts is ``[(id=838, ...), ...]``.

    A value read from such a result has the same left context as where a call writes it
    (``price=102.8`` in both, ``"price": 102.8`` in JSON), so a small model copies it with
    an induction head (Olsson et al., 2022: attend to the token after an earlier match of
    the current one, copy it) instead of learning to map ``": `` onto ``=``."""
    if type(value) is dict:
        return ", ".join(f"{k}={_keyword_value(v)}" for k, v in value.items())
    return _keyword_value(value) if value is not None else "None"


def _keyword_value(value: Any) -> str:
    if type(value) is dict:
        return "(" + keyword_text(value) + ")"
    if type(value) in (list, tuple):
        return "[" + ", ".join(_keyword_value(v) for v in value) + "]"
    return repr(value)


def shown_result(result: str, result_format: str) -> str:
    """The result text the agent reads: BFCL's (``format_result``, "json") or the same value
    in keyword syntax ("keywords"; errors and plain strings stay as they are)."""
    if result_format == "json" or result.startswith("Error during execution"):
        return result
    try:
        value = json.loads(result)
    except ValueError:
        try:
            value = ast.literal_eval(result)
        except (ValueError, SyntaxError):
            return result
    return keyword_text(value) if isinstance(value, (dict, list)) else result


def call_method(method, kwargs: dict[str, Any]) -> str:
    """Runs one call on a live app instance; an exception becomes BFCL's error string."""
    try:
        return format_result(method(**kwargs))
    except Exception as exc:  # the app reports the agent's misuse: a tool error, not a crash
        return f"Error during execution: {exc}"
