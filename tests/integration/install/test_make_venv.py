"""``make``'s virtualenv step repairs what an interrupted first ``make`` left.

Creating the venv runs ensurepip last: a Ctrl-C there left a ``.venv`` with an
interpreter but no pip, and every later ``make`` failed on ``python -m pip``.
``scripts/ensure-venv.sh`` (the Makefile's first step) makes such a venv again.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "ensure-venv.sh"


def _pip_works(venv: Path) -> bool:
    probe = [str(venv / "bin" / "python"), "-m", "pip", "--version"]
    return subprocess.run(probe, capture_output=True, check=False, timeout=60).returncode == 0


def test_a_venv_without_pip_is_made_again(tmp_path: Path) -> None:
    venv = tmp_path / ".venv"
    # what the interrupted first make left: the interpreter, no pip
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    assert not _pip_works(venv)
    out = subprocess.run(
        ["bash", str(SCRIPT), sys.executable, str(venv)],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "no working pip" in out.stdout
    assert _pip_works(venv)
    # a sound venv is left alone, silently
    again = subprocess.run(
        ["bash", str(SCRIPT), sys.executable, str(venv)],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert (again.returncode, again.stdout) == (0, "")
