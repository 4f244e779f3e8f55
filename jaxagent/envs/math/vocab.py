"""The math suite's closed vocabulary: every word its texts can contain."""

from __future__ import annotations

from jaxagent.envs.math import problems as P


def vocabulary() -> list[str]:
    """Sorted words of every template, integers in ``[-MAX_INT, MAX_INT]``, the action and
    observation words. Texts are single-space separated, so ``text.split()`` yields words
    from this list (a test checks it over generated tasks and expert runs)."""
    words = {str(i) for i in range(-P.MAX_INT, P.MAX_INT + 1)}
    for text in P.template_texts():
        words.update(w for w in text.split() if not w.lstrip("-").isdigit())
    words.update(P._NAMES + P._PETS)
    words.update(
        'problem tools calc expr Action Final Observation : ( ) = " + - * / % , . ?'.split()
    )
    words.update("error bad syntax unknown tool argument failed done step budget over".split())
    return sorted(words)
