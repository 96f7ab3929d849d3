"""Import contracts of the chain part: no Spark under the server, no I/O in the pure modules.

- No pyspark is reachable from ``pipeline/chain/`` or ``pipeline/lake/storage/reader.py``:
  every import (also those inside functions, which run later) is followed
  through ``pipeline`` modules, and none may import pyspark. The server reads
  the lake without a JVM.
- The pure chain modules (codecs, fork choice, planning) are imported in a
  fresh interpreter and must not pull in asyncio, redis or aiohttp, directly
  or through anything they import; the planning module not pyarrow either.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PURE = [
    "pipeline.blockcodec",
    "pipeline.chain.cardinal",
    "pipeline.chain.jsonrpc",
    "pipeline.chain.client.ordered",
    "pipeline.chain.planning",
    "pipeline.chain.forkchoice",
    "pipeline.chain.tailindex",
    "pipeline.chain.serve.coverage",
    "pipeline.chain.serve.frames",
]
IO = ("asyncio", "redis", "aiohttp")
#: Extra libraries a pure module must not load (planning names pyarrow only for typing).
EXTRA = {"pipeline.chain.planning": ("pyarrow",), "pipeline.chain.serve.frames": ("pyarrow",)}


def _loaded(module: str, names: tuple[str, ...]) -> list[str]:
    code = f"import sys, {module}\nprint(','.join(n for n in {names!r} if n in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return [n for n in out.stdout.strip().split(",") if n]


@pytest.mark.parametrize("module", PURE)
def test_pure_chain_module_imports_no_io_library(module: str) -> None:
    names = IO + EXTRA.get(module, ())
    assert _loaded(module, names) == [], f"{module} imports {_loaded(module, names)}"


def _module_file(name: str) -> Path | None:
    base = ROOT / Path(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _imports(path: Path) -> set[str]:
    """Every module ``path`` may import, at any depth of its code (top level or in functions)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            # ``from pipeline.chain import status`` imports a submodule
            out.update(f"{node.module}.{alias.name}" for alias in node.names)
    return out


def _reaching(roots: list[Path], forbidden: str) -> dict[str, str]:
    """{module that imports ``forbidden``: the path of imports from a root that reaches it}."""
    seen: dict[Path, str] = {p: str(p.relative_to(ROOT)) for p in roots}
    todo = list(roots)
    found: dict[str, str] = {}
    while todo:
        path = todo.pop()
        for name in _imports(path):
            top = name.split(".")[0]
            if top == forbidden:
                found[str(path.relative_to(ROOT))] = seen[path]
            elif top == "pipeline":
                target = _module_file(name)
                if target is not None and target not in seen:
                    seen[target] = f"{seen[path]} -> {name}"
                    todo.append(target)
    return found


def _chain_roots() -> list[Path]:
    return [
        *sorted((ROOT / "pipeline" / "chain").rglob("*.py")),
        ROOT / "pipeline/lake/storage/reader.py",
    ]


def test_no_pyspark_reachable_from_chain_or_the_lake_reader() -> None:
    assert _reaching(_chain_roots(), "pyspark") == {}


def test_the_reachability_walk_finds_spark_where_it_is() -> None:
    """The walk above can fail: from the lake's Spark session it finds pyspark."""
    assert _reaching([ROOT / "pipeline/lake/spark/session.py"], "pyspark")


def test_importing_all_of_chain_starts_no_spark() -> None:
    modules = [
        ".".join(p.relative_to(ROOT).with_suffix("").parts)
        for p in _chain_roots()[:-1]
        if p.stem != "__init__"
    ]
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in modules)
        + "import pipeline.lake.storage.reader\n"
    )
    code += "print('pyspark' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


def test_chain_uses_only_public_aiohttp_names() -> None:
    """No private aiohttp module or attribute under pipeline/chain (an upgrade cannot break serve)."""
    private = {"_drain_helper", "writing_paused", "_writer", "_paused", "_payload_writer"}
    for path in sorted((ROOT / "pipeline" / "chain").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("aiohttp"):
                assert not any(part.startswith("_") for part in node.module.split(".")), path.name
                assert node.module in ("aiohttp", "aiohttp.web"), f"{path.name}: {node.module}"
            if isinstance(node, ast.Attribute):
                assert node.attr not in private, f"{path.name}: .{node.attr}"
