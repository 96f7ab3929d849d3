"""tests/support/signalguard.py: a test that leaves SIGINT ignored does not pass it on.

A scratch suite in a child pytest, in order: a test that ignores SIGINT and
leaves it so, then a test that checks Python's own Ctrl-C handling is back
(what a child process of the worker inherits). With the guard the second passes
and the process's stderr names the first; without it (a conftest that does not
import the fixture) the second fails.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

GUARDED = """
from tests.support.hangwatch import pytest_configure, pytest_unconfigure
from tests.support.signalguard import _signal_handlers_kept
"""
UNGUARDED = """
from tests.support.hangwatch import pytest_configure, pytest_unconfigure
"""

SUITE = """
import signal


def test_a_leaves_ctrl_c_ignored():
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_b_has_ctrl_c_handled():
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
"""


def _run(tmp_path: Path, conftest: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(conftest)
    (tmp_path / "test_scratch.py").write_text(SUITE)
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nasyncio_default_fixture_loop_scope = function\n"
    )
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", "-q",
         str(tmp_path)],
        cwd=tmp_path, check=False, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_a_signal_left_ignored_is_put_back_and_named(tmp_path: Path) -> None:
    run = _run(tmp_path, GUARDED)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert "signalguard: test_scratch.py::test_a_leaves_ctrl_c_ignored left SIGINT" in out, out


def test_without_the_guard_the_next_test_inherits_it(tmp_path: Path) -> None:
    run = _run(tmp_path, UNGUARDED)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "1 failed, 1 passed" in out, out
