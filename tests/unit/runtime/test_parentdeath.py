"""A child started through bound_to_parent gets SIGTERM when its starter dies (no preexec_fn)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.poll import until_sync

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG")

#: The starter: launches `sleep` bound to itself, prints the child's pid, waits.
STARTER = """\
import subprocess, sys, time
from pipeline.runtime.parentdeath import bound_to_parent
child = subprocess.Popen(bound_to_parent(["sleep", "600"]))
print(child.pid, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    """Running (not a zombie waiting for init to reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_the_child_runs_the_command_in_its_own_pid_and_dies_with_its_starter() -> None:
    root = Path(__file__).resolve().parents[3]
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER], stdout=subprocess.PIPE, text=True, cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )  # fmt: skip
    try:
        assert starter.stdout is not None
        pid = int(starter.stdout.readline())
        # the launcher replaced itself with the command: same pid, sleep's command line
        until_sync(
            lambda: Path(f"/proc/{pid}/cmdline").read_bytes() == b"sleep\x00600\x00",
            "the launcher execs the command",
            within_s=60,
        )
        starter.send_signal(signal.SIGKILL)  # no cleanup of its own: only the kernel acts
        starter.wait(30)
        until_sync(lambda: not _alive(pid), "the child's SIGTERM when its parent died", within_s=60)
    finally:
        starter.kill()
        starter.wait(30)
        if starter.stdout is not None:
            starter.stdout.close()
