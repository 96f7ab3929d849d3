"""SharedHistory: one reader per server, refreshed at most every check_every_s."""

from __future__ import annotations

import pytest

from pipeline.chain.history.lakeview import SharedHistory
from pipeline.errors import LakePathError


class Reader:
    def __init__(self) -> None:
        self.refreshed = 0

    def refresh(self) -> None:
        self.refreshed += 1


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_one_reader_refreshed_at_most_every_interval() -> None:
    opened: list[Reader] = []

    def open_reader() -> Reader:
        opened.append(Reader())
        return opened[-1]

    clock = Clock()
    shared = SharedHistory(open_reader, check_every_s=1.0, clock=clock)
    first = shared()
    assert shared() is first and len(opened) == 1 and opened[0].refreshed == 0
    clock.now += 0.5
    assert shared() is first and opened[0].refreshed == 0
    clock.now += 0.6
    assert shared() is first and opened[0].refreshed == 1
    assert shared() is first and opened[0].refreshed == 1
    shared.refresh()  # forced
    assert opened[0].refreshed == 2 and shared.opened == 1 and shared.refreshes == 2


def test_a_failed_open_is_retried_and_reported() -> None:
    calls = 0

    def open_reader() -> Reader:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise LakePathError("lake down")
        return Reader()

    shared = SharedHistory(open_reader)
    shared.refresh()  # nothing open yet: nothing to do
    with pytest.raises(LakePathError, match="lake down"):
        shared()
    assert shared() is not None and calls == 2


def test_negative_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="check_every_s"):
        SharedHistory(Reader, check_every_s=-1)


def test_fresh_gives_the_reader_only_while_no_refresh_is_due_and_never_waits() -> None:
    clock = Clock()
    reader = Reader()
    shared = SharedHistory(lambda: reader, check_every_s=1.0, clock=clock)
    assert shared.fresh() is None  # not opened yet: the factory must run (in a thread)
    assert shared() is reader
    assert shared.fresh() is reader and reader.refreshed == 0
    clock.now += 1.0
    assert shared.fresh() is None and reader.refreshed == 0  # due: the factory refreshes it
    assert shared() is reader and reader.refreshed == 1
    assert shared.fresh() is reader
    with shared._lock:  # another thread is opening or refreshing: no wait, no answer
        assert shared.fresh() is None
