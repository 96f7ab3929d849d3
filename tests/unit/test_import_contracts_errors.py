"""Import contract of the exception tree: every exception class lives in pipeline/errors.py.

The scan is static (AST), so it also covers ``dags/`` and ``plugins/``
without importing Airflow. A class counts as an exception when one of its
bases is a builtin exception, a class of ``pipeline.errors``, a name ending in
``Error``/``Exception``/``Warning`` (a library's exception), or another
exception class found by the scan (followed to a fixed point, so a subclass of
a subclass is caught too). Exceptions used only by tests may stay in tests/.
"""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import pipeline.errors as errors

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("pipeline", "plugins", "dags")
ERRORS_PY = ROOT / "pipeline" / "errors.py"

_BUILTIN_EXCEPTIONS = {
    name
    for name, obj in vars(builtins).items()
    if isinstance(obj, type) and issubclass(obj, BaseException)
}
_TREE = {
    name
    for name, obj in vars(errors).items()
    if isinstance(obj, type) and issubclass(obj, BaseException)
}


def _files() -> list[Path]:
    return sorted(
        path
        for part in SCANNED
        for path in (ROOT / part).rglob("*.py")
        if path != ERRORS_PY and ".venv" not in path.parts
    )


def _classes(source: str, where: str) -> list[tuple[str, str, set[str]]]:
    """(where, class name, last dotted part of each base) for every class in ``source``."""
    out = []
    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, ast.ClassDef):
            bases = {ast.unparse(base).rsplit(".", 1)[-1] for base in node.bases}
            out.append((where, node.name, bases))
    return out


def _looks_like_exception(name: str) -> bool:
    return name in _BUILTIN_EXCEPTIONS or name.endswith(("Error", "Exception", "Warning"))


def _exception_classes(found: list[tuple[str, str, set[str]]]) -> list[str]:
    """``where:Class`` for each exception class of ``found``, subclasses followed to a fixed point."""
    exceptions = set(_TREE) | _BUILTIN_EXCEPTIONS
    hits: set[str] = set()
    changed = True
    while changed:
        changed = False
        for where, name, bases in found:
            key = f"{where}:{name}"
            if key not in hits and (bases & exceptions or any(map(_looks_like_exception, bases))):
                hits.add(key)
                exceptions.add(name)
                changed = True
    return sorted(hits)


def exception_classes_outside_errors() -> list[str]:
    """``path:Class`` for every exception class defined outside errors.py."""
    found = [
        cls
        for path in _files()
        for cls in _classes(path.read_text(), path.relative_to(ROOT).as_posix())
    ]
    return _exception_classes(found)


def test_scan_finds_exception_classes() -> None:
    """The scan can fail: direct, library, builtin and indirect subclasses (defined later) count."""
    source = (
        "class B(A): ...\n"
        "class A(SluiceError): ...\n"
        "class C(pyspark.errors.PySparkException): ...\n"
        "class D(RuntimeError): ...\n"
        "class E: ...\n"
        "class F(E): ...\n"
    )
    assert _exception_classes(_classes(source, "m")) == ["m:A", "m:B", "m:C", "m:D"]


def test_no_exception_class_outside_errors_py() -> None:
    assert exception_classes_outside_errors() == [], (
        "exception classes belong in pipeline/errors.py (derive from SluiceError)"
    )


def test_every_error_derives_from_sluice_error() -> None:
    """The one tree: a caller can catch everything Sluice raises on purpose with one class.

    Other classes bound in errors.py at run time (``typing.Any``...) would also
    read as exception names to the Dialogue contract test, so there are none.
    """
    strays = [
        name
        for name, obj in vars(errors).items()
        if isinstance(obj, type) and not issubclass(obj, errors.SluiceError)
    ]
    assert strays == []
