"""Exact answer checking: extract, normalise, compare values (sympy where it helps).

``extract_answer`` takes the content of the last ``\\boxed{...}`` (balanced braces), else the
text after the last ``Final:`` / ``answer:``, else the whole text. ``normalize`` removes what
does not change a value: spaces, ``$``, ``\\left``/``\\right``, a leading ``x =``, a trailing
period, thousands commas (``1,000``), and rewrites ``\\frac{a}{b}`` / ``\\dfrac`` to
``(a)/(b)``, ``\\cdot`` / ``\\times`` to ``*`` and ``^`` to ``**``. ``parse_value`` reads
integers, decimals, fractions and mixed numbers exactly (``fractions.Fraction``: ``2.50`` is
``5/2``) and falls back to sympy for other expressions (``sqrt(4)``, ``2**3``) over a whitelist
of characters and with small exponents only, so model text cannot make sympy run code or
compute for long. ``is_equivalent(pred, gold, percent=...)``: when the gold answer is a
percentage (``percent=True``) a ``%`` sign is optional (``25%`` == ``25``); otherwise ``50%``
means ``0.5``.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_FINAL = re.compile(r"(?:final(?: answer)?|answer)\s*(?:is)?\s*:", re.I)
_FRAC = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_MIXED = re.compile(r"^([+-]?)(\d+)\s+(\d+)\s*/\s*(\d+)$")  # "1 1/2" (before spaces go)
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)$")
_FRACTION = re.compile(r"^([+-]?\d+)/([+-]?\d+)$")
_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(,\d{3})+(\.\d+)?$")
_SYMPY_CHARS = re.compile(r"^[0-9.+\-*/() a-z]*$")
_SYMPY_NAMES = {"sqrt", "pi", "e"}
MAX_CHARS = 120  # longer answers are not parsed


def extract_answer(text: str) -> str:
    """The answer part of a response (see the module docstring)."""
    text = text or ""
    starts = [m.end() for m in _BOXED.finditer(text)]
    if starts:
        start, depth = starts[-1], 1
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                return text[start:i].strip()
        return text[start:].strip()  # unbalanced: take the rest
    finals = list(_FINAL.finditer(text))
    if finals:
        return text[finals[-1].end() :].strip()
    return text.strip()


def normalize(text: str) -> str:
    """A canonical spelling of an answer string (no value is changed)."""
    s = text.strip()
    s = s.replace("\\left", "").replace("\\right", "").replace("$", "")
    s = s.replace("\\!", "").replace("\\,", "").replace("\\%", "%")
    s = s.replace("\\cdot", "*").replace("\\times", "*").replace("×", "*").replace("−", "-")
    for _ in range(3):  # nested \frac
        s = _FRAC.sub(r"(\1)/(\2)", s)
    s = re.sub(r"\\text\s*\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"^\s*[a-z]\s*=\s*", "", s, flags=re.I)  # "x = 3"
    s = s.strip().rstrip(".").strip()
    mixed = _MIXED.match(s)
    if mixed:
        sign, whole, num, den = mixed.groups()
        s = f"{sign}({whole}+{num}/{den})"
    if re.search(r"[\d.]\s+[\d.]", s):
        return "?"  # "1 2" is two numbers, not 12: never a value
    s = re.sub(r"\s+", "", s)
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    s = s.replace("^", "**").replace("{", "(").replace("}", ")")
    return s.lower()


def _sympy_value(s: str) -> Any:
    if not _SYMPY_CHARS.match(s) or set(re.findall(r"[a-z]+", s)) - _SYMPY_NAMES:
        return None
    if any(len(p) > 2 for p in re.findall(r"\*\*\(?([0-9.]+)", s)) or s.count("**") > 2:
        return None  # 9**9**9 would not finish
    import sympy
    from sympy.parsing.sympy_parser import parse_expr, standard_transformations

    try:
        value = parse_expr(
            s, local_dict={"sqrt": sympy.sqrt, "pi": sympy.pi, "e": sympy.E},
            global_dict={"__builtins__": {}, "Integer": sympy.Integer, "Float": sympy.Float,
                         "Rational": sympy.Rational, "Symbol": sympy.Symbol},
            transformations=standard_transformations, evaluate=True,
        )  # fmt: skip
    except Exception:  # any parse failure means "not a value", never a crash
        return None
    value = sympy.nsimplify(value, rational=True) if value.is_Float else value
    return value if getattr(value, "is_number", False) else None


def parse_value(text: str, *, percent: bool = False) -> Any:
    """The value of a normalised answer: a ``Fraction``, a sympy number, or None.

    Args:
      text: the answer (already ``normalize``-d or not: it is normalised again).
      percent: the answer is a percentage, so a trailing ``%`` is dropped; else ``x%`` is
        ``x / 100``.
    """
    s = normalize(text)
    if not s or len(s) > MAX_CHARS:
        return None
    scale = Fraction(1)
    if s.endswith("%"):
        s = s[:-1]
        scale = Fraction(1) if percent else Fraction(1, 100)
    if s.startswith("+"):
        s = s[1:]
    if _NUMBER.match(s):
        return Fraction(s) * scale
    frac = _FRACTION.match(s)
    if frac and int(frac.group(2)) != 0:
        return Fraction(int(frac.group(1)), int(frac.group(2))) * scale
    value = _sympy_value(s)
    if value is None:
        return None
    import sympy

    return value * sympy.Rational(scale.numerator, scale.denominator)


def values_equal(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return False
    if isinstance(a, Fraction) and isinstance(b, Fraction):
        return a == b
    import sympy

    def to_sympy(v):
        return sympy.Rational(v.numerator, v.denominator) if isinstance(v, Fraction) else v

    try:
        return bool(sympy.simplify(to_sympy(a) - to_sympy(b)) == 0)
    except Exception:  # an expression sympy cannot simplify is not equal
        return False


def is_equivalent(pred: str, gold: str, *, percent: bool = False) -> bool:
    """Whether the response ``pred`` states the value ``gold`` (see the module docstring)."""
    return values_equal(
        parse_value(extract_answer(pred), percent=percent), parse_value(gold, percent=percent)
    )
