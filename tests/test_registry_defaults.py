"""A flattened options section keeps its field's ``default_factory`` values when only some of
its keys are given: the registry builds the section from that default, not from the class."""

import dataclasses

import pytest

from jaxagent.envs.registry import FLATTEN, EnvOptionsError, EnvSpec, parse_options, register_env


@dataclasses.dataclass(frozen=True, kw_only=True)
class Inner:
    depth: int = 1
    fmt: str = "json"
    tags: tuple = ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Middle:
    inner: Inner = dataclasses.field(
        default_factory=lambda: Inner(depth=7, fmt="compact"), metadata=FLATTEN
    )
    limit: int = 3


@dataclasses.dataclass(frozen=True, kw_only=True)
class Episode:
    turns: int = 1
    style: str = "plain"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Options:
    middle: Middle = dataclasses.field(
        default_factory=lambda: Middle(inner=Inner(depth=9, fmt="keywords", tags=("a",)), limit=5),
        metadata=FLATTEN,
    )
    env: Episode = dataclasses.field(default_factory=lambda: Episode(turns=4), metadata=FLATTEN)
    seed: int = 0


def _build(options):
    return EnvSpec(name="defaults", make_source=lambda: None, make_env=lambda: None)


register_env("_defaults_probe", _build, options=Options, replace=True)


def test_an_overridden_key_keeps_the_factory_values_beside_it():
    # Options' keys: depth, fmt, tags, limit, turns, style, seed.
    opts = parse_options("_defaults_probe", {"limit": 6})
    assert opts.middle == Middle(inner=Inner(depth=9, fmt="keywords", tags=("a",)), limit=6)
    assert opts.env == Episode(turns=4)  # a section without given keys: its factory's value
    assert parse_options("_defaults_probe", {"style": "json"}).env == Episode(turns=4, style="json")
    opts = parse_options("_defaults_probe", {"fmt": "xml"})  # a key two levels down
    assert opts.middle.inner == Inner(depth=9, fmt="xml", tags=("a",)) and opts.middle.limit == 5
    assert parse_options("_defaults_probe", {"seed": 4}).middle.inner.fmt == "keywords"


def test_an_invalid_value_over_a_factory_default_still_names_the_key():
    with pytest.raises(EnvOptionsError, match=r"env\.options\.limit='x'"):
        parse_options("_defaults_probe", {"limit": "x"})
