"""Lazy public facades (PEP 562): a package names its exports, imported on first use.

A facade such as :mod:`pipeline.bus` declares ``__all__`` and a map of each
name to the module defining it; ``from pipeline.bus import BusClient`` then
imports only ``pipeline.bus.client``, and ``import pipeline.lake`` loads no
pyarrow or deltalake until a name that needs them is used. A name whose
module needs an extra that is not installed raises :class:`MissingExtra`, one
line naming ``pip install 'sluice[EXTRA]'`` (:func:`missing_extra`), which
``sluice`` also answers for its commands.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import ModuleType
from typing import Any

from pipeline.errors import MissingExtra

__all__ = ["EXTRA_OF", "lazy", "lazy_from", "missing_extra", "require"]

#: The top-level modules of the extras' packages -> the smallest extra installing each
#: (``[project.optional-dependencies]`` of pyproject.toml; a unit test keeps them equal).
EXTRA_OF: dict[str, str] = {
    "pyarrow": "serve",
    "deltalake": "serve",
    "re2": "serve",
    "pyspark": "lake",
    "pandas": "lake",
    "delta": "lake",
    "croniter": "lake",
    "airflow": "airflow",
    "psycopg2": "airflow",
    "asyncpg": "airflow",
    "celery": "airflow",
    "rich": "demo",
}


_ABSENT = object()


def _needs(what: str, module: str, extra: str) -> MissingExtra:
    return MissingExtra(
        f"{what} needs {module}, which is not installed: pip install 'sluice[{extra}]'"
    )


def missing_extra(
    exc: ModuleNotFoundError, what: str, extra: str | None = None
) -> MissingExtra | None:
    """The one-line error for ``exc`` if an extra's package is what is missing, else None.

    ``what`` names what needs it (a command, a public name); ``extra`` is the extra to
    name (a command's own), by default the smallest one installing the package.
    """
    top = (exc.name or "").partition(".")[0]
    if top not in EXTRA_OF:
        return None
    return _needs(what, top, extra or EXTRA_OF[top])


def require(what: str, extra: str, modules: Iterable[str]) -> None:
    """Raise :class:`MissingExtra` unless each of ``modules`` (top-level names) is installed.

    Looked up without importing them: a check before work starts, not a load."""
    for module in modules:
        if importlib.util.find_spec(module) is None:
            raise _needs(what, module, extra)


def _import(package: str, name: str, module: str) -> ModuleType:
    """``module``, imported for ``package.name``: one line if it needs a missing extra."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = missing_extra(exc, f"{package}.{name}")
        if missing is None:
            raise
        raise missing from None  # one line, not the chain of imports that led there


def _keep(package: str, name: str, value: Any) -> Any:
    importlib.import_module(package).__dict__[name] = value  # once: the next lookup is plain
    return value


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
        return _keep(package, name, getattr(_import(package, name, where), name))

    def __dir__() -> list[str]:
        return sorted({*importlib.import_module(package).__dict__, *exports})

    return __getattr__, __dir__


def lazy_from(
    package: str, names: Sequence[str], modules: Sequence[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of facade ``package`` exporting ``names`` (its
    ``__all__``), each defined by one of ``modules``: the first of them that has it.

    A facade whose names come from a few light modules writes each name once, in a static
    ``__all__`` that type checkers read (with ``from MODULE import *`` under
    ``TYPE_CHECKING`` for the types); a module is imported when one of its names is first used.
    """
    declared = frozenset(names)

    def __getattr__(name: str) -> Any:
        if name not in declared:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        for module in modules:
            found = getattr(_import(package, name, module), name, _ABSENT)
            if found is not _ABSENT:
                return _keep(package, name, found)
        raise AttributeError(
            f"{package}.__all__ declares {name!r}, which none of {', '.join(modules)} defines"
        )

    def __dir__() -> list[str]:
        return sorted({*importlib.import_module(package).__dict__, *declared})

    return __getattr__, __dir__
