"""Fresh virtualenvs with this checkout installed as a user would: the core alone,
``[serve]`` alone, ``[lake]`` alone.

One wheel is built per session from a copy of the checkout (the checkout stays
free of ``build/`` and ``*.egg-info``), without build isolation (no index needed
for the backend); each venv gets it with its extra's dependencies at the tested
versions (``-c constraints.txt``), from pip's cache or the index. The venvs get no pip of their own
(``ensurepip`` took 15 s on a loaded machine): this interpreter's pip installs
into them (``pip --python``), resolving the same way.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PIP_S = 900  # a cold pip cache downloads the wheels (pyspark: 400 MB): bounds a hang only
#: seconds each install took (a test's figures; printed by -s)
INSTALL_S: dict[str, float] = {}


def _copy_tree(dest: Path) -> None:
    files = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "--cached", "--others", "--exclude-standard"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split("\n")
    for name in filter(None, files):
        source = ROOT / name
        if source.is_file() and (name.startswith("pipeline/") or "/" not in name):
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())


def _pip(*args: str) -> None:
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    subprocess.run([sys.executable, "-m", "pip", *args], check=True, env=env, timeout=PIP_S)


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of this checkout (built once a session)."""
    base = tmp_path_factory.mktemp("wheel")
    _copy_tree(base / "src")
    _pip("wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(base), str(base / "src"))
    [built] = base.glob("sluice-*.whl")
    return built


def _venv(tmp_path_factory: pytest.TempPathFactory, wheel: Path, extra: str) -> Path:
    venv = tmp_path_factory.mktemp(extra) / "venv"
    began = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    spec = str(wheel) if extra == "core" else f"sluice[{extra}] @ {wheel.as_uri()}"
    constraints = str(ROOT / "constraints.txt")
    # --no-compile: pip byte-compiles every module it installs (pyspark's, pandas', ...),
    # most of an install's time on a loaded machine; the commands compile what they import.
    python = str(venv / "bin" / "python")
    _pip("--python", python, "install", "-q", "--no-compile", "-c", constraints, spec)
    INSTALL_S[extra] = time.perf_counter() - began
    return venv


@pytest.fixture(scope="session")
def core_venv(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    """A venv with this checkout installed without extras (a wheel, not editable)."""
    return _venv(tmp_path_factory, wheel, "core")


@pytest.fixture(scope="session")
def serve_venv(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    """A venv with ``sluice[serve]`` only."""
    return _venv(tmp_path_factory, wheel, "serve")


@pytest.fixture(scope="session")
def lake_venv(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    """A venv with ``sluice[lake]`` only (it brings ``[serve]``, not ``[demo]``'s rich)."""
    return _venv(tmp_path_factory, wheel, "lake")
