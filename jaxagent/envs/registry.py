"""The registry of environment suites (``env.name`` in a config).

A suite registers itself, in its own package, with one call::

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class EchoOptions:                       # every key ``env.options`` may hold, typed
        num_tasks: int = 8
        env: EchoEnvConfig = dataclasses.field(default_factory=EchoEnvConfig,
                                               metadata=FLATTEN)  # its fields are options too

    def build(options: EchoOptions) -> EnvSpec:
        return EnvSpec(name="echo", make_source=lambda: EchoSource(options.num_tasks),
                       make_env=functools.partial(EchoEnv, options.env), system_prompt="")

    register_env("echo", build, options=EchoOptions)

``get_env_spec(name, raw_options)`` validates the user's ``env.options`` mapping into the
suite's options dataclass (errors name ``env.options.<key>``, the value, the allowed keys and
the closest one) and calls ``build``. Options are flat: a field marked ``FLATTEN`` whose type
is a dataclass (a world or env config) contributes its own fields as keys, so suites compose
their existing config dataclasses without renaming a field.

Built-in suites are found lazily: the registry knows the module that registers each one and
imports it on first lookup, so a missing optional package (``bfcl-eval``) only matters when
its suite is used, and nothing is imported at start-up. A suite outside jaxagent registers
when its module is imported, or a config names it as ``"package.module:name"`` (the module is
imported on lookup). Nothing here imports JAX.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import threading
import types
import typing
from typing import Any, Callable, Mapping, Optional

from jaxagent.envs.base import Task, TaskSource, TextEnv

FLATTEN = {"flatten": True}  # field metadata: the dataclass field's own fields are options

# Built-in suites: name -> the module whose import registers it.
_BUILTIN = {
    "quickstart": "jaxagent.envs.tools.quickstart.suite",
    "bfcl": "jaxagent.envs.tools.bfcl.suite",
    "bfcl_gen": "jaxagent.envs.tools.bfcl.suite",
    "code": "jaxagent.envs.code.suite",
    "shop": "jaxagent.envs.web.suite",
    "booking": "jaxagent.envs.web.suite",
    "miniwob": "jaxagent.envs.web.suite",
    "math": "jaxagent.envs.math.suite",
    "dialogue": "jaxagent.envs.dialogue.suite",
    "manipulation": "jaxagent.envs.robot.manipulation.suite",
}


class EnvOptionsError(ValueError):
    """``env.options`` does not fit the suite's options dataclass."""


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """What a run needs from a suite.

    ``make_env`` builds one environment; for the process backend it must pickle (a top-level
    class or a ``functools.partial`` of one over frozen configs, as the built-ins do; ``env_fn``
    rebuilds it by name in a worker otherwise). ``vocabulary`` lists the suite's closed
    vocabulary (word-level tokenizers), when it has one. ``make_expert(task, error_rate, rng)``
    returns an object with ``act(observation) -> action text`` (SFT warm-starts), when it has
    one. ``make_random(task, rng)`` returns the suite's baseline policy, an object with the
    same ``act``: the floor ``jaxagent check`` compares the expert with (an empty action when
    the suite has none). ``check_extras(tasks, runs)`` adds the suite's own figures to the
    check's JSON line; ``runs`` maps a policy name ("expert", "random") to its run through the
    pool, whose ``episodes`` each have ``task``, ``final`` (the last reply: ``observation``,
    ``reward``, ``done``, ``info``) and ``steps``; a non-empty ``"failed_checks"`` list among
    them fails the check. ``task_group(task)`` names a task's kind
    (level, layout, MiniWoB task): the check reports success per group.
    """

    name: str
    make_source: Callable[[], TaskSource]
    make_env: Callable[[], TextEnv]
    system_prompt: str
    vocabulary: Optional[Callable[[], list[str]]] = None
    make_expert: Optional[Callable[[Task, float, Any], Any]] = None
    make_random: Optional[Callable[[Task, Any], Any]] = None
    check_extras: Optional[Callable[[list[Task], Mapping[str, Any]], dict]] = None
    task_group: Optional[Callable[[Task], str]] = None


@dataclasses.dataclass(frozen=True)
class NoOptions:
    """The options of a suite that takes none."""


@dataclasses.dataclass(frozen=True)
class _Entry:
    build: Callable[[Any], EnvSpec]
    options: type
    keys: dict[str, tuple[str, ...]]  # option key -> path of field names in ``options``


_REGISTRY: dict[str, _Entry] = {}
_LOCK = threading.RLock()


def _option_keys(cls: type, prefix: tuple[str, ...] = ()) -> dict[str, tuple[str, ...]]:
    if not (dataclasses.is_dataclass(cls) and isinstance(cls, type)):
        raise TypeError(f"options={cls!r} must be a dataclass type (frozen, with defaults)")
    hints = typing.get_type_hints(cls)
    keys: dict[str, tuple[str, ...]] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if f.metadata.get("flatten"):
            inner = _option_keys(hints[f.name], prefix + (f.name,))
        else:
            inner = {f.name: prefix + (f.name,)}
        for key, path in inner.items():
            if key in keys:
                raise TypeError(
                    f"option {key!r} of {cls.__name__} is declared twice "
                    f"({'.'.join(keys[key])} and {'.'.join(path)}); rename one"
                )
            keys[key] = path
    return keys


def register_env(
    name: str, build: Callable[[Any], EnvSpec], *, options: type = NoOptions, replace: bool = False
) -> None:
    """Add a suite: ``build(options) -> EnvSpec``, with ``options`` its frozen options
    dataclass (every field defaulted). Raises on a name already taken unless ``replace``."""
    if not name or ":" in name:
        raise ValueError(f"env name {name!r} must be non-empty and contain no ':'")
    keys = _option_keys(options)
    with _LOCK:
        old = _REGISTRY.get(name)
        if old is not None and not replace and (old.build, old.options) != (build, options):
            raise ValueError(
                f"env {name!r} is already registered; pick another name or pass replace=True"
            )
        _REGISTRY[name] = _Entry(build, options, keys)


def env_names() -> tuple[str, ...]:
    """Names accepted by ``env.name``: the built-in suites and every registered one."""
    with _LOCK:
        return tuple(dict.fromkeys([*_BUILTIN, *_REGISTRY]))


def _entry(name: str) -> _Entry:
    with _LOCK:
        if name in _REGISTRY:
            return _REGISTRY[name]
    module = _BUILTIN.get(name) or (name.split(":", 1)[0] if ":" in name else None)
    if module is None:
        close = difflib.get_close_matches(name, env_names(), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise KeyError(
            f"unknown env {name!r}{hint} known envs: {list(env_names())} (or "
            "'package.module:name' for a suite registered by that module)"
        )
    try:
        importlib.import_module(module)  # registers the suite
    except ImportError as err:
        where = (
            "put the folder that holds it on PYTHONPATH or pip install its package"
            if name not in _BUILTIN
            else "install the suite's optional dependencies"
        )
        raise KeyError(
            f"env {name!r}: module {module!r} cannot be imported ({type(err).__name__}: "
            f"{err}); {where}"
        ) from None
    key = name.split(":", 1)[1] if ":" in name else name  # what the module registers
    with _LOCK:
        if name not in _REGISTRY and key in _REGISTRY:
            _REGISTRY[name] = _REGISTRY[key]
        if name not in _REGISTRY:
            raise KeyError(
                f"env {name!r}: module {module!r} was imported but registered no env {key!r}; "
                f"it must call jaxagent.envs.registry.register_env({key!r}, ...)"
            )
        return _REGISTRY[name]


def _check_type(name: str, key: str, value: Any, hint: Any) -> Any:
    """``value`` as the field's type where the annotation is a plain scalar or a tuple."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return value
        hint = next((a for a in args if a is not type(None)), hint)
        origin = typing.get_origin(hint)
    if isinstance(value, list):
        value = tuple(value)  # YAML lists; frozen configs hold tuples
    ok = True
    if hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif hint is str:
        ok = isinstance(value, str)
    elif origin is tuple:
        ok = isinstance(value, tuple)
    if not ok:
        want = getattr(hint, "__name__", str(hint))
        raise EnvOptionsError(
            f"env.options.{key}={value!r} for env {name!r} must be of type {want}"
        )
    return value


def _default(f: dataclasses.Field) -> Any:
    """A field's default value (its ``default_factory``'s, called), or None where it has none."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


def _build_options(
    cls: type,
    given: dict[tuple[str, ...], Any],
    prefix: tuple[str, ...],
    name: str,
    base: Any = None,
) -> Any:
    """``cls`` with the ``given`` keys (paths under ``prefix``) set: built from ``base`` (the
    section's default: its field's ``default_factory`` value, which may differ from the class's
    defaults) when there is one, so the keys not given keep the default's values."""
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        path = prefix + (f.name,)
        if f.metadata.get("flatten"):
            sub = {p: v for p, v in given.items() if p[: len(path)] == path}
            if sub:
                inner = _default(f) if base is None else getattr(base, f.name)
                kwargs[f.name] = _build_options(hints[f.name], sub, path, name, inner)
        elif path in given:
            kwargs[f.name] = given[path]
    try:
        return cls(**kwargs) if base is None else dataclasses.replace(base, **kwargs)
    except (TypeError, ValueError) as exc:
        keys = ", ".join(f"env.options.{p[-1]}={v!r}" for p, v in given.items())
        raise EnvOptionsError(f"env {name!r}: {keys}: {exc}") from exc


def parse_options(name: str, options: Any = None) -> Any:
    """The suite's typed options from the user's ``env.options`` (a mapping), or ``options``
    itself when it already is an instance of the suite's options dataclass."""
    entry = _entry(name)
    if isinstance(options, entry.options):
        return options
    options = dict(options or {})
    hints: dict[tuple[str, ...], Any] = {}
    given: dict[tuple[str, ...], Any] = {}
    for key, value in options.items():
        path = entry.keys.get(key)
        if path is None:
            allowed = sorted(entry.keys)
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"did you mean env.options.{close[0]}? " if close else ""
            raise EnvOptionsError(
                f"unknown option env.options.{key}={value!r} for env "
                f"{name!r}; {hint}allowed: {allowed or 'none'}"
            )
        owner = entry.options
        for part in path[:-1]:
            owner = typing.get_type_hints(owner)[part]
        hints[path] = typing.get_type_hints(owner)[path[-1]]
        given[path] = _check_type(name, key, value, hints[path])
    return _build_options(entry.options, given, (), name)


def get_env_spec(name: str, options: Any = None) -> EnvSpec:
    """The ``EnvSpec`` of a suite, its options validated (see ``parse_options``)."""
    spec = _entry(name).build(parse_options(name, options))
    if not isinstance(spec, EnvSpec):
        raise TypeError(
            f"the builder of env {name!r} returned {type(spec).__name__}, not an EnvSpec"
        )
    return spec


@dataclasses.dataclass(frozen=True)
class EnvFactory:
    """Picklable ``env_fn(env_id)`` for the pool: rebuilds the suite by name in the worker,
    so it works for any registered suite (the worker must be able to import or have inherited
    its registration: built-ins and ``module:name`` always can)."""

    name: str
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __call__(self, env_id: int = 0) -> TextEnv:
        return get_env_spec(self.name, dict(self.options)).make_env()
