"""The wheel ships the Airflow DAGs and plugins, and the installed package finds them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: What a build reads (a copy, so the build leaves nothing in the checkout).
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "pipeline", "dags", "plugins")


def _build(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(path, src / name, ignore=ignore)
        else:
            shutil.copy2(path, src / name)
    out = tmp_path / "dist"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "-q", "-w", str(out), str(src)],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    [wheel] = out.glob("sluice-*.whl")
    return wheel


def test_the_wheel_carries_dags_and_plugins_where_the_package_finds_them(tmp_path: Path) -> None:
    wheel = _build(tmp_path)
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        z.extractall(tmp_path / "site")
    shipped = {
        f"pipeline/airflow_folders/{folder}/{path.name}"
        for folder in ("dags", "plugins")
        for path in (ROOT / folder).iterdir()
        if path.suffix in (".py", ".html")
    }
    assert "pipeline/airflow_folders/dags/sluice_archive.py" in shipped
    assert "pipeline/airflow_folders/plugins/sluice_coverage.html" in shipped
    assert shipped <= names, sorted(shipped - names)
    assert "pipeline/py.typed" in names
    # the unpacked wheel, imported from elsewhere: folder() names its own copies
    code = "from pipeline import airflow_folder as f; print(f('dags')); print(f('plugins'))"
    found = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "site")}, check=False,
    )  # fmt: skip
    assert found.returncode == 0, found.stderr
    site = tmp_path / "site" / "pipeline" / "airflow_folders"
    assert found.stdout.split() == [str(site / "dags"), str(site / "plugins")]


def test_in_a_checkout_the_folders_are_the_checkouts() -> None:
    from pipeline import airflow_folder

    assert airflow_folder("dags") == ROOT / "dags"
    assert airflow_folder("plugins") == ROOT / "plugins"
