"""Programmatically generated function-writing problems with hidden unit tests.

Each *family* draws random constants, a random function name and random inputs, writes a
HumanEval-style prompt (signature + docstring with one visible example) and a reference
solution, and computes the expected outputs of the hidden tests by running that reference on
the host (it is our own code, not agent code). With 20 families, random constants (thousands
of distinct behaviours) and random names, the train split has far more distinct problems than
a model can memorise, and every problem's tests are different inputs from its visible example.
"""

from __future__ import annotations

import random
from typing import Callable

_VERBS = (
    "compute",
    "derive",
    "make",
    "build",
    "find",
    "get",
    "transform",
    "collect",
    "measure",
    "score",
    "tally",
    "reduce",
    "scan",
    "rank",
    "pick",
    "shape",
)
_NOUNS = (
    "values",
    "signal",
    "ledger",
    "series",
    "tokens",
    "items",
    "record",
    "stream",
    "batch",
    "weights",
    "points",
    "digits",
    "labels",
    "cells",
    "codes",
    "marks",
)


def _name(rng: random.Random) -> str:
    return f"{rng.choice(_VERBS)}_{rng.choice(_NOUNS)}_{rng.randrange(100, 1000)}"


def _ints(rng, lo=-20, hi=20, n_lo=0, n_hi=9):
    return [rng.randint(lo, hi) for _ in range(rng.randint(n_lo, n_hi))]


def _word(rng, lo=1, hi=7, alphabet="abcdefghijklmnopqrstuvwxyz"):
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(lo, hi)))


# Each family returns (signature, docstring lines, solution body, input generator).
def _affine_filter(rng):
    a, b, m = rng.randint(2, 9), rng.randint(-9, 9), rng.randint(2, 5)
    r = rng.randrange(m)
    doc = [
        f"Return [{a} * x + ({b}) for every x in xs whose remainder modulo {m} is {r}],",
        "keeping the original order.",
    ]
    body = f"return [{a} * x + ({b}) for x in xs if x % {m} == {r}]"
    return "xs: list", doc, body, lambda g: (_ints(g),)


def _caesar(rng):
    k = rng.randint(1, 25)
    doc = [
        f"Shift every lowercase letter of s forward by {k} places in the alphabet (wrapping",
        "from 'z' to 'a'); all other characters are unchanged.",
    ]
    body = (
        f"return ''.join(chr((ord(c) - 97 + {k}) % 26 + 97) if 'a' <= c <= 'z' else c for c in s)"
    )
    return "s: str", doc, body, lambda g: (_word(g, 0, 12, "abcxyz -!qrs"),)


def _digit_sum_base(rng):
    b = rng.randint(2, 9)
    doc = [f"Return the sum of the digits of the non-negative integer n written in base {b}."]
    body = f"total = 0\n    while n:\n        total += n % {b}\n        n //= {b}\n    return total"
    return "n: int", doc, body, lambda g: (g.randint(0, 10_000),)


def _count_divisible(rng):
    a, b = rng.randint(2, 7), rng.randint(2, 11)
    doc = [f"Return how many integers k with lo <= k <= hi are divisible by {a} or by {b}."]
    body = f"return sum(1 for k in range(lo, hi + 1) if k % {a} == 0 or k % {b} == 0)"

    def gen(g):
        lo = g.randint(-50, 50)
        return lo, lo + g.randint(-3, 80)

    return "lo: int, hi: int", doc, body, gen


def _running(rng):
    op, word = rng.choice([("max", "maximum"), ("min", "minimum"), ("sum", "sum")])
    start = rng.randint(0, 2)
    doc = [
        f"Return the running {word} of xs starting from index {start}: element i of the",
        f"result is the {word} of xs[{start}:i + 1]. Return [] when len(xs) <= {start}.",
    ]
    body = f"return [{op}(xs[{start}:i + 1]) for i in range({start}, len(xs))]"
    return "xs: list", doc, body, lambda g: (_ints(g, -9, 9, 0, 8),)


def _every_kth_upper(rng):
    k, off = rng.randint(2, 4), rng.randint(0, 1)
    doc = [
        f"Return s with the characters at indices i where i % {k} == {off} upper-cased and",
        "all other characters unchanged.",
    ]
    body = f"return ''.join(c.upper() if i % {k} == {off} else c for i, c in enumerate(s))"
    return "s: str", doc, body, lambda g: (_word(g, 0, 12, "abcdefgh xyz"),)


def _pairs_divisible(rng):
    m = rng.randint(2, 7)
    doc = [
        "Return the number of index pairs (i, j) with i < j such that xs[i] + xs[j] is",
        f"divisible by {m}.",
    ]
    body = (
        f"return sum(1 for i in range(len(xs)) for j in range(i + 1, len(xs))"
        f" if (xs[i] + xs[j]) % {m} == 0)"
    )
    return "xs: list", doc, body, lambda g: (_ints(g, -15, 15, 0, 9),)


def _rle(rng):
    sep = rng.choice([":", "-", "*", "/"])
    doc = [
        "Run-length encode s: each maximal run of a character c of length n becomes",
        f"'c{sep}n'; the pieces are joined with ','. The empty string encodes to ''.",
    ]
    body = (
        "out = []\n    i = 0\n    while i < len(s):\n        j = i\n"
        "        while j < len(s) and s[j] == s[i]:\n            j += 1\n"
        f"        out.append(s[i] + '{sep}' + str(j - i))\n        i = j\n"
        "    return ','.join(out)"
    )
    return "s: str", doc, body, lambda g: (_word(g, 0, 12, "aab"),)


def _kth_distinct(rng):
    k = rng.randint(1, 3)
    doc = [
        f"Return the {k}-th smallest distinct value of xs (1-based), or None if xs has",
        f"fewer than {k} distinct values.",
    ]
    body = f"d = sorted(set(xs))\n    return d[{k - 1}] if len(d) >= {k} else None"
    return "xs: list", doc, body, lambda g: (_ints(g, -5, 5, 0, 8),)


def _window_max_sum(rng):
    w = rng.randint(2, 4)
    doc = [f"Return the largest sum of {w} consecutive elements of xs, or 0 if len(xs) < {w}."]
    body = (
        f"if len(xs) < {w}:\n        return 0\n"
        f"    return max(sum(xs[i:i + {w}]) for i in range(len(xs) - {w} + 1))"
    )
    return "xs: list", doc, body, lambda g: (_ints(g, -10, 10, 0, 9),)


def _xor_popcount(rng):
    mask = rng.randint(1, 255)
    doc = [f"Return the number of 1 bits in the binary form of n XOR {mask} (n >= 0)."]
    body = f"return bin(n ^ {mask}).count('1')"
    return "n: int", doc, body, lambda g: (g.randint(0, 4096),)


def _words_by_length(rng):
    min_len = rng.randint(2, 4)
    desc = rng.choice([True, False])
    order = "longest first" if desc else "shortest first"
    doc = [
        f"Split text on whitespace and return the words of length at least {min_len},",
        f"sorted by length ({order}), ties broken alphabetically.",
    ]
    key = "(-len(w), w)" if desc else "(len(w), w)"
    body = f"return sorted((w for w in text.split() if len(w) >= {min_len}), key=lambda w: {key})"

    def gen(g):
        return (" ".join(_word(g, 1, 6, "abcdeklmn") for _ in range(g.randint(0, 7))),)

    return "text: str", doc, body, gen


def _vowel_weight(rng):
    vowels = "".join(sorted(rng.sample("aeiouy", rng.randint(2, 4))))
    weight = rng.randint(2, 5)
    doc = [
        f"Return the score of s: each character in '{vowels}' counts {weight}, every other",
        "letter counts 1, and non-letters count 0.",
    ]
    body = f"return sum({weight} if c in '{vowels}' else 1 if c.isalpha() else 0 for c in s)"
    return "s: str", doc, body, lambda g: (_word(g, 0, 12, "aeiouybcd 7!"),)


def _chunk_reverse(rng):
    c = rng.randint(2, 4)
    doc = [
        f"Split xs into consecutive chunks of {c} elements (the last may be shorter),",
        "reverse each chunk, and return the concatenation.",
    ]
    body = f"return [x for i in range(0, len(xs), {c}) for x in reversed(xs[i:i + {c}])]"
    return "xs: list", doc, body, lambda g: (_ints(g, 0, 30, 0, 10),)


def _collatz_like(rng):
    cap = rng.randint(20, 60)
    doc = [
        "Starting from n >= 1, repeatedly replace n by n // 2 if n is even, else by",
        f"3 * n + 1. Return the number of replacements until n == 1, but at most {cap}.",
    ]
    body = (
        f"steps = 0\n    while n != 1 and steps < {cap}:\n"
        "        n = n // 2 if n % 2 == 0 else 3 * n + 1\n        steps += 1\n"
        "    return steps"
    )
    return "n: int", doc, body, lambda g: (g.randint(1, 300),)


def _dedupe_keep(rng):
    keep_last = rng.choice([False, True])
    which = "last" if keep_last else "first"
    doc = [
        f"Return xs without duplicates, keeping the {which} occurrence of each value and",
        "the relative order of the kept elements.",
    ]
    body = (
        "seen = set()\n    out = []\n"
        f"    for x in {'reversed(xs)' if keep_last else 'xs'}:\n"
        "        if x not in seen:\n            seen.add(x)\n            out.append(x)\n"
        f"    return {'out[::-1]' if keep_last else 'out'}"
    )
    return "xs: list", doc, body, lambda g: (_ints(g, 0, 5, 0, 10),)


def _poly_eval(rng):
    coeffs = [rng.randint(-5, 5) for _ in range(rng.randint(2, 4))]
    terms = " + ".join(f"({c}) * x ** {i}" for i, c in enumerate(coeffs))
    doc = [f"Return [p(x) for x in xs] where p(x) = {terms}."]
    body = f"return [sum(c * x ** i for i, c in enumerate({coeffs!r})) for x in xs]"
    return "xs: list", doc, body, lambda g: (_ints(g, -6, 6, 0, 6),)


def _substitute(rng):
    src = "".join(rng.sample("abcdefghij", 3))
    dst = "".join(rng.choice("klmnopqrstuvwxyz") for _ in range(3))
    pairs = ", ".join(f"'{a}' -> '{b}'" for a, b in zip(src, dst))
    doc = [
        f"Return s with every occurrence of each letter replaced as follows: {pairs};",
        "all other characters unchanged (replacements are not applied twice).",
    ]
    body = f"return s.translate(str.maketrans({src!r}, {dst!r}))"
    return "s: str", doc, body, lambda g: (_word(g, 0, 12, "abcdefghijxyz "),)


def _base_repr(rng):
    b = rng.randint(2, 9)
    width = rng.randint(0, 6)
    doc = [
        f"Return the base-{b} digits of the non-negative integer n as a string, left-padded",
        f"with '0' to at least {width} characters ('0' for n == 0 before padding).",
    ]
    body = (
        f"digits = ''\n    while n:\n        digits = str(n % {b}) + digits\n"
        f"        n //= {b}\n    return (digits or '0').rjust({width}, '0')"
    )
    return "n: int", doc, body, lambda g: (g.randint(0, 5000),)


def _clamp_scale(rng):
    lo = rng.randint(-10, 0)
    hi = lo + rng.randint(1, 15)
    k = rng.randint(2, 6)
    doc = [
        f"Clamp every x in xs to the interval [{lo}, {hi}], multiply it by {k}, and return",
        "the resulting list.",
    ]
    body = f"return [{k} * min(max(x, {lo}), {hi}) for x in xs]"
    return "xs: list", doc, body, lambda g: (_ints(g, -20, 20, 0, 8),)


FAMILIES: dict[str, Callable] = {
    f.__name__.lstrip("_"): f
    for f in (
        _affine_filter,
        _caesar,
        _digit_sum_base,
        _count_divisible,
        _running,
        _every_kth_upper,
        _pairs_divisible,
        _rle,
        _kth_distinct,
        _window_max_sum,
        _xor_popcount,
        _words_by_length,
        _vowel_weight,
        _chunk_reverse,
        _collatz_like,
        _dedupe_keep,
        _poly_eval,
        _substitute,
        _base_repr,
        _clamp_scale,
    )
}


def _assert_line(name_or_candidate: str, args, expected) -> str:
    return f"assert {name_or_candidate}({', '.join(repr(a) for a in args)}) == {expected!r}"


def generate_problem(seed: int, num_tests: int = 8, avoid: frozenset = frozenset()) -> dict:
    """One problem, deterministic in ``seed``.

    Returns a dict with ``task_id``, ``family``, ``prompt`` (signature + docstring, HumanEval
    style), ``entry_point``, ``canonical_solution`` (the body, to append to the prompt) and
    ``test`` (``def check(candidate)`` with ``num_tests`` hidden asserts whose inputs differ
    from the docstring example). Inputs whose assertion (whitespace-normalised) is in
    ``avoid`` are skipped, so a split can be kept free of another split's assertions.
    """
    rng = random.Random(seed)
    family = rng.choice(sorted(FAMILIES))
    signature, doc, body, gen = FAMILIES[family](rng)
    name = _name(rng)
    namespace: dict = {}
    exec(f"def {name}({signature}):\n    {body}\n", namespace)  # our own reference code
    ref = namespace[name]
    seen, inputs = set(), []
    for _ in range(200):
        args = gen(rng)
        if repr(args) not in seen and _assert_line("candidate", args, ref(*args)) not in avoid:
            seen.add(repr(args))
            inputs.append(args)
        if len(inputs) == num_tests + 1:
            break
    example, hidden = inputs[0], inputs[1:]
    call = lambda args: f"{name}({', '.join(repr(a) for a in args)})"  # noqa: E731
    docstring = "\n    ".join(doc + ["", f">>> {call(example)}", repr(ref(*example))])
    prompt = f'def {name}({signature}):\n    """{docstring}\n    """\n'
    asserts = "\n".join(f"    {_assert_line('candidate', args, ref(*args))}" for args in hidden)
    return {
        "task_id": f"gen/{family}/{seed}",
        "family": family,
        "prompt": prompt,
        "entry_point": name,
        "canonical_solution": f"    {body}\n",
        "test": f"def check(candidate):\n{asserts}\n",
    }
