"""``jaxagent train`` for non-LLM learners (``rl/classic``): dispatch on the config's ``learner``.

A YAML config whose top level has ``learner: NAME`` is not an LM config: ``jaxagent train``
hands it to ``LEARNERS[NAME]``, a ``"module:function"`` whose function takes
``(config_path, overrides)`` (the same ``key=value`` list as the LM trainer), loads and
validates its own typed config (raising ``ConfigError`` with the field, the value and the
fix), trains, writes its outputs (curves, summary, checkpoint) and returns the summary dict
that the command prints as its last line (one JSON object).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Callable

import yaml

from jaxagent.train.config import ConfigError

# name -> "module:function"; the modules import JAX lazily through their own learner.
LEARNERS: dict[str, str] = {
    "dqn_dialogue": "jaxagent.train.dqn_dialogue:train",
    "ppo_continuous": "jaxagent.train.ppo_continuous:train",
}


# name -> "module:function" with (config_path, checkpoint, overrides) -> summary dict, for
# `jaxagent eval CONFIG --checkpoint DIR` on a `learner:` config.
EVALUATORS: dict[str, str] = {
    "ppo_continuous": "jaxagent.train.ppo_continuous:evaluate",
}


def run_evaluator(
    name: str, config_path: str, checkpoint: str, overrides: list[str]
) -> dict[str, Any]:
    """Evaluate a checkpoint of learner ``name``; raises ConfigError if it has no evaluator."""
    if name not in EVALUATORS:
        raise ConfigError(
            f"learner={name!r} has no evaluator for `jaxagent eval`; learners with one: "
            f"{sorted(EVALUATORS)}"
        )
    return _resolve(EVALUATORS[name])(config_path, checkpoint, list(overrides))


def register_learner(name: str, target: str) -> None:
    """Add a learner (``target`` = ``"module:function"``) under ``name``."""
    if ":" not in target:
        raise ValueError(f"learner target {target!r} must be 'module:function'")
    LEARNERS[name] = target


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


def run_learner(name: str, config_path: str, overrides: list[str]) -> dict[str, Any]:
    """Train with learner ``name``; returns the summary it reports."""
    summary = _resolve(LEARNERS[name])(config_path, list(overrides))
    if not isinstance(summary, dict):
        raise TypeError(f"learner {name!r} returned {type(summary).__name__}, not a summary dict")
    return summary
