"""The math answer checker: equivalent and non-equivalent pairs, extraction, safety."""

import pytest

from jaxagent.envs.math.checker import extract_answer, is_equivalent, normalize, parse_value
from jaxagent.envs.math.calc import CalcError, evaluate, format_value


@pytest.mark.parametrize(
    "pred, gold",
    [
        ("0.5", "1/2"),
        ("1/2", "0.5"),
        ("\\boxed{1/2}", "1 / 2"),
        ("the answer is \\boxed{\\frac{1}{2}}", "1/2"),
        ("$\\dfrac{3}{4}$", "0.75"),
        ("50%", "1/2"),  # a plain value: 50% is one half
        ("2.50", "2.5"),
        ("2.5", "5/2"),
        ("Final : 5 / 6", "5 / 6"),
        ("Final: -3", "-3"),
        ("x = 7", "7"),
        ("1,000", "1000"),
        ("12.", "12"),
        ("+4", "4"),
        ("1 1/2", "3/2"),  # a mixed number
        ("sqrt(4)", "2"),  # sympy
        ("2^3", "8"),
        ("\\boxed{2 \\cdot 3}", "6"),
        ("4/8", "1/2"),
        ("0.333", "333/1000"),
    ],
)
def test_equivalent_pairs(pred, gold):
    assert is_equivalent(pred, gold), (pred, gold, normalize(extract_answer(pred)))


@pytest.mark.parametrize(
    "pred, gold",
    [
        ("-3", "3"),
        ("3", "-3"),
        ("0.33", "1/3"),  # a rounded decimal is not the fraction
        ("50%", "50"),  # for a plain value, 50% is 0.5
        ("1/2", "2"),
        ("12", "21"),
        ("\\boxed{}", "0"),
        ("", "0"),
        ("seven", "7"),
        ("1/0", "0"),
        ("Final : 5 / 6 7", "5 / 6"),
        ("1 2", "12"),  # two numbers, not twelve
        ("__import__('os')", "0"),
    ],
)
def test_non_equivalent_pairs(pred, gold):
    assert not is_equivalent(pred, gold), (pred, gold)


def test_percent_answers_take_an_optional_sign():
    assert is_equivalent("25%", "25", percent=True)
    assert is_equivalent("25", "25", percent=True)
    assert is_equivalent("\\boxed{25\\%}", "25", percent=True)
    assert not is_equivalent("0.25", "25", percent=True)
    assert not is_equivalent("25%", "25")  # the same text, not a percentage question


def test_extraction_takes_the_last_boxed_with_nested_braces():
    assert extract_answer("first \\boxed{1} then \\boxed{\\frac{2}{3}} end") == "\\frac{2}{3}"
    assert extract_answer("Thought: 3 + 4\nFinal: 7") == "7"
    assert extract_answer("just 9") == "just 9"


def test_huge_powers_and_code_are_refused_not_evaluated():
    assert parse_value("9^9^9^9") is None
    assert parse_value("9**99999") is None
    assert parse_value("().__class__") is None
    assert parse_value("x" * 500) is None


def test_calculator_is_exact_and_refuses_anything_else():
    assert evaluate("( 19 - 4 ) / 3") == 5
    assert format_value(evaluate("1 / 2 + 1 / 3")) == "5 / 6"
    assert format_value(evaluate("0.1 + 0.2")) == "3 / 10"  # exact, not 0.30000000000000004
    assert format_value(evaluate("- 7 + 2")) == "-5"
    for bad in ("2 ** 8", "1 / 0", "abs(3)", "", "1 +", "a + 1"):
        with pytest.raises(CalcError):
            evaluate(bad)
