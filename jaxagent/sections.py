"""Config sections derived from the packages' own dataclasses, and the one typed YAML loader.

A run config's section is a package's config (``parallel.mesh.MeshConfig``) or is derived from
one by the rule here, so no field is copied by hand:

- ``derive(Cls, key=...)`` is a frozen dataclass with ``Cls``'s fields, typed for YAML
  (``tuple[X, ...]`` becomes a list, ``tuple[tuple[str, V], ...]`` pairs a mapping), less the
  fields the run derives (``drop``: a model's vocabulary size from the tokenizer, a budget's
  length from the model), with ``Cls``'s defaults or a preset's (``defaults``), plus fields
  of the run's own (``extra``: where to load the weights from). ``optional=True`` makes every
  field ``None`` by default ("the preset's value", the RL recipe sections).
- ``build(section, Cls, **derived)`` is ``Cls`` built back from a section's fields of the same
  name plus the derived values; ``Cls.__post_init__`` validates, and its messages name the
  YAML key (``ModelConfig.hidden_size`` reads ``model.hidden_size``). A section validates
  when it is loaded by building its classes with placeholder derived values (``probe``).
- ``load_typed(schema, path, overrides)`` merges a YAML file and ``key=value`` overrides onto
  a dataclass schema with OmegaConf, and reports an unknown key (with a did-you-mean and the
  allowed keys, or the new name of a renamed key), a wrong type and invalid YAML in one line.

On the ground floor beside ``errors.py``: no JAX, no other jaxagent import, so ``pool`` and
``envs`` configs can be derived without importing what uses them.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from jaxagent.errors import FROZEN, ConfigError

# Where a derived section's classes and YAML key are kept (class attributes, not fields).
_SOURCES = "__sources__"
_KEY = "__section_key__"


def _yaml_type(hint: Any) -> Any:
    """``hint`` as OmegaConf can check it: tuples of pairs as mappings, other tuples as lists."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union and type(None) in args:
        inner = [a for a in args if a is not type(None)]
        return Optional[_yaml_type(inner[0])] if len(inner) == 1 else Any
    if origin is tuple:
        item = args[0] if args else Any
        if typing.get_origin(item) is tuple and len(typing.get_args(item)) == 2:
            return Dict[typing.get_args(item)[0], Any]
        return List[item]
    return hint


def derive(
    *sources: type,
    key: str,
    name: str,
    module: str,
    doc: str = "",
    drop: Sequence[str] = (),
    defaults: Optional[Mapping[str, Any]] = None,
    extra: Sequence[tuple] = (),
    optional: bool = False,
    probe: Optional[Callable[[Any], Dict[str, Dict[str, Any]]]] = None,
    check: Optional[Callable[[Any], None]] = None,
) -> type:
    """A YAML section derived from the package dataclasses ``sources`` (see the module doc).

    Args:
      sources: the package configs whose fields make the section (a field two of them share,
        like the budget's and the sampler's ``max_new_tokens``, is one key).
      key: the section's dotted YAML key (``model``, ``env.pool``), used in messages.
      name: the class name (the module must bind the class to it, for pickling).
      module: the module that binds it (``__name__``).
      doc: its docstring.
      drop: fields the run derives (not in YAML).
      defaults: defaults that replace the sources' (a preset); a source field without a
        default must get one here or be dropped.
      extra: ``(name, type, default)`` fields of the run's own, not in any source.
      optional: every field ``None`` by default ("the preset's value"); nothing is validated.
      probe: ``section -> {Source.__name__: placeholder derived values}``; with it, loading
        the section builds each source once to validate it.
      check: more validation of the section (what the run's derivation needs).
    """
    defaults = dict(defaults or {})
    fields, seen = [], set()
    for cls in sources:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name in drop or f.name in seen or not f.init:
                continue
            seen.add(f.name)
            hint = _yaml_type(hints[f.name])
            if optional:
                fields.append((f.name, Optional[hint], dataclasses.field(default=None)))
                continue
            if f.name in defaults:
                value = defaults.pop(f.name)
            elif f.default is not dataclasses.MISSING:
                value = f.default
            elif f.default_factory is not dataclasses.MISSING:
                value = f.default_factory()
            else:
                raise TypeError(f"{name}: {cls.__name__}.{f.name} needs a default or a drop")
            if isinstance(value, tuple):  # as the YAML type: a mapping of pairs, or a list
                value = dict(value) if typing.get_origin(hint) is dict else list(value)
            if isinstance(value, (list, dict)):
                fields.append((f.name, hint, dataclasses.field(default_factory=_copier(value))))
            else:
                fields.append((f.name, hint, dataclasses.field(default=value)))
    if defaults:
        raise TypeError(f"{name}: defaults for fields it does not have: {sorted(defaults)}")
    for field_name, hint, default in extra:
        fields.append((field_name, hint, dataclasses.field(default=default)))

    def __post_init__(self):
        if check is not None:
            check(self)
        if probe is not None:
            placeholders = probe(self)
            for cls in sources:
                build(self, cls, **placeholders.get(cls.__name__, {}))

    namespace = {} if optional else {"__post_init__": __post_init__}
    made = dataclasses.make_dataclass(name, fields, namespace=namespace, **FROZEN)
    made.__doc__ = doc or f"The ``{key}`` section: {', '.join(c.__name__ for c in sources)}."
    made.__module__ = module
    setattr(made, _SOURCES, sources)
    setattr(made, _KEY, key)
    return made


def _copier(value):
    return lambda: type(value)(value)


def section_key(section: Any) -> str:
    return getattr(type(section), _KEY)


def build(section: Any, cls: type, **derived: Any) -> Any:
    """``cls`` built from ``section``'s fields of the same name and the ``derived`` values (which
    win); a ``ValueError`` of its checks is a ``ConfigError`` naming the YAML key."""
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    values = {n: getattr(section, n) for n in names if hasattr(section, n)}
    # back from the YAML types (``_yaml_type``): lists and mappings of pairs are tuples
    values = {
        n: tuple(v) if isinstance(v, list) else tuple(sorted(v.items())) if _pairs(cls, n, v) else v
        for n, v in values.items()
    }
    values.update(derived)
    try:
        return cls(**values)
    except (ValueError, TypeError) as err:
        text = str(err.args[0]) if err.args else type(err).__name__
        raise ConfigError(text.replace(f"{cls.__name__}.", f"{section_key(section)}.")) from None


def _pairs(cls: type, name: str, value: Any) -> bool:
    """Whether ``value`` is a mapping that ``cls`` keeps as a tuple of pairs."""
    if not isinstance(value, dict):
        return False
    hint = typing.get_type_hints(cls)[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    return any(typing.get_origin(a) is tuple for a in [hint, *args])


def fields_of(node_type: Any) -> List[str]:
    if dataclasses.is_dataclass(node_type):
        return [f.name for f in dataclasses.fields(node_type)]
    return []


def _section_type(schema: type, full_key: str) -> Any:
    """The dataclass that holds ``full_key``'s last part (None past a non-dataclass)."""
    node: Any = schema
    for part in [p for p in full_key.split(".")[:-1] if p]:
        if not dataclasses.is_dataclass(node):
            return None
        node = typing.get_type_hints(node).get(part)
    return node


def _explain(err, origin: str, schema: type, renamed: Mapping[str, str]) -> ConfigError:
    from omegaconf.errors import ConfigKeyError, ValidationError

    full_key = str(getattr(err, "full_key", None) or getattr(err, "key", None) or "?")
    if isinstance(err, ConfigKeyError):
        for old, new in renamed.items():
            if full_key in (old, old.rstrip(".")) or (
                old.endswith(".") and full_key.startswith(old)
            ):
                return ConfigError(
                    f"{origin}: unknown config key {full_key!r} (renamed: did you mean {new}?)"
                )
        allowed = fields_of(_section_type(schema, full_key))
        leaf = full_key.split(".")[-1]
        close = difflib.get_close_matches(leaf, allowed, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return ConfigError(
            f"{origin}: unknown config key {full_key!r}{hint}; allowed keys here: {allowed}"
        )
    if isinstance(err, ValidationError):
        return ConfigError(f"{origin}: bad value for {full_key!r}: {str(err).splitlines()[0]}")
    return ConfigError(f"{origin}: {str(err).splitlines()[0]} (key {full_key!r})")


def _yaml_problem(err: Exception) -> str:
    mark = getattr(err, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return where + (getattr(err, "problem", None) or str(err).splitlines()[0])


def read_yaml(path: str | Path, example: str = "configs/quickstart.yaml"):
    """A config file's top level, which must be a YAML mapping (``DictConfig``)."""
    import yaml
    from omegaconf import DictConfig, OmegaConf

    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            f"config file {str(path)!r} does not exist; pass a YAML file such as {example}"
        )
    try:
        layer = OmegaConf.load(path)
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ConfigError(
            f"config file {str(path)!r} is not valid YAML ({_yaml_problem(err)}); fix the "
            f"syntax there ({example} is a working example)"
        ) from None
    if not isinstance(layer, DictConfig):
        kind = type(layer).__name__.replace("Config", "").lower()
        raise ConfigError(
            f"config file {str(path)!r} holds a YAML {kind}, not a mapping of keys; write it "
            f"as `key: value` blocks ({example} is a working example)"
        )
    return layer


def load_typed(
    schema: Any,
    path: str | Path | None = None,
    overrides: Sequence[str] = (),
    *,
    data: Optional[Mapping[str, Any]] = None,
    origin: Optional[str] = None,
    renamed: Optional[Mapping[str, str]] = None,
    example: str = "configs/quickstart.yaml",
) -> Any:
    """A YAML file (or the mapping ``data``) and ``key=value`` overrides merged onto the frozen
    dataclass ``schema`` (a class: its defaults; an instance: its values), validated.

    Args:
      schema: the dataclass (or an instance to change).
      path: a YAML mapping; None: no file.
      overrides: dotted ``key=value`` strings, applied after the file in order.
      data: a mapping applied like a file (named ``origin`` in messages).
      renamed: ``{old key: new key}`` (an old key ending in ``.`` is a prefix): an old key is
        refused with its new name.
      example: a working config file named in the messages.

    Raises:
      ConfigError: a missing or invalid file, an unknown key, a wrong type or a value the
        sections' own checks refuse, in one line naming the key and the fix.
    """
    import yaml
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    renamed = dict(renamed or {})
    schema_type = schema if isinstance(schema, type) else type(schema)
    layers = []
    if path is not None:
        layers.append((str(path), read_yaml(path, example)))
    if data is not None:
        layers.append((origin or "config", OmegaConf.create(dict(data))))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key=value (e.g. train.seed=1)")
        try:
            layers.append((f"override {item!r}", OmegaConf.from_dotlist([item])))
        except (yaml.YAMLError, OmegaConfBaseException) as err:
            raise ConfigError(
                f"override {item!r}: its value is not valid YAML ({_yaml_problem(err)}); quote "
                "it, e.g. key='value'"
            ) from None
    merged = OmegaConf.structured(schema)
    for where, layer in layers:
        try:
            merged = OmegaConf.merge(merged, layer)
        except OmegaConfBaseException as err:
            raise _explain(err, where, schema_type, renamed) from None
    try:
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        raise _explain(err, origin or str(path or "config"), schema_type, renamed) from None
