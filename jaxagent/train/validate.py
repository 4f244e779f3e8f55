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


def hf_input(fn):
    """``fn`` (a Hugging Face directory loader: ``fn(path, ...)``) with its input errors as
    ``ConfigError`` naming ``model.init_from``, the path and what a valid directory holds (the
    CLI then exits 2 with one line instead of a traceback)."""

    def call(path, *args, **kwargs):
        try:
            return fn(path, *args, **kwargs)
        except ConfigError:
            raise
        except (OSError, ValueError, KeyError) as err:
            text = str(err.args[0]) if err.args else type(err).__name__
            raise ConfigError(
                f"model.init_from={str(path)!r}: {text}; pass a local Hugging Face directory "
                "of a Llama or Qwen2 model (config.json, model*.safetensors, tokenizer files)"
            ) from None

    return call
