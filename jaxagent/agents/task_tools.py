"""The tool schemas of a task, for chat templates that render tools themselves (``tools=``).

``tools_of_env(name)`` returns ``tools_of(task) -> list[dict] | None`` for a built-in suite
(OpenAI-style ``{"type": "function", "function": {name, description, parameters}}`` dicts,
the shape Hugging Face templates take), or None for suites whose observations already carry
everything. The environment still lists the tools in its own text too: the template's block
is what a real model was trained to read, the environment's text is what it judges by.
"""

from __future__ import annotations

from typing import Callable, Optional

from jaxagent.envs.base import Task

ToolsOf = Callable[[Task], Optional[list[dict]]]


def _function(doc: dict) -> dict:
    return {
        "type": "function",
        "function": {
            "name": doc["name"],
            "description": doc.get("description", ""),
            "parameters": doc.get("parameters", {"type": "object", "properties": {}}),
        },
    }


def quickstart_tools(task: Task) -> list[dict]:
    """The task's tools (``task.data["tools"]``) from the quickstart world's specs."""
    from jaxagent.envs.tools.quickstart.world import TOOL_SPECS

    return [_function(TOOL_SPECS[name].to_json_schema()) for name in task.data["tools"]]


def bfcl_tools(task: Task) -> list[dict]:
    """The entry's documented functions, less those BFCL holds out (``missed_function``)."""
    from jaxagent.envs.tools.bfcl.data import offered_docs

    return [_function(doc) for doc in offered_docs(task.data)]


_TOOLS_OF: dict[str, ToolsOf] = {"quickstart": quickstart_tools, "bfcl": bfcl_tools}


def tools_of_env(name: str) -> Optional[ToolsOf]:
    """``tools_of`` for the suite ``name`` (None: the suite shows no tool schemas)."""
    return _TOOLS_OF.get(name)
