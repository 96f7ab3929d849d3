"""The package ``pipeline``: each public name written once, one version, real types.

Its ``__all__`` is the one list of its names (``pipeline.facade.lazy_from`` loads
each on first use, type checkers read the list with star imports under
``TYPE_CHECKING``), and ``pipeline.__version__`` is the one version
(pyproject.toml reads it).
"""

from __future__ import annotations

import importlib.metadata
import io
import subprocess
import sys
import tokenize
import tomllib
import types
from collections import Counter
from pathlib import Path

import pytest

import pipeline
from pipeline.errors import MissingExtra
from pipeline.facade import lazy_from

ROOT = Path(__file__).resolve().parents[3]
INIT = ROOT / "pipeline" / "__init__.py"


def test_each_public_name_is_written_once() -> None:
    """Names and strings of the module's code (not its docstring or comments)."""
    words: Counter[str] = Counter()
    tokens = list(tokenize.generate_tokens(io.StringIO(INIT.read_text()).readline))
    for tok in tokens[1:]:  # after the docstring
        if tok.type == tokenize.NAME:
            words[tok.string] += 1
        elif tok.type == tokenize.STRING:
            words[tok.string.strip("\"'")] += 1
    twice = {name: words[name] for name in pipeline.__all__ if words[name] != 1}
    assert twice == {"__version__": 2}  # its assignment and its place in __all__


def test_the_version_has_one_source() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert "version" in project["project"]["dynamic"]
    dynamic = project["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "pipeline.__version__"}
    assert importlib.metadata.version("sluice") == pipeline.__version__


def test_names_load_on_first_use_and_stay() -> None:
    assert pipeline.LockLost.__module__ == "pipeline.errors"
    assert vars(pipeline)["LockLost"] is pipeline.LockLost  # kept: the next lookup is plain
    assert pipeline.airflow_folder.__module__ == "pipeline.airflowfolders"
    with pytest.raises(AttributeError, match="has no attribute 'MissingExtra'"):
        _ = pipeline.MissingExtra  # in pipeline.errors, but not declared
    assert set(pipeline.__all__) <= set(dir(pipeline))


def _facade(
    monkeypatch: pytest.MonkeyPatch, names: list[str], modules: tuple[str, ...]
) -> types.ModuleType:
    package = types.ModuleType("sluice_test_facade")
    package.__getattr__, package.__dir__ = lazy_from(package.__name__, names, modules)
    monkeypatch.setitem(sys.modules, package.__name__, package)
    return package


def test_lazy_from_takes_the_first_module_defining_a_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    facade = _facade(monkeypatch, ["dumps", "sqrt", "nowhere"], ("json", "math"))
    import json
    import math

    assert facade.dumps is json.dumps and facade.sqrt is math.sqrt
    with pytest.raises(AttributeError, match=r"declares 'nowhere', which none of json, math"):
        _ = facade.nowhere
    with pytest.raises(AttributeError, match="has no attribute 'loads'"):
        _ = facade.loads


def test_lazy_from_a_module_of_a_missing_extra_is_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    facade = _facade(monkeypatch, ["Table"], ("pyarrow",))
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if not installed
    with pytest.raises(MissingExtra, match=r"^sluice_test_facade.Table needs pyarrow, .*\[serve\]"):
        _ = facade.Table


USER = """\
from pathlib import Path

from pipeline import LockLost, Settings, airflow_folder

settings: Settings = Settings()
folder: Path = airflow_folder("dags")
error: Exception = LockLost("x")
wrong: int = airflow_folder("plugins")
from pipeline import NotDeclared
"""


def test_a_user_script_type_checks_against_the_declared_names(tmp_path: Path) -> None:
    """Under ``mypy --strict`` the names have their real types (not Any) and a name the
    package does not declare is an error."""
    script = tmp_path / "user.py"
    script.write_text(USER)
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--cache-dir", str(tmp_path / "c"), str(script)],
        cwd=tmp_path, env={"MYPYPATH": str(ROOT), "PATH": ""}, capture_output=True, text=True,
        timeout=240, check=False,
    )  # fmt: skip
    errors = [line.split(": error: ")[1] for line in out.stdout.splitlines() if ": error: " in line]
    assert errors == [
        'Incompatible types in assignment (expression has type "Path", variable has type "int")'
        "  [assignment]",
        'Module "pipeline" has no attribute "NotDeclared"  [attr-defined]',
    ], out.stdout + out.stderr
