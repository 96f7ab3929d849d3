"""Lazy facades, and the one-line answer when a name or command needs an extra not installed."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from pipeline.errors import ConfigError, MissingExtra
from pipeline.facade import EXTRA_OF, lazy, missing_extra, require

ROOT = Path(__file__).resolve().parents[2]
#: extras of pyproject.toml that are not the runtime's (no module of them is looked for)
NOT_RUNTIME = {"all", "bench", "dev"}


def _name(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()  # PEP 503


def _extras() -> dict[str, set[str]]:
    """Each extra -> the distributions it lists itself (not through ``sluice[...]``)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {
        extra: {
            _name(re.split(r"[\[<>=!~;\s]", req, maxsplit=1)[0])
            for req in reqs
            if not req.startswith("sluice")
        }
        for extra, reqs in project["optional-dependencies"].items()
        if extra not in NOT_RUNTIME
    }


def test_extra_of_names_each_extras_packages_and_only_theirs() -> None:
    """A package added to an extra, or moved, fails here until EXTRA_OF says so."""
    extras = _extras()
    dists_of = importlib.metadata.packages_distributions()  # this venv has every extra
    modules_of: dict[str, set[str]] = {}
    for module, dists in dists_of.items():
        for dist in dists:
            modules_of.setdefault(_name(dist), set()).add(module)
    for module, extra in EXTRA_OF.items():
        assert {_name(d) for d in dists_of[module]} & extras[extra], (module, extra)
    for extra, dists in extras.items():
        for dist in dists:
            own = modules_of.get(dist) or {  # a meta-package (apache-airflow): its requirements'
                m
                for req in importlib.metadata.requires(dist) or []
                if "extra ==" not in req
                for m in modules_of.get(_name(re.split(r"[\[<>=!~;\s]", req, maxsplit=1)[0]), ())
            }
            assert any(EXTRA_OF.get(m) == extra for m in own), (extra, dist)


def test_a_missing_extras_package_is_one_line_naming_the_pip_install() -> None:
    exc = ModuleNotFoundError("No module named 'pyarrow.lib'", name="pyarrow.lib")
    missing = missing_extra(exc, "sluice lake", "lake")
    assert isinstance(missing, MissingExtra) and isinstance(missing, ImportError)
    assert isinstance(missing, ConfigError)  # sluice answers it with exit 2
    assert str(missing) == (
        "sluice lake needs pyarrow, which is not installed: pip install 'sluice[lake]'"
    )
    assert "sluice[serve]" in str(missing_extra(exc, "x"))  # the smallest extra by default
    assert missing_extra(ModuleNotFoundError("x", name="yaml"), "x") is None  # not an extra's


def test_require_looks_without_importing(monkeypatch: pytest.MonkeyPatch) -> None:
    require("sluice serve", "serve", ("json",))
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # find_spec says: not installed
    with pytest.raises(MissingExtra, match=r"^sluice serve needs pyarrow, .*'sluice\[serve\]'$"):
        require("sluice serve", "serve", ("json", "pyarrow"))


def test_a_facade_name_whose_module_needs_an_extra_raises_one_line() -> None:
    code = (
        "import sys\n"
        "sys.modules['pyarrow'] = None\n"
        "try:\n"
        "    from pipeline.lake import LakeReader\n"
        "except ImportError as exc:\n"
        "    print(type(exc).__name__, exc, exc.__cause__, exc.__suppress_context__, sep='|')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == (
        "MissingExtra|pipeline.lake.LakeReader needs pyarrow, which is not installed: "
        "pip install 'sluice[serve]'|None|True"
    )


def test_other_import_errors_of_a_facade_pass_through() -> None:
    getattr_, _ = lazy("pipeline", {"Nothing": "pipeline.no_such_module"})
    with pytest.raises(ModuleNotFoundError, match="no_such_module"):
        getattr_("Nothing")
    with pytest.raises(AttributeError):
        getattr_("Other")
