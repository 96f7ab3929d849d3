"""Reads one setting's value (environment text, a TOML or Python value) as its field's type."""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any

from pipeline.settings.fields import error, split, unwrap

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def coerce(flat: str, hint: Any, value: Any) -> Any:
    """``value`` as type ``hint``; :class:`ConfigError` naming ``flat`` when it cannot be."""
    base, _ = unwrap(hint)
    read = _READERS.get(base) or (_as_names if typing.get_origin(base) is tuple else None)
    if read is None:
        raise TypeError(f"settings: no coercion for {hint!r}")  # a field of a new type: add it
    got = read(value)
    if got is None:  # no field takes None: it says "cannot"
        what = {int: "int", float: "float", bool: "bool", str: "text"}.get(base, "a list of text")
        raise error(flat, f"cannot read {value!r} as {what}")
    return got


def _as_bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    return None


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, int | str):
        try:
            return int(value)
        except ValueError:
            return None
    return None


def _as_float(value: Any) -> float | None:
    if isinstance(value, int | float | str) and not isinstance(value, bool):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _as_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return None


def _as_names(value: Any) -> tuple[str, ...] | None:
    if isinstance(value, str):
        return split(value)
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return tuple(value)
    return None


_READERS: dict[Any, Callable[[Any], Any]] = {
    bool: _as_bool,
    int: _as_int,
    float: _as_float,
    str: _as_text,
}
