"""The errors a user's input raises, and the checks every config uses to raise them.

On the ground floor (no JAX, no other jaxagent import) so that every package, ``envs`` and
``pool`` included, reports bad input the same way: the message names the field or argument,
its value and the fix, and the command line turns it into one line and exit status 2.
"""

from __future__ import annotations

from typing import Any, Sequence


class ConfigError(ValueError):
    """A config file, override or option is invalid; the message names the key and the fix."""


class InputError(ValueError):
    """A command-line argument is invalid; the message names it, its value and the fix."""


def check_choice(field: str, value: Any, allowed: Sequence[Any]) -> None:
    if value not in allowed:
        raise ConfigError(f"{field}={value!r} is not allowed; choose one of {list(allowed)}")


def check_positive(field: str, value: float, *, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{field}={value!r} must be {bound}")


def check_prob(field: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"{field}={value!r} must be a probability in [0, 1]")


# The dataclass options of every config section: frozen, keyword-only, slotted.
FROZEN = dict(frozen=True, kw_only=True, slots=True)
