"""No test leaves the process's SIGINT or SIGTERM handling changed for the tests after it.

A subprocess inherits an ignored signal: with SIGINT ignored in an xdist worker
(left so by something a test ran in it), every child Python starts with Ctrl-C
ignored, and ``test_ctrl_c_in_a_lake_job_exits_130_with_one_line`` waited its
60 s for a job that never saw the signal (a CI run of 2026-11-30; reproduced by
running that test under a parent that ignores SIGINT). The fixture puts back
each test's handlers as they were before it, and says which test changed them
on the process's own stderr (one line: the CI log names the test).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator

import pytest

from tests.support.hangwatch import real_stderr

SIGNALS = (signal.SIGINT, signal.SIGTERM)


@pytest.fixture(autouse=True)
def _signal_handlers_kept(request: pytest.FixtureRequest) -> Iterator[None]:
    before = {sig: signal.getsignal(sig) for sig in SIGNALS}
    yield
    if threading.current_thread() is not threading.main_thread():
        return  # (signal.signal works in the main thread only; pytest runs tests there)
    for sig, handler in before.items():
        now = signal.getsignal(sig)
        if now is handler or handler is None:  # (None: not set from Python, cannot be put back)
            continue
        signal.signal(sig, handler)
        fd = real_stderr(request.config)
        if fd is not None:
            line = f"signalguard: {request.node.nodeid} left {sig.name} at {now!r}; put back\n"
            os.write(fd, line.encode())


__all__ = ["SIGNALS"]
