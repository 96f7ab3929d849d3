"""The suite's last guard against a hang: a test stuck past its timeout ends its process.

pytest-timeout (signal method) fails a test that runs past its ``timeout``, but
nothing watches what follows: a teardown that waits for ever after that failure
(an event loop's tasks cancelled at the loop fixture's teardown, a server that
waits for a peer nobody closes) holds its xdist worker, the run never ends and
CI is cut at its limit with no word of which test it was. pytest's own
faulthandler timeout does not help either: it is cancelled at the first
failure, exactly then.

So each test gets :func:`faulthandler.dump_traceback_later` (a C thread: it
fires even while the main thread holds the GIL in a blocking call) of its
timeout plus :data:`GRACE_S`, armed again with :data:`GRACE_S` when its
teardown starts (neither for a test whose timeout is off, 0). When it fires,
every thread's stack goes to the real stderr and the process exits: xdist
reports the test as crashed, starts another worker and the run goes on.
"""

from __future__ import annotations

import faulthandler
import os
import sys
from collections.abc import Generator
from typing import Any

import pytest

#: Seconds a test may run past its own timeout, and a teardown in all, before its
#: process dumps its stacks and exits (Spark's or a cluster's teardown takes well under it).
GRACE_S = 240.0

_STDERR = pytest.StashKey[int]()


def configure(config: pytest.Config) -> None:
    """Keep a copy of the process's stderr (output capture replaces fd 2 during tests)."""
    stream = sys.__stderr__
    if stream is not None:
        config.stash[_STDERR] = os.dup(stream.fileno())


def unconfigure(config: pytest.Config) -> None:
    fd = config.stash.get(_STDERR, None)
    if fd is not None:
        faulthandler.cancel_dump_traceback_later()
        os.close(fd)
        del config.stash[_STDERR]


def _timeout(item: pytest.Item) -> float:
    marker = item.get_closest_marker("timeout")
    if marker is not None and marker.args:
        return float(marker.args[0])
    return float(item.config.getini("timeout") or 0)


def arm(item: pytest.Item, seconds: float) -> None:
    """Dump every thread's stack and exit unless :func:`disarm` comes within ``seconds``."""
    fd = item.config.stash.get(_STDERR, None)
    if fd is not None:
        faulthandler.dump_traceback_later(seconds, exit=True, file=fd)


def arm_test(item: pytest.Item) -> None:
    """The whole test: its timeout plus the grace (nothing for a test whose timeout is off)."""
    timeout = _timeout(item)
    if timeout > 0:
        arm(item, timeout + GRACE_S)


def arm_teardown(item: pytest.Item) -> None:
    """The teardown: the grace (nothing for a test whose timeout is off)."""
    if _timeout(item) > 0:
        arm(item, GRACE_S)


def disarm() -> None:
    faulthandler.cancel_dump_traceback_later()


# The hooks: a conftest imports them (found there by name), tests/conftest.py for the suite.


def pytest_configure(config: pytest.Config) -> None:
    configure(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    unconfigure(config)


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, Any, Any]:
    """A test stuck past its timeout ends its process, with every stack."""
    arm_test(item)
    try:
        return (yield)
    finally:
        disarm()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_teardown(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, Any, Any]:
    # armed again: a failed call (a timeout's) has pytest's faulthandler cancel the watch
    arm_teardown(item)
    return (yield)


__all__ = [
    "GRACE_S",
    "arm",
    "arm_teardown",
    "arm_test",
    "configure",
    "disarm",
    "pytest_configure",
    "pytest_runtest_protocol",
    "pytest_runtest_teardown",
    "pytest_unconfigure",
    "unconfigure",
]
