"""A slow read kept fresh in a worker thread: the first read is waited for, later ones are not."""

from __future__ import annotations

import threading

from pipeline.board.source import ERROR_CHARS, Source, one_line
from tests.support.poll import until


def test_one_line_keeps_the_first_line_bounded() -> None:
    assert one_line(ValueError("first\nsecond")) == "first"
    assert one_line(ValueError("")) == "ValueError"
    assert len(one_line(ValueError("x" * 1000))) == ERROR_CHARS


async def test_the_first_read_is_waited_for_then_served_stale_while_refreshing() -> None:
    started, release = threading.Event(), threading.Event()
    values = iter([1, 2])

    def read() -> int:
        if source.reads:  # the second read waits until the test lets it go
            started.set()
            release.wait(10)
        return next(values)

    async def refreshing() -> bool:
        await source.fresh(first_wait_s=10)
        return started.is_set()

    source: Source[int] = Source("numbers", read, ttl_s=0.0, errors=(ValueError,))
    assert source.age_s is None
    await source.fresh(first_wait_s=10)
    assert (source.value, source.error, source.reads) == (1, None, 1)
    assert source.age_s is not None
    await until(refreshing, "a second read started once the first was stale")
    assert source.value == 1  # served while the second read runs
    release.set()
    await source.close()
    assert (source.value, source.reads) == (2, 2)


async def test_a_failed_read_is_one_line_and_a_bug_is_named_not_raised() -> None:
    def known() -> int:
        raise ValueError("the lake is down\ntraceback ...")

    def bug() -> int:
        raise KeyError("x")

    failing: Source[int] = Source("lake", known, ttl_s=60.0, errors=(ValueError,))
    await failing.fresh(first_wait_s=10)
    assert (failing.value, failing.error, failing.reads) == (None, "lake: the lake is down", 1)
    buggy: Source[int] = Source("runs", bug, ttl_s=60.0, errors=(ValueError,))
    await buggy.fresh(first_wait_s=10)
    assert buggy.error == "runs: internal error KeyError"
    await failing.close()
    await buggy.close()
