"""Progress of long lake work: the meter's figures, rate lines off a terminal, a bar on one."""

from __future__ import annotations

import io
import logging
import os
import select
import sys

import pytest

from pipeline.lake.progress import BarReporter, LineReporter, Meter, duration, reporter


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_duration() -> None:
    assert [duration(s) for s in (0, 42.4, 75.4, 3725)] == ["0s", "42s", "1m15s", "1h02m"]


def test_meter_line_rate_and_eta() -> None:
    clock = Clock()
    meter = Meter(total=40, step_unit="intervals", item_unit="entries", clock=clock)
    assert meter.eta_s is None
    clock.now += 10
    meter.advance(10, 23_000)
    assert (
        meter.line() == "progress: 10/40 intervals (25%), 23,000 entries, 2,300 entries/s, ETA 30s"
    )
    clock.now += 30
    meter.advance(30, 0)
    assert meter.line().endswith("(100%), 23,000 entries, 575 entries/s, in 40s")
    blocks = Meter(total=0, step_unit="blocks", item_unit="blocks", clock=clock)
    assert blocks.line() == "progress: 0/0 blocks, 0 blocks/s, in 0s"


def test_line_reporter_logs_at_most_every_period_and_once_at_the_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    shown = LineReporter(
        Meter(total=5, step_unit="intervals", item_unit="entries", clock=clock), 5.0
    )
    with caplog.at_level(logging.INFO, logger="pipeline.lake.job"):
        for _ in range(4):
            clock.now += 2
            shown.advance(1, 10)
        shown.advance(1, 10)
        shown.close()
    lines = [r.getMessage() for r in caplog.records]
    # t=6 (one line due), then none until the end, then the final one
    assert lines == [
        "progress: 3/5 intervals (60%), 30 entries, 5 entries/s, ETA 4s",
        "progress: 5/5 intervals (100%), 50 entries, 6 entries/s, in 8s",
    ]


def _drain(fd: int) -> bytes:
    """All a pty holds: one read returns one chunk (CI once saw only the bar's first frame)."""
    chunks = []
    while select.select([fd], [], [], 0.5)[0]:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def test_reporter_picks_lines_off_a_terminal_and_a_bar_on_one() -> None:
    assert isinstance(reporter("x", 3, "intervals", "entries", stream=io.StringIO()), LineReporter)
    primary, secondary = os.openpty()
    try:
        with os.fdopen(secondary, "w", buffering=1, closefd=False) as tty:
            shown = reporter("backfill c", 3, "intervals", "entries", stream=tty)
            assert isinstance(shown, BarReporter)
            shown.advance(1, 500)
            shown.advance(2, 500)
            shown.close()
        screen = _drain(primary).decode(errors="replace")
    finally:
        os.close(primary)
        os.close(secondary)
    assert "backfill c" in screen and "3/3" in screen and "1,000 entries" in screen


def test_a_terminal_without_rich_gets_rate_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    """rich comes with [demo] only: a [lake] install on a terminal logs rate lines."""
    monkeypatch.setitem(sys.modules, "rich", None)  # find_spec("rich") is then None
    shown = reporter("backfill c", 3, "intervals", "entries", stream=io.StringIO(), tty=True)
    assert isinstance(shown, LineReporter)
