"""The checks every config section uses, and the error they raise.

Kept apart from the schema (``jaxagent.train.config``) so that section modules
(``jaxagent.train.rl_section``) can use them without importing the whole schema.
"""

from __future__ import annotations

from typing import Any, Sequence


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the key and the fix."""


def _choice(field: str, value: Any, allowed: Sequence[Any]) -> None:
    if value not in allowed:
        raise ConfigError(f"{field}={value!r} is not allowed; choose one of {list(allowed)}")


def _positive(field: str, value: float, *, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{field}={value!r} must be {bound}")


def _prob(field: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"{field}={value!r} must be a probability in [0, 1]")


_DC = dict(frozen=True, kw_only=True, slots=True)
