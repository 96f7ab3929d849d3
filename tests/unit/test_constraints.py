"""Packaging that coexists: pyproject.toml declares ranges, constraints.txt the tested set.

pyproject.toml pins nothing exactly and caps no Python; constraints.txt pins every
package the project needs (transitively), each inside pyproject's range, and is
what this venv has (scripts/constraints.py regenerates it); every ``pip install``
of the Makefile and of the Dockerfile passes it.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _requirements() -> list[Requirement]:
    lines = [*PROJECT["dependencies"]]
    for reqs in PROJECT["optional-dependencies"].values():
        lines += reqs
    return [Requirement(line) for line in lines]


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and version, f"constraints.txt: not NAME==VERSION: {line!r}"
            pins[canonicalize_name(name)] = version
    return pins


def test_pyproject_pins_nothing_exactly_and_caps_no_python() -> None:
    exact = [str(r) for r in _requirements() if any(s.operator == "==" for s in r.specifier)]
    assert exact == []
    python = SpecifierSet(PROJECT["requires-python"])
    assert [s.operator for s in python] == [">="], python


def test_every_pin_is_inside_pyprojects_range() -> None:
    pins = _pins()
    assert "sluice" not in pins
    for req in _requirements():
        name = canonicalize_name(req.name)
        if name == "sluice":
            continue
        assert name in pins, f"{req.name} is not in constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"constraints.txt has {req.name}=={pins[name]}, outside pyproject's {req}"
        )


def test_constraints_are_what_this_venv_has() -> None:
    """The tested set is the set the tests run on: a package added, moved or upgraded
    without constraints.txt following fails here. ``make install`` installs ``.[all,dev]``
    (the ``bench`` extra only comes with ``make bench``): the venv's closure of those is
    checked against constraints.txt, and all of it when ``bench`` is installed too."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "constraints", ROOT / "scripts" / "constraints.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    pinned = {line for line in (ROOT / "constraints.txt").read_text().splitlines() if "==" in line}
    try:
        pins = module.closure()
    except SystemExit:  # the bench extra is not installed (make bench installs it)
        pins = module.closure(extras=("all", "dev"))
    missing = sorted(set(pins.values()) - pinned)
    assert not missing, (
        f"{len(missing)} installed versions not in constraints.txt, first {missing[:5]}:"
        " .venv/bin/python scripts/constraints.py > constraints.txt"
    )


def test_every_pip_install_uses_the_constraints() -> None:
    installs = [
        line
        for path in ("Makefile", "docker/Dockerfile")
        for line in (ROOT / path).read_text().splitlines()
        if re.search(r"pip install (?!of ).*\.\[", line)
    ]
    assert len(installs) >= 3, installs
    for line in installs:
        assert "-c constraints.txt" in line, line
