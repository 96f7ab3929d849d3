"""The unit tests mirror the package: each module has ``tests/unit/<its path>/test_<name>.py``.

A module tested elsewhere is listed in ``tests/unit/mirror.txt`` with where:
the test files that import it (unit or integration), or the module through
which its tests reach it. The list is checked both ways: every module is
mirrored or listed, every listed module exists and has no mirror yet, and
every place a line names does import the module it is listed for.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LISTED = Path(__file__).with_name("mirror.txt")


def _modules() -> list[str]:
    return sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "pipeline").rglob("*.py")
        if p.name != "__init__.py"
    )


def _mirror(module: str) -> Path:
    rel = Path(module).relative_to("pipeline")
    return ROOT / "tests" / "unit" / rel.parent / f"test_{rel.name}"


def _listed() -> dict[str, str]:
    out: dict[str, str] = {}
    for line in LISTED.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            module, _, reason = line.partition(": ")
            assert reason.strip(), f"{module}: listed without a reason"
            out[module.strip()] = reason.strip()
    return out


def _dotted(module: str) -> str:
    return module.removesuffix(".py").replace("/", ".")


def _imports(path: Path, dotted: str) -> bool:
    """Whether ``path`` imports module ``dotted`` (as itself, from its package, or a name of it)."""
    package, _, name = dotted.rpartition(".")
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import) and any(a.name == dotted for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            if node.module == dotted:
                return True
            if node.module == package and any(a.name == name for a in node.names):
                return True
        if isinstance(node, ast.Constant) and node.value == dotted:
            return True  # named for importlib, a subprocess's -m, or monkeypatch
    return False


def test_every_module_is_mirrored_or_listed() -> None:
    listed = _listed()
    missing = [m for m in _modules() if not _mirror(m).exists() and m not in listed]
    assert missing == [], "add tests/unit/<path>/test_<name>.py or a line in mirror.txt"


def test_the_list_holds_only_modules_without_a_mirror() -> None:
    modules = set(_modules())
    stale = [m for m in _listed() if m not in modules or _mirror(m).exists()]
    assert stale == []


def test_every_place_a_line_names_imports_its_module() -> None:
    wrong = []
    for module, reason in _listed().items():
        for named in re.findall(r"(?:tests|pipeline)/[\w/]+\.py", reason):
            path = ROOT / named
            if not path.exists() or not _imports(path, _dotted(module)):
                wrong.append(f"{module}: {named}")
    assert wrong == []
