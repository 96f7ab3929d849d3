"""How a settings section checks itself: field kinds, the checks they share, errors naming the setting.

A section's ``__post_init__`` calls :func:`check` first: every field's value
is of its declared type, every number finite and non-negative, and the rules
its annotation carries (:data:`Port`, :data:`Listen`, :data:`PositiveInt`...)
hold. What is particular to a section (a URL's form, a relation between two
fields) it checks after, raising :func:`invalid`. Every error is one line
naming the flat setting, and where ``Settings.load`` read it when it did.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import typing
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import field, fields
from typing import Annotated, Any

from pipeline.errors import ConfigError

#: Prefix of every settings variable in the environment.
PREFIX = "SLUICE_"


class Rule(enum.Enum):
    """A check beyond the type, attached to a field's annotation."""

    PORT = "port"
    LISTEN = "listen"
    POSITIVE = "positive"
    NOT_EMPTY = "not empty"


#: A TCP port, 0-65535 (0: let the system pick, or "off" where documented).
Port = Annotated[int, Rule.PORT]
#: ``host:port`` to listen on; empty means off.
Listen = Annotated[str, Rule.LISTEN]
#: A count or size of at least 1.
PositiveInt = Annotated[int, Rule.POSITIVE]
#: A duration (or rate) above 0.
PositiveFloat = Annotated[float, Rule.POSITIVE]
#: Text that must say something.
NonEmpty = Annotated[str, Rule.NOT_EMPTY]
#: A list of names (streams, workers): may be empty, but no name in it is.
Names = Annotated[tuple[str, ...], Rule.NOT_EMPTY]

#: While ``load`` builds settings: where each flat setting came from (for error messages).
SOURCES: ContextVar[Mapping[str, str] | None] = ContextVar("SOURCES", default=None)


@contextmanager
def read_from(sources: Mapping[str, str]) -> Iterator[None]:
    """Name ``sources`` (flat name -> variable or file) in the errors raised inside."""
    token = SOURCES.set(sources)
    try:
        yield
    finally:
        SOURCES.reset(token)


def bare(default: Any) -> Any:
    """A section field whose flat name is its own name (no section prefix)."""
    return field(default=default, metadata={"bare": True})


def split(value: str) -> tuple[str, ...]:
    """``"a, b,,c"`` -> ``("a", "b", "c")``: a list setting written as text."""
    return tuple(part.strip() for part in value.split(",") if part.strip())


_HINTS: dict[type, dict[str, Any]] = {}


def hints(cls: type) -> dict[str, Any]:
    """The resolved field types of a settings class (``Annotated`` kept)."""
    found = _HINTS.get(cls)
    if found is None:
        found = _HINTS[cls] = typing.get_type_hints(cls, include_extras=True)
    return found


def unwrap(hint: Any) -> tuple[Any, tuple[Any, ...]]:
    """``(base type, rules)`` of a field's annotation."""
    if typing.get_origin(hint) is Annotated:
        return hint.__origin__, hint.__metadata__
    return hint, ()


def flat_name(section: str, f: dataclasses.Field[Any]) -> str:
    """The name users write for field ``f`` of ``section`` ("" for the top level)."""
    if "flat" in f.metadata:  # a field named after a setting of another section
        return str(f.metadata["flat"])
    if not section or f.metadata.get("bare"):
        return f.name
    return f"{section}_{f.name}"


def flat_of(obj: Any, name: str) -> str:
    """The flat name of field ``name`` of section ``obj``."""
    return flat_name(obj._SECTION, next(f for f in fields(obj) if f.name == name))


def invalid(obj: Any, name: str, problem: str, *, say_variable: bool = False) -> ConfigError:
    """The error for field ``name`` of section ``obj``, named as the user wrote it.

    ``say_variable``: name the environment variable even when ``load`` did not read
    the value there (``setting 'x' (SLUICE_X) ...``).
    """
    return error(flat_of(obj, name), problem, say_variable=say_variable)


def error(flat: str, problem: str, *, say_variable: bool = False) -> ConfigError:
    """``setting 'flat' (from SOURCE) problem``: one line."""
    where = source(flat) or (f" ({variable(flat)})" if say_variable else "")
    return ConfigError(f"setting {flat!r}{where} {problem}")


def source(flat: str) -> str:
    """`` (from SLUICE_X)`` or `` (from path)`` while ``load`` reads ``flat`` there; else ""."""
    where = (SOURCES.get() or {}).get(flat)
    return f" (from {where})" if where else ""


def variable(flat: str) -> str:
    """The environment variable of flat setting ``flat``."""
    return PREFIX + flat.upper()


def check(obj: Any) -> None:
    """The checks every section shares, field by field: its type, then its range."""
    for f in fields(obj):
        base, rules = unwrap(hints(type(obj))[f.name])
        value = getattr(obj, f.name)
        _check_type(obj, f, base, value)
        if base in (int, float):
            _check_number(obj, f.name, rules, value)
        elif base is str:
            _check_text(obj, f.name, rules, value)
        elif Rule.NOT_EMPTY in rules and not all(name.strip() for name in value):
            raise invalid(obj, f.name, f"must not hold an empty name, got {value!r}")


def _is(base: Any, value: Any) -> bool:
    """True when ``value`` is of field type ``base`` (an int is a float; a bool is neither)."""
    if base is bool:
        return isinstance(value, bool)
    if base is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if base is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if typing.get_origin(base) is tuple:
        return isinstance(value, tuple) and all(isinstance(v, str) for v in value)
    return isinstance(value, base)


def _kind(base: Any) -> str:
    names = {int: "an int", float: "a number", bool: "a bool", str: "text"}
    if base in names:
        return names[base]
    return "a tuple of text" if typing.get_origin(base) is tuple else f"a {base.__name__}"


def _check_type(obj: Any, f: dataclasses.Field[Any], base: Any, value: Any) -> None:
    if not _is(base, value):
        shown = repr(value) if f.repr else f"a {type(value).__name__}"  # a secret stays unshown
        raise invalid(obj, f.name, f"must be {_kind(base)}, got {shown}")


def _check_number(obj: Any, name: str, rules: tuple[Any, ...], value: float) -> None:
    if not math.isfinite(value) or value < 0:
        raise invalid(obj, name, f"must be a non-negative number, got {value}")
    if Rule.PORT in rules and value > 65535:
        raise invalid(obj, name, f"must be a TCP port (0-65535), got {value}")
    if Rule.POSITIVE in rules and value == 0:
        raise invalid(obj, name, f"must be positive, got {value}")


def _check_text(obj: Any, name: str, rules: tuple[Any, ...], value: str) -> None:
    if Rule.NOT_EMPTY in rules and not value.strip():
        raise invalid(obj, name, "must not be empty")
    if Rule.LISTEN in rules and value:
        _, sep, port = value.rpartition(":")
        if not sep or not port.isdigit() or int(port) > 65535:
            raise invalid(obj, name, f"must be host:port, got {value!r}")
