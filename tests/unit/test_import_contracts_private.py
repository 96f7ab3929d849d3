"""Import contract: no module of pipeline/ uses a private name of another library.

Issue 13: public APIs only, or one adapter module per library holding every
use of its internals (pinned by its own contract test). The scan is static
(AST) and reports ``path:line: expression`` for:

1. a leading-underscore name of a third-party module reached through a name
   an import bound: ``import aiohttp`` then ``aiohttp.x._y``; ``from aiohttp
   import web`` then ``web._z``; ``from redis.asyncio.client import _Foo``;
   ``import pyspark._impl``; ``getattr(web, "_z")``;
2. a leading-underscore attribute that no module of pipeline/ defines
   (``protocol._drain_helper()`` on an object aiohttp handed us): it can only
   belong to a library. Names Python documents with an underscore to keep
   them out of a namespace's way (namedtuple's ``_replace``, ``os._exit``,
   enum's ``_value_``) are public.

"Third-party" is any top-level module that is neither the standard library
(``sys.stdlib_module_names``) nor Sluice's own (pipeline, plugins, dags), so
a new dependency is covered without editing this file. Dunder names
(``aiohttp.__version__``) are public.

Limits: rule 2 cannot tell a library object's ``_name`` from Sluice's own
``_name`` of the same spelling (only types could); a private name reached in
ways an AST cannot follow (built strings, ``vars()``) is not seen.
"""

from __future__ import annotations

import ast
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ROOT / "pipeline"
LOCAL = frozenset({"pipeline", "plugins", "dags", "tests"})

#: Adapter modules allowed to touch a library's internals: path -> why. Keep it short;
#: each must say which library's internals and which test pins them.
ADAPTERS: dict[str, str] = {
    "pipeline/bus/aiohttp_adapter.py": (
        "aiohttp: the low-level server's undocumented connection hooks (connection_made,"
        " connections, force_close) that bound the bus's inbound sockets; pinned by"
        " tests/integration/bus/test_aiohttp_adapter.py"
    ),
}
MAX_ADAPTERS = 4

#: Underscore names that are public API (documented so, to stay out of a namespace's way).
PUBLIC_UNDERSCORE = frozenset(
    {"_replace", "_asdict", "_make", "_fields", "_field_defaults", "_exit", "_generate_next_value_"}
)


def _private(name: str) -> bool:
    if name.startswith("__") and name.endswith("__"):
        return False  # dunder: __version__, __name__
    if len(name) > 2 and name.startswith("_") and name.endswith("_") and name[1] != "_":
        return False  # enum's sunder names: _value_, _missing_
    return name.startswith("_") and name not in PUBLIC_UNDERSCORE


def third_party(module: str) -> bool:
    """True for a module of another library (not the standard library, not Sluice's own)."""
    top = module.split(".")[0]
    return bool(top) and top not in sys.stdlib_module_names and top not in LOCAL


def defined_names(tree: ast.AST) -> set[str]:
    """Every name a module defines or binds: functions, classes, assigned names and attributes,
    parameters, keyword arguments, import aliases and ``__slots__`` entries."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.arg) or isinstance(node, ast.keyword) and node.arg:
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.isidentifier()
            and node.value.startswith("_")
        ):
            names.add(node.value)  # __slots__ = ("_x",), setattr(self, "_x", ...)
    return names


def _import_bindings(tree: ast.AST) -> dict[str, str]:
    """Local name -> the dotted module path (or module.object) an import bound it to."""
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    bound[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return bound


def _chain(node: ast.expr) -> list[str] | None:
    """``a.b.c`` -> ["a", "b", "c"]; None if it is not rooted at a plain name."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


def private_uses(source: str, where: str, defined: set[str]) -> list[str]:
    """``where:line: expression`` for each private use of another library in ``source``.

    ``defined`` holds the names Sluice's own modules define (rule 2 of the module doc).
    """
    tree = ast.parse(textwrap.dedent(source), where)
    bound = _import_bindings(tree)
    hits: list[str] = []

    def hit(node: ast.AST, text: str) -> None:
        hits.append(f"{where}:{getattr(node, 'lineno', 0)}: {text}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if third_party(alias.name) and any(map(_private, alias.name.split("."))):
                    hit(node, f"import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if third_party(node.module):
                for alias in node.names:
                    if any(map(_private, [*node.module.split("."), alias.name])):
                        hit(node, f"from {node.module} import {alias.name}")
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            chain = _chain(node)
            root = bound.get(chain[0]) if chain else None
            if chain and root is not None:
                if not third_party(root):
                    continue  # the standard library's or our own
                if any(map(_private, chain[1:-1])):
                    continue  # reported at the first private part of the chain
                hit(node, ast.unparse(node))
            elif node.attr not in defined:
                hit(node, ast.unparse(node))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)
        ):
            chain = _chain(node.args[0])
            root = bound.get(chain[0]) if chain else None
            if (root is not None and third_party(root)) or (
                root is None and node.args[1].value not in defined
            ):
                hit(node, ast.unparse(node))
    return hits


def _modules() -> list[tuple[str, str]]:
    return [
        (path.relative_to(ROOT).as_posix(), path.read_text())
        for path in sorted(SCANNED.rglob("*.py"))
    ]


def scan_pipeline() -> list[str]:
    """Every private use of another library in pipeline/, the adapters' included."""
    modules = _modules()
    defined: set[str] = set()
    for where, source in modules:
        defined |= defined_names(ast.parse(source, where))
    return [hit for where, source in modules for hit in private_uses(source, where, defined)]


# ------------------------------------------------------------------- contract


def test_no_module_uses_a_private_name_of_another_library_outside_its_adapter() -> None:
    outside = [hit for hit in scan_pipeline() if hit.split(":", 1)[0] not in ADAPTERS]
    assert not outside, (
        "private names of other libraries used outside an adapter module (use the public API,"
        " or move the use into the library's adapter and pin it with a contract test):\n  "
        + "\n  ".join(outside)
    )


def test_the_adapter_allowlist_stays_short_and_real() -> None:
    assert len(ADAPTERS) <= MAX_ADAPTERS, "one adapter per library, and few libraries"
    for path, reason in ADAPTERS.items():
        assert (ROOT / path).is_file(), f"{path}: allowlisted adapter does not exist"
        assert "test" in reason, f"{path}: say which test pins the internals it uses"


def test_the_libraries_sluice_uses_count_as_third_party() -> None:
    for name in (
        "aiohttp",
        "redis",
        "pyspark",
        "deltalake",
        "pyarrow",
        "airflow",
        "websockets",
        "cryptography",
        "msgspec",
        "nacl",
        "re2",
        "msgpack",
    ):
        assert third_party(f"{name}.sub"), name
    for name in ("asyncio", "os", "pipeline.errors", "plugins.x", "dags.y"):
        assert not third_party(name), name


# ---------------------------------------------------------- the scanner itself


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import aiohttp\naiohttp.x._y", ["aiohttp.x._y"]),
        ("from aiohttp import web\nweb._z()", ["web._z"]),
        ("from redis.asyncio.client import _Foo", ["from redis.asyncio.client import _Foo"]),
        ("from redis.asyncio import client as c\nc._Bar", ["c._Bar"]),
        ("import pyspark.sql as ps\nps._jvm", ["ps._jvm"]),
        ("import deltalake._internal", ["import deltalake._internal"]),
        ("from pyarrow._fs import FileSystem", ["from pyarrow._fs import FileSystem"]),
        ("def f():\n    import msgspec\n    return msgspec._core.x", ["msgspec._core"]),
        ("from aiohttp import web\ngetattr(web, '_private')", ["getattr(web, '_private')"]),
        (
            "async def h(request):\n    await request.protocol._drain_helper()",
            ["request.protocol._drain_helper"],
        ),
    ],
)
def test_the_scanner_catches_a_private_use(source: str, expected: list[str]) -> None:
    hits = private_uses(source, "snippet.py", defined_names(ast.parse(source)))
    assert [hit.split(": ", 1)[1] for hit in hits] == expected


@pytest.mark.parametrize(
    "source",
    [
        "import aiohttp\naiohttp.__version__",
        "import aiohttp\naiohttp.web.Application()",
        "import asyncio\nasyncio.base_events._run_until_complete_cb",  # stdlib: not a library's
        "import os\nos._exit(1)",
        "class C:\n    def __init__(self):\n        self._x = 1\n    def f(self, o):\n        return o._x",
        "from typing import NamedTuple\nclass P(NamedTuple):\n    x: int\nP(1)._replace(x=2)",
        "import enum\nclass E(enum.Enum):\n    A = 1\nE.A._value_",
        "from pipeline import errors\nerrors._hidden",  # our own privates are not this test's
    ],
)
def test_the_scanner_passes_public_uses(source: str) -> None:
    assert private_uses(source, "snippet.py", defined_names(ast.parse(source))) == []
