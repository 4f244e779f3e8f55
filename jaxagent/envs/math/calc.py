"""The calculator: exact rational arithmetic over ``+ - * /`` and parentheses.

Expressions are parsed with ``ast`` and evaluated node by node over ``fractions.Fraction``;
nothing is ``eval``-ed, and only numbers, the four operations, unary minus and parentheses are
accepted, so agent text cannot run code or build huge numbers (no powers).
"""

from __future__ import annotations

import ast
import operator
from fractions import Fraction

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: None}
MAX_CHARS = 200  # longer expressions are refused (cheap bound on work per call)


class CalcError(ValueError):
    """The expression is not arithmetic the calculator accepts, or divides by zero."""


def _eval(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(str(node.value))  # str: 0.1 is 1/10, not its binary double
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _eval(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Div):
            if right == 0:
                raise CalcError("division by zero")
            return left / right
        return _OPS[type(node.op)](left, right)
    raise CalcError("only numbers, + - * / and parentheses are allowed")


def evaluate(expr: str) -> Fraction:
    """The exact value of ``expr`` (e.g. ``"( 19 - 4 ) / 3"`` -> 5). Raises ``CalcError``."""
    if not isinstance(expr, str) or not expr.strip():
        raise CalcError("empty expression")
    if len(expr) > MAX_CHARS:
        raise CalcError(f"expression longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError as exc:
        raise CalcError(f"bad syntax: {exc.msg}") from None
    return _eval(tree)


def format_value(value: Fraction) -> str:
    """A value as words: ``"36"``, ``"-3"``, ``"5 / 6"`` (lowest terms, sign in front)."""
    value = Fraction(value)
    if value.denominator == 1:
        return str(value.numerator)
    return f"{value.numerator} / {value.denominator}"
