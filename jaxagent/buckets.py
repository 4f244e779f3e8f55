"""Shape bucketing: the one rule that rounds a host-side size up to a compiled shape.

Jitted functions recompile for every new input shape, so every size that reaches jit (a
batch's sequence length, a prefill chunk, a KV-cache capacity, a pool batch) is rounded up to
one of few buckets. ``bucket`` is that rounding; ``pick_bucket`` chooses from an explicit
list of sizes. Pure Python: the host pool uses it without importing jax.
"""

from __future__ import annotations

from typing import Optional, Sequence


def bucket(
    n: int, *, multiple: int = 1, pow2: bool = False, minimum: int = 1, cap: Optional[int] = None
) -> int:
    """The bucket of size ``n``: rounded up to a power of two (``pow2``) or to a multiple of
    ``multiple``, at least ``minimum``, at most ``cap``.

    Examples: ``bucket(70, multiple=32, minimum=32) == 96``; ``bucket(70, pow2=True,
    minimum=16) == 128``; ``bucket(300, pow2=True, cap=256) == 256``.
    """
    if pow2:
        size = 1 << max(0, (int(n) - 1).bit_length())
    else:
        size = -(-int(n) // multiple) * multiple
    size = max(size, minimum)
    return size if cap is None else min(size, cap)


def pick_bucket(n: int, buckets: Sequence[int], what: str = "length") -> int:
    """Smallest of ``buckets`` >= n. Raises a readable error when n exceeds the largest."""
    for b in sorted(buckets):
        if n <= b:
            return int(b)
    raise ValueError(
        f"{what} {n} exceeds the largest bucket {max(buckets)}; add a larger bucket or "
        "truncate the input (e.g. rollout.max_observation_chars)"
    )
