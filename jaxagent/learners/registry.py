"""``jaxagent train`` for non-LLM learners (``jaxagent/learners``): dispatch on the config's ``learner``.

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
from typing import Any, Callable, Sequence

import yaml

from jaxagent.errors import ConfigError

# name -> "module:function"; the modules import JAX lazily through their own learner.
LEARNERS: dict[str, str] = {
    "dqn_dialogue": "jaxagent.learners.dqn_dialogue.train:train",
    "ppo_continuous": "jaxagent.learners.ppo_continuous.train:train",
}


# name -> "module:function" with (config_path, checkpoint, overrides) -> summary dict, for
# `jaxagent eval CONFIG --checkpoint DIR` on a `learner:` config.
EVALUATORS: dict[str, str] = {
    "ppo_continuous": "jaxagent.learners.ppo_continuous.train:evaluate",
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


def load_learner_config(
    schema: type, path: str | Path | None, overrides: Sequence[str], *, learner: str, keys: str
) -> Any:
    """YAML + ``key=value`` overrides onto the frozen dataclass ``schema`` (omegaconf), for a
    learner's own config; every error is a ``ConfigError`` naming the key, the value and the
    fix (``keys`` lists the valid sections / keys for the message).

    Args:
      schema: the learner's top-level config dataclass (it has a ``learner`` field).
      path: the YAML file, or None for the defaults.
      overrides: dotted ``key=value`` strings, applied after the file.
      learner: the name this trainer answers to (``learner:`` in the file must match).
      keys: a description of the valid keys, appended to unknown-key errors.
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    merged = OmegaConf.structured(schema)
    layers = []
    if path is not None:
        if not Path(path).is_file():
            raise ConfigError(f"config file {str(path)!r} does not exist")
        layers.append((str(path), OmegaConf.load(path)))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key=value (e.g. train.seed=1)")
        layers.append((f"override {item!r}", OmegaConf.from_dotlist([item])))
    for origin, layer in layers:
        try:
            merged = OmegaConf.merge(merged, layer)
        except OmegaConfBaseException as err:
            key = getattr(err, "full_key", None) or "?"
            raise ConfigError(
                f"{origin}: bad or unknown key {key!r}: {str(err).splitlines()[0]}; {keys}"
            ) from None
    try:
        config = OmegaConf.to_object(merged)
    except (ValueError, OmegaConfBaseException) as err:  # the sections' own checks
        raise ConfigError(f"{learner}: {str(err).splitlines()[0]}") from None
    if config.learner != learner:
        raise ConfigError(f"learner={config.learner!r}: this trainer is {learner!r}")
    return config
