"""``jaxagent train`` for non-LLM learners (``jaxagent/learners``): dispatch on the config's ``learner``.

A YAML config whose top level has ``learner: NAME`` is not an LM config: ``jaxagent train``
hands it to ``LEARNERS[NAME]`` (one ``LearnerSpec`` a learner: its trainer, its evaluator,
an example config). The trainer, a ``"module:function"``, takes ``(config_path, overrides)``
(the same ``key=value`` list as the LM trainer), loads and validates its own typed config
(raising ``ConfigError`` with the field, the value and the fix), trains, writes its outputs
(curves, summary, checkpoint) and returns the summary dict that the command prints as its
last line (one JSON object).
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from typing import Any, Callable, Sequence

import yaml

from jaxagent.errors import ConfigError
from jaxagent.sections import load_typed


@dataclasses.dataclass(frozen=True)
class LearnerSpec:
    """One non-LLM learner: where its trainer (and evaluator) live, and a working config.

    ``train``: ``"module:function"`` taking ``(config_path, overrides)`` and returning the
    summary dict; ``evaluate``: ``"module:function"`` taking ``(config_path, checkpoint,
    overrides)`` for ``jaxagent eval CONFIG --checkpoint DIR`` ("": none); ``example``: a
    config named in the loader's messages. The modules import JAX lazily.
    """

    train: str
    evaluate: str = ""
    example: str = "configs/"


LEARNERS: dict[str, LearnerSpec] = {
    "dqn_dialogue": LearnerSpec(
        train="jaxagent.learners.dqn_dialogue.train:train",
        example="configs/dqn_dialogue.yaml",
    ),
    "ppo_continuous": LearnerSpec(
        train="jaxagent.learners.ppo_continuous.train:train",
        evaluate="jaxagent.learners.ppo_continuous.train:evaluate",
        example="configs/ppo_halfcheetah.yaml",
    ),
}


def run_evaluator(
    name: str, config_path: str, checkpoint: str, overrides: list[str]
) -> dict[str, Any]:
    """Evaluate a checkpoint of learner ``name``; raises ConfigError if it has no evaluator."""
    target = LEARNERS[name].evaluate
    if not target:
        raise ConfigError(
            f"learner={name!r} has no evaluator for `jaxagent eval`; learners with one: "
            f"{sorted(n for n, spec in LEARNERS.items() if spec.evaluate)}"
        )
    return _resolve(target)(config_path, checkpoint, list(overrides))


def register_learner(name: str, spec: LearnerSpec) -> None:
    """Add a learner under ``name``."""
    for target in (spec.train, spec.evaluate):
        if target and ":" not in target:
            raise ValueError(f"learner target {target!r} must be 'module:function'")
    LEARNERS[name] = spec


def learner_of(config_path: str) -> str | None:
    """The config's top-level ``learner`` name, or None for an LM config (or an unreadable
    file, which the LM config loader then reports with its own message)."""
    path = Path(config_path)
    if not path.is_file():
        return None
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        return None
    if not isinstance(raw, dict) or "learner" not in raw:
        return None
    name = raw["learner"]
    if name not in LEARNERS:
        raise ConfigError(
            f"learner={name!r} in {config_path} is not a known learner; choose one of "
            f"{sorted(LEARNERS)} (or drop the key for an LM config)"
        )
    return name


def _resolve(target: str) -> Callable[..., dict[str, Any]]:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def _example(name: str) -> str:
    return LEARNERS[name].example if name in LEARNERS else "configs/"


def run_learner(name: str, config_path: str, overrides: list[str]) -> dict[str, Any]:
    """Train with learner ``name``; returns the summary it reports."""
    summary = _resolve(LEARNERS[name].train)(config_path, list(overrides))
    if not isinstance(summary, dict):
        raise TypeError(f"learner {name!r} returned {type(summary).__name__}, not a summary dict")
    return summary


def load_learner_config(
    schema: type, path: str | Path | None, overrides: Sequence[str], *, learner: str
) -> Any:
    """YAML + ``key=value`` overrides onto the frozen dataclass ``schema`` for a learner's own
    config (``jaxagent.sections.load_typed``, the LM config's loader); every error is a
    ``ConfigError`` naming the key, the value and the fix.

    Args:
      schema: the learner's top-level config dataclass (it has a ``learner`` field).
      path: the YAML file, or None for the defaults.
      overrides: dotted ``key=value`` strings, applied after the file.
      learner: the name this trainer answers to (``learner:`` in the file must match).

    An unknown key is refused with the keys allowed where it was written (``load_typed``).
    """
    try:
        config = load_typed(schema, path, overrides, example=_example(learner))
    except ConfigError as err:
        raise ConfigError(f"{learner}: {err}") from None
    except ValueError as err:  # a section's own check that is not yet a ConfigError
        raise ConfigError(f"{learner}: {str(err).splitlines()[0]}") from None
    if config.learner != learner:
        raise ConfigError(f"learner={config.learner!r}: this trainer is {learner!r}")
    return config
