"""The quickstart world's closed vocabulary: every word its texts can contain.

It lives apart from ``world`` (tools and state) because it also needs the task templates of
``tasks``, which themselves build on ``world``: world <- tasks <- vocab, no cycle.
"""

from __future__ import annotations

from jaxagent.envs.tools.quickstart import tasks as T
from jaxagent.envs.tools.quickstart import world as W


def vocabulary() -> list[str]:
    """Every word or symbol the world's prompts, observations and expert actions can contain.

    Sorted and duplicate-free. Texts are single-space separated, so ``text.split()`` yields
    words from this list (tests check it over all tasks, expert runs and random policies).
    """
    words: set[str] = set(
        W.ITEMS + W.CITIES + W.DAYS + W.EVENTS + W.KEYS + W.TOOL_NAMES + W.ERROR_WORDS
    )
    words.update(str(i) for i in range(W.MAX_INT + 1))
    for spec in W.TOOL_SPECS.values():
        words.update(spec.param_order)
    for doc in W.DOCS.values():
        words.update(doc.split())
    words.update(
        [
            "Action",
            "Final",
            "Thought",
            "Observation",
            "task",
            "tools",
            ":",
            "(",
            ")",
            ",",
            "=",
            '"',
            "-",
            ".",
            "?",
            "ok",
            "free",
            "cancelled",
            "done",
        ]
    )
    words.update(T.template_words())
    words.update(W.system_prompt().split())
    return sorted(words)
