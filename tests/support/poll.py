"""Wait for a condition with a deadline instead of asserting after a fixed sleep.

A fixed sleep is either too short on a loaded machine (the test flakes) or
too long everywhere (the suite crawls), and an assertion of "not yet" after
it can pass without the code ever getting there. ``until`` polls the
condition and fails with ``what`` when the deadline passes; it returns the
condition's (truthy) value so the caller can assert on it. This is the one
poller of the tests: a directory's own "wait until" helper should be a call
of it (add what a caller needs here).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

#: Default deadline: generous, because 2 cores are shared by many test processes.
WITHIN_S = 10.0


async def until(
    cond: Callable[[], T | Awaitable[T]],
    what: str | None = None,
    *,
    within_s: float = WITHIN_S,
    every_s: float = 0.01,
    accept: Callable[[T], object] | None = None,
    detail: Callable[[], object] | None = None,
) -> T:
    """Poll ``cond`` (sync or async) until its value is truthy; return that value.

    ``accept(value)``, when given, decides instead of the value's truth (for a
    read whose value the failure should show, such as a JSON document). After
    ``within_s`` it raises ``AssertionError`` naming ``what`` (default: the
    condition's source), the last value and ``detail()`` (a process's output,
    say) if given.
    """
    deadline = time.monotonic() + within_s
    while True:
        value = cond()
        if inspect.isawaitable(value):
            value = await value
        if _done(value, accept):
            return value  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise _timed_out(cond, what, within_s, value, detail)
        await asyncio.sleep(every_s)


def until_sync(
    cond: Callable[[], T],
    what: str | None = None,
    *,
    within_s: float = WITHIN_S,
    every_s: float = 0.01,
    accept: Callable[[T], object] | None = None,
    detail: Callable[[], object] | None = None,
) -> T:
    """The blocking form of :func:`until`, for tests without an event loop."""
    deadline = time.monotonic() + within_s
    while True:
        value = cond()
        if _done(value, accept):
            return value
        if time.monotonic() > deadline:
            raise _timed_out(cond, what, within_s, value, detail)
        time.sleep(every_s)


def _done(value: Any, accept: Callable[[Any], object] | None) -> bool:
    return bool(accept(value) if accept is not None else value)


def _timed_out(
    cond: Callable[..., object],
    what: str | None,
    within_s: float,
    value: object,
    detail: Callable[[], object] | None,
) -> AssertionError:
    text = f"not within {within_s}s: {what or _describe(cond)} (last value {value!r})"
    if detail is not None:
        text += f"\n{detail()}"
    return AssertionError(text)


def _describe(cond: Callable[..., object]) -> str:
    """The condition as a reader knows it: a lambda's source line, else its name."""
    name = getattr(cond, "__qualname__", repr(cond))
    if name.endswith("<lambda>"):
        try:
            return inspect.getsource(cond).strip()
        except (OSError, TypeError):
            pass
    return name


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
