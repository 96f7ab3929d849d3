"""Print constraints.txt: the installed version of every package Sluice needs, the tested set.

    .venv/bin/python scripts/constraints.py > constraints.txt

pyproject.toml says which versions Sluice works with (ranges); constraints.txt
says which ones its tests ran on: ``make install`` installs with
``-c constraints.txt``. The set is what this interpreter has installed of what
pyproject.toml's core and extras ``all``, ``dev`` and ``bench`` require, and of
everything those require, transitively (markers evaluated here), without Sluice
itself. tests/unit/test_constraints.py fails
while the file and the venv differ.
"""

from __future__ import annotations

import importlib.metadata as md
import sys
import tomllib
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
PROJECT = "sluice"
EXTRAS = ("all", "dev", "bench")
HEADER = """\
# The tested set: the versions `make install` and `make test` install (pip -c), each
# inside pyproject.toml's ranges. Generated from the venv the tests ran in:
#   .venv/bin/python scripts/constraints.py > constraints.txt
"""


def _roots(project: dict[str, Any], extras: tuple[str, ...]) -> list[Requirement]:
    """The requirements pyproject.toml declares for the core and ``extras`` (its own
    ``sluice[...]`` expanded)."""
    out = [Requirement(line) for line in project.get("dependencies", [])]
    todo, done = list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in done:
            continue
        done.add(extra)
        for line in project["optional-dependencies"][extra]:
            req = Requirement(line)
            if canonicalize_name(req.name) == PROJECT:
                todo += sorted(req.extras)
            else:
                out.append(req)
    return out


def closure(pyproject: Path = PYPROJECT, extras: tuple[str, ...] = EXTRAS) -> dict[str, str]:
    """Canonical name -> ``Name==version`` of every installed distribution that
    pyproject.toml's core and ``extras`` need, transitively (not Sluice itself)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    pins: dict[str, str] = {}
    seen: set[tuple[str, str]] = set()
    todo: list[tuple[str, str]] = []
    for req in _roots(project, extras):
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            todo += [(canonicalize_name(req.name), e) for e in ("", *sorted(req.extras))]
    while todo:
        name, extra = todo.pop()
        if (name, extra) in seen:
            continue
        seen.add((name, extra))
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            raise SystemExit(f"constraints: {name} is needed but not installed") from None
        pins[name] = f"{dist.metadata['Name']}=={dist.version}"
        for line in dist.requires or ():
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({"extra": extra}):
                continue
            child = canonicalize_name(req.name)
            todo += [(child, e) for e in ("", *sorted(req.extras))]
    return pins


def main() -> int:
    pins = closure()
    sys.stdout.write(HEADER + "".join(f"{pins[name]}\n" for name in sorted(pins)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
