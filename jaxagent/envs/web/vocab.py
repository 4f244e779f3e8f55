"""The embedded sites' closed vocabulary: every word their texts and the expert's actions use.

Texts are whitespace-separated words, so ``text.split()`` yields words from this list (a test
checks it over expert, random and no-scroll episodes on both sites).
"""

from __future__ import annotations

from jaxagent.envs.web.actions import ERROR_TEXTS, USAGE, WEB_ACTIONS
from jaxagent.envs.web.domain import DOMAINS, MAX_PRICE, template_words
from jaxagent.envs.web.layout import layout_words
from jaxagent.envs.web.site import ROLES

MAX_ELEMENTS = 64  # element ids a page can show ([1] .. [64])

_FIXED = """task : , ( ) " = - . of lines more end page scroll down up for done score step budget
over results item form info nothing sold here find a place stay city any search category
all no next previous back options price features dollars a night review title finish
Action Final Observation home the shop booking ok""".split()


def vocabulary() -> list[str]:
    words: set[str] = set(_FIXED) | set(ROLES) | set(WEB_ACTIONS) | layout_words()
    words.update(str(i) for i in range(MAX_PRICE + 1))
    words.update(f"[{i}]" for i in range(1, MAX_ELEMENTS + 1))
    for domain in DOMAINS.values():
        for group in (
            domain.categories,
            domain.title_attrs,
            domain.features,
            domain.brands,
            domain.options,
        ):
            words.update(group)
        words.update([domain.option_name, *domain.unit.split()])
        words.update(template_words(domain))
    for text in (*ERROR_TEXTS, *USAGE.values()):
        words.update(text.split())
    return sorted(words)
