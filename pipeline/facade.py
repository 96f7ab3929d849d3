"""Lazy public facades (PEP 562): a package names its exports, imported on first use.

A facade such as :mod:`pipeline.bus` declares ``__all__`` and a map of each
name to the module defining it; ``from pipeline.bus import BusClient`` then
imports only ``pipeline.bus.client``, and ``import pipeline.lake`` loads no
pyarrow or deltalake until a name that needs them is used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy"]


def lazy(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of facade ``package`` exporting ``exports``.

    ``exports`` maps each public name to the module that defines it (absolute).
    """

    def __getattr__(name: str) -> Any:
        where = exports.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where), name)
        importlib.import_module(package).__dict__[name] = value  # once: the next lookup is plain
        return value

    def __dir__() -> list[str]:
        return sorted({*importlib.import_module(package).__dict__, *exports})

    return __getattr__, __dir__
