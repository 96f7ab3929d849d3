"""The declared Python API: facades with ``__all__``, every export documented,
importing lazily, ``py.typed`` shipped, and the README and docs importing only these names."""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support.docblocks import PYTHON, checked_blocks

ROOT = Path(__file__).resolve().parents[3]

FACADES = (
    "pipeline",
    "pipeline.routing",
    "pipeline.streams",
    "pipeline.bus",
    "pipeline.dialogue",
    "pipeline.chain",
    "pipeline.lake",
)


def exports() -> list[tuple[str, str]]:
    return [
        (facade, name) for facade in FACADES for name in importlib.import_module(facade).__all__
    ]


@pytest.mark.parametrize("facade", FACADES)
def test_every_facade_declares_all(facade: str) -> None:
    module = importlib.import_module(facade)
    assert module.__doc__ and module.__doc__.strip()
    names = module.__all__
    assert names, f"{facade} exports nothing"
    assert len(set(names)) == len(names)
    assert set(names) <= set(dir(module))


@pytest.mark.parametrize(("facade", "name"), exports())
def test_every_export_has_its_own_docstring(facade: str, name: str) -> None:
    value = getattr(importlib.import_module(facade), name)
    if isinstance(value, str):  # __version__
        return
    doc = value.__dict__.get("__doc__") if inspect.isclass(value) else value.__doc__
    assert doc and doc.strip(), f"{facade}.{name} has no docstring"
    # a dataclass or NamedTuple without one gets its signature: not a docstring
    assert not doc.startswith(f"{name}("), f"{facade}.{name} has only a generated docstring"


LONG_LIVED = (
    ("pipeline.bus", "BusClient", "close"),
    ("pipeline.bus", "BusServer", "close"),
    ("pipeline.dialogue", "DialogueServer", "close"),
    ("pipeline.dialogue", "Connection", "close"),
    ("pipeline.routing", "Node", "stop"),
)


@pytest.mark.parametrize(("facade", "name", "closer"), LONG_LIVED)
def test_long_lived_objects_are_async_context_managers(facade: str, name: str, closer: str) -> None:
    cls = getattr(importlib.import_module(facade), name)
    assert inspect.iscoroutinefunction(cls.__aenter__)
    assert inspect.iscoroutinefunction(cls.__aexit__)
    assert inspect.iscoroutinefunction(getattr(cls, closer))


def _imports_after(code: str) -> set[str]:
    """Modules imported by running ``code`` in a fresh interpreter (and nothing else)."""
    probe = (
        "import sys; before = set(sys.modules)\n"
        f"{code}\n"
        "print('\\n'.join(sorted(set(sys.modules) - before)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return set(out.stdout.split())


HEAVY = ("pyarrow", "deltalake", "pyspark", "pandas", "rich")


@pytest.mark.parametrize("facade", FACADES)
def test_importing_a_facade_loads_nothing_heavy(facade: str) -> None:
    loaded = _imports_after(f"import {facade}")
    assert not {m.split(".")[0] for m in loaded} & set(HEAVY)


def test_facades_import_lazily() -> None:
    """``from pipeline.bus import BusClient`` loads the client, not the bus's server."""
    loaded = _imports_after("from pipeline.bus import BusClient")
    assert "pipeline.bus.client" in loaded
    assert "pipeline.bus.server" not in loaded
    assert "pipeline.lake.storage.reader" not in _imports_after("import pipeline.lake")


def test_core_names_load_no_heavy_package() -> None:
    code = (
        "from pipeline.bus import BusClient, BusServer\n"
        "from pipeline.dialogue import Connection, DialogueServer\n"
        "from pipeline.routing import Node\n"
        "from pipeline.streams import StreamClient, StreamService, StreamTransport\n"
        "from pipeline.chain import subscribe\n"
        "from pipeline import Settings, SluiceError"
    )
    assert not {m.split(".")[0] for m in _imports_after(code)} & set(HEAVY)


def test_py_typed_is_shipped() -> None:
    assert (ROOT / "pipeline" / "py.typed").is_file()
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package_data = config["tool"]["setuptools"]["package-data"]
    assert "py.typed" in package_data.get("pipeline", [])


def _readme_imports() -> list[tuple[str, str]]:
    """``(module, name)`` of every ``from X import Y`` / ``import X`` in the Python of the
    README and of the documentation pages."""
    found: list[tuple[str, str]] = []
    for block in checked_blocks():
        if block.lang not in PYTHON:
            continue
        for node in ast.walk(ast.parse(block.code)):
            if isinstance(node, ast.ImportFrom) and node.module:
                found += [(node.module, alias.name) for alias in node.names]
            elif isinstance(node, ast.Import):
                found += [(alias.name, "") for alias in node.names]
    return found


def test_the_readme_imports_only_declared_names() -> None:
    imports = _readme_imports()
    assert any(module.startswith("pipeline") for module, _ in imports)
    for module, name in imports:
        if module.split(".")[0] != "pipeline":
            continue
        assert module in FACADES, f"the docs import from {module}, not a facade"
        if name:
            assert name in importlib.import_module(module).__all__, f"{module}.{name}"
