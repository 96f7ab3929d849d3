"""Applies flat-named values to settings: each read as its field's type, its section rebuilt."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import fields
from typing import Any, ClassVar, Protocol, TypeVar

from pipeline.errors import ConfigError
from pipeline.settings.coerce import coerce
from pipeline.settings.fields import flat_name, hints, source


class _Dataclass(Protocol):
    """Any dataclass instance (what ``dataclasses.replace`` takes)."""

    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]


T = TypeVar("T", bound=_Dataclass)


def sections(cls: type) -> dict[str, type]:
    """The sections of settings class ``cls``: field name -> section class."""
    top = hints(cls)
    return {
        f.name: top[f.name]
        for f in fields(cls)
        if isinstance(top[f.name], type) and dataclasses.is_dataclass(top[f.name])
    }


_INDEX: dict[type, dict[str, tuple[str, str]]] = {}


def flat_index(cls: type) -> dict[str, tuple[str, str]]:
    """Flat name -> (section, field) of every setting of ``cls``; section "" is the top level."""
    index = _INDEX.get(cls)
    if index is None:
        index = _INDEX[cls] = _index(cls)
    return index


def _index(cls: type) -> dict[str, tuple[str, str]]:
    index: dict[str, tuple[str, str]] = {}
    for f in fields(cls):
        section_cls = sections(cls).get(f.name)
        if section_cls is None:
            index[f.name] = ("", f.name)
            continue
        for g in fields(section_cls):
            index[flat_name(f.name, g)] = (f.name, g.name)
    return index


def build(base: T, values: Mapping[str, Any]) -> T:
    """``base`` with ``values`` (flat names, or whole sections by name) applied and checked."""
    cls = type(base)
    parts = sections(cls)
    top: dict[str, Any] = {}
    per_section: dict[str, dict[str, Any]] = {name: {} for name in parts}
    for flat, value in values.items():
        if flat in parts:
            if not isinstance(value, parts[flat]):
                raise ConfigError(f"setting {flat!r} must be a {parts[flat].__name__}")
            top[flat] = value
            continue
        where = flat_index(cls).get(flat)
        if where is None:
            raise ConfigError(f"unknown setting {flat!r}{source(flat)}")
        section, name = where
        if section:
            per_section[section][name] = coerce(flat, hints(parts[section])[name], value)
        else:
            top[name] = coerce(flat, hints(cls)[name], value)
    for section, changes in per_section.items():
        if changes:
            current = top.get(section, getattr(base, section))
            top[section] = dataclasses.replace(current, **changes)
    return dataclasses.replace(base, **top) if top else base
