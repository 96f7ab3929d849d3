"""Wait for a condition with a deadline instead of asserting after a fixed sleep.

A fixed sleep is either too short on a loaded machine (the test flakes) or
too long everywhere (the suite crawls), and an assertion of "not yet" after
it can pass without the code ever getting there. ``until`` polls the
condition and fails with ``what`` when the deadline passes; it returns the
condition's (truthy) value so the caller can assert on it.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

#: Default deadline: generous, because 2 cores are shared by many test processes.
WITHIN_S = 10.0


async def until(
    cond: Callable[[], T | Awaitable[T]],
    what: str,
    *,
    within_s: float = WITHIN_S,
    every_s: float = 0.01,
) -> T:
    """Poll ``cond`` (sync or async) until it is truthy; ``AssertionError`` naming ``what`` after ``within_s``."""
    deadline = time.monotonic() + within_s
    while True:
        value = cond()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within_s}s: {what} (last value {value!r})")
        await asyncio.sleep(every_s)


def until_sync(
    cond: Callable[[], T], what: str, *, within_s: float = WITHIN_S, every_s: float = 0.01
) -> T:
    """The blocking form of :func:`until`, for tests without an event loop."""
    deadline = time.monotonic() + within_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within_s}s: {what} (last value {value!r})")
        time.sleep(every_s)


async def settled(read: Callable[[], T], *, quiet_s: float = 0.2, within_s: float = WITHIN_S) -> T:
    """``read()`` once it stopped changing for ``quiet_s`` (a producer that filled a bound and waits).

    For bounds: assert on the settled value, which the code under test had all
    the time it wanted to push past the bound.
    """
    deadline = time.monotonic() + within_s
    last = read()
    since = time.monotonic()
    while True:
        await asyncio.sleep(0.01)
        value = read()
        now = time.monotonic()
        if value != last:
            last, since = value, now
        elif now - since >= quiet_s:
            return value
        if now > deadline:
            raise AssertionError(f"value kept changing for {within_s}s (last {value!r})")
