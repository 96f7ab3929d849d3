"""Import contracts of Dialogue and the stream protocol: the pure modules do no I/O.

Each module is imported in a fresh interpreter and must not pull in asyncio,
redis or aiohttp, directly or through anything it imports. The state machine
lives in one module: nothing but ``protocol.py`` reads the transition tables.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PURE = [
    "pipeline.dialogue.packets",
    "pipeline.dialogue.protocol",
    "pipeline.dialogue.states",
    "pipeline.dialogue.events",
    "pipeline.dialogue.deadlines",
    "pipeline.dialogue.control",
    "pipeline.dialogue.readclock",
    "pipeline.dialogue.ledger",
    "pipeline.dialogue.limits",
    "pipeline.streams.protocol",
]
IO = ("asyncio", "redis", "aiohttp")


@pytest.mark.parametrize("module", PURE)
def test_pure_module_imports_no_io_library(module: str) -> None:
    code = f"import sys, {module}\nprint(','.join(n for n in {IO!r} if n in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "", f"{module} imports {out.stdout.strip()}"


def _imported_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            names.update(alias.name for alias in node.names)
    return names


def test_only_the_machine_reads_the_transition_tables() -> None:
    tables = {"ON_CLOSE_MESSAGE", "ON_LOCAL_CLOSE", "CAN_START", "CAN_CONTINUE"}
    readers = {
        path.name
        for path in (ROOT / "pipeline" / "dialogue").glob("*.py")
        if path.name != "states.py" and _imported_names(path) & tables
    }
    assert readers == {"protocol.py"}


def test_duplex_and_handler_runner_do_not_import_the_connection() -> None:
    """They use the narrow DuplexHost / RunnerHost interfaces, not Connection's internals."""
    for name in ("duplex.py", "handlers.py"):
        tree = ast.parse((ROOT / "pipeline" / "dialogue" / name).read_text())
        modules = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert "pipeline.dialogue.connection" not in modules, name


def test_no_exception_class_outside_errors_py() -> None:
    """Exceptions of Dialogue and the stream service live in pipeline/errors.py."""
    import pipeline.errors as errors

    names = {name for name, obj in vars(errors).items() if isinstance(obj, type)}
    files = [
        *(ROOT / "pipeline" / "dialogue").glob("*.py"),
        ROOT / "pipeline" / "streams" / "service.py",
        ROOT / "pipeline" / "streams" / "transport.py",
    ]
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {ast.unparse(base).rsplit(".", 1)[-1] for base in node.bases}
                assert not bases & (names | {"Exception", "BaseException"}), (
                    f"{path.name}: {node.name} is an exception class outside errors.py"
                )
