"""tests/support/hangwatch.py: a teardown stuck after a timeout ends its process, with its stack.

A scratch suite in a child pytest: a 1 s timeout, a test that runs past it and a
fixture whose teardown then sleeps 60 s. pytest-timeout fails the call and
watches nothing after; without the guard the child sits out the whole sleep
and prints no stack (stop 41's CI run was cut at its limit that way, with no
test named). With it, the child dumps every thread's stack, naming the
fixture's line, and exits within the grace.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CONFTEST = """
from tests.support import hangwatch
from tests.support.hangwatch import (
    pytest_configure,
    pytest_runtest_protocol,
    pytest_runtest_teardown,
    pytest_unconfigure,
)

hangwatch.GRACE_S = 2.0
"""

SUITE = """
import time

import pytest


@pytest.fixture
def stuck():
    yield
    time.sleep(60)  # the teardown that waits for ever


@pytest.mark.timeout(1)
def test_past_its_timeout(stuck):
    time.sleep(60)
"""


def test_a_teardown_stuck_after_a_timeout_ends_the_run_with_its_stack(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_scratch.py").write_text(SUITE)
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nasyncio_default_fixture_loop_scope = function\n"
    )
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(tmp_path)],
        cwd=tmp_path,
        check=False,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=45,  # (a bound on a hang: without the guard the child takes 60 s and more)
    )
    out = run.stdout + run.stderr
    assert run.returncode != 0, out
    assert "Thread 0x" in out and 'test_scratch.py", line 10 in stuck' in out, out
