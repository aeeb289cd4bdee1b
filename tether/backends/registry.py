"""The adapter registry: one table of adapter classes keyed by `kind`, one factory.

Each adapter is a small class with `kind`, a typed config dataclass `Config`, and a constructor
`Adapter(name, config)`. `build_backend(name, kind, options)` checks `options` (a plain dict from the
config file) against the dataclass: unknown or missing options and wrong types are a ValueError
naming the backend and the option. Add an adapter with `@register_backend` (or `register_backend(cls)`).

    backend = build_backend("fast", "cerebras", {"max_retries": 1, "stream_idle_timeout_s": 30})
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from tether.backends.base import Backend
from tether.backends.cerebras import CerebrasBackend
from tether.backends.openai_compat import OpenAICompatBackend
from tether.backends.simulated import SimulatedBackend

T = TypeVar("T", bound=type)

_ADAPTERS: dict[str, type] = {}


def register_backend(cls: T) -> T:
    """Register an adapter class under its `kind` (class attributes `kind` and `Config` required)."""
    kind = getattr(cls, "kind", None)
    config = getattr(cls, "Config", None)
    if not kind or not (isinstance(config, type) and dataclasses.is_dataclass(config)):
        raise TypeError(f"{cls.__name__}: an adapter needs a `kind` and a dataclass `Config`")
    _ADAPTERS[kind] = cls
    return cls


for _cls in (SimulatedBackend, CerebrasBackend, OpenAICompatBackend):
    register_backend(_cls)


def backend_kinds() -> list[str]:
    return sorted(_ADAPTERS)


def adapter_class(kind: str) -> type[Any]:
    try:
        return _ADAPTERS[kind]
    except KeyError:
        raise ValueError(
            f"unknown backend kind {kind!r}; known kinds: {', '.join(backend_kinds())}"
        ) from None


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check (and lightly coerce: int -> float, "true" -> True, numeric strings) one option value."""
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except ValueError as exc:
                errors.append(exc)
        raise ValueError(f"{where} must be {' or '.join(_type_name(a) for a in args)}, got {value!r}")
    if origin in (dict, Mapping) or tp is dict:
        if not isinstance(value, Mapping):
            raise ValueError(f"{where} must be a table/object, got {value!r}")
        return dict(value)
    if origin in (list, tuple) or tp in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ValueError(f"{where} must be a list, got {value!r}")
        return list(value) if (origin or tp) is list else tuple(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ValueError(f"{where} must be a boolean, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        raise ValueError(f"{where} must be an integer, got {value!r}")
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ValueError(f"{where} must be a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ValueError(f"{where} must be a string, got {value!r}")
    return value


def parse_options(kind: str, options: Mapping[str, Any] | None, name: str = "") -> Any:
    """The adapter's config dataclass built from `options`, validated."""
    label = f"backend {name!r} (kind {kind!r})" if name else f"backend kind {kind!r}"
    return parse_dataclass(adapter_class(kind).Config, options, label)


def parse_dataclass(config_cls: type, options: Mapping[str, Any] | None, label: str) -> Any:
    """`config_cls(**options)`, checked: unknown or missing options and wrong types are a
    ValueError that starts with `label` and names the option."""
    options = dict(options or {})
    fields = {f.name: f for f in dataclasses.fields(config_cls) if f.init}
    unknown = sorted(set(options) - set(fields))
    if unknown:
        raise ValueError(
            f"{label}: unknown option(s) {', '.join(unknown)}; known options: {', '.join(sorted(fields))}"
        )
    missing = sorted(
        n
        for n, f in fields.items()
        if n not in options and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    )
    if missing:
        raise ValueError(f"{label}: missing required option(s) {', '.join(missing)}")
    hints = typing.get_type_hints(config_cls)
    values = {k: _coerce(v, hints.get(k, Any), f"{label}: option {k!r}") for k, v in options.items()}
    return config_cls(**values)


def build_backend(name: str, kind: str, options: Mapping[str, Any] | None = None) -> Backend:
    """Build a configured backend instance. Raises ValueError for any configuration problem."""
    cls = adapter_class(kind)
    config = parse_options(kind, options, name)
    return cls(name, config)
