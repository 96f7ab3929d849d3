"""Modules and functions stay small: none over the sizes docs/DESIGN.md names, unless listed there.

A module past about 450 lines or a function past about 60 usually does two
things; the layout gives it a room of its own instead. ``LONGER`` holds the
exceptions, each with its reason (docs/DESIGN.md repeats them).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULE_LINES = 450
FUNCTION_LINES = 60
#: "path" or "path:function" -> why it stays whole (none today).
LONGER: dict[str, str] = {}


def _files() -> list[Path]:
    return sorted(p for d in ("pipeline", "dags", "plugins") for p in (ROOT / d).rglob("*.py"))


def test_no_module_is_over_its_size() -> None:
    over = [
        f"{p.relative_to(ROOT)}: {n} lines"
        for p in _files()
        if (n := len(p.read_text().splitlines())) > MODULE_LINES
        and str(p.relative_to(ROOT)) not in LONGER
    ]
    assert over == []


def test_no_function_is_over_its_size() -> None:
    over = []
    for p in _files():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                where = f"{p.relative_to(ROOT)}:{node.name}"
                if n > FUNCTION_LINES and where not in LONGER:
                    over.append(f"{where}: {n} lines")
    assert over == []
