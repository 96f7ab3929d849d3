"""The read deadlines of a Dialogue connection, on a clock we drive by hand."""

from __future__ import annotations

from pipeline.dialogue.readclock import Overdue, ReadClock


def test_no_timeouts_no_deadline() -> None:
    assert ReadClock(started_at=0.0).deadline(0) is None


def test_first_frame_then_frame_then_idle() -> None:
    clock = ReadClock(first_frame_timeout=10, frame_timeout=30, idle_timeout=60, started_at=5)
    assert clock.deadline(0) == (15, Overdue.NO_FIRST_FRAME)
    clock.received(7, completed=False, buffered=3)  # half a header
    assert clock.deadline(0) == (15, Overdue.NO_FIRST_FRAME)  # still the first frame's
    clock.received(8, completed=True, buffered=0)
    assert clock.deadline(1) == (68, Overdue.IDLE)
    clock.received(9, completed=False, buffered=100)
    assert clock.deadline(1) == (39, Overdue.FRAME_TOO_SLOW)
    clock.received(20, completed=False, buffered=200)  # a trickle does not move it
    assert clock.deadline(1) == (39, Overdue.FRAME_TOO_SLOW)
    clock.received(21, completed=True, buffered=50)  # a new frame started in the same chunk
    assert clock.deadline(2) == (51, Overdue.FRAME_TOO_SLOW)


def test_writes_move_the_idle_deadline_and_idle_closing_stops_it() -> None:
    clock = ReadClock(idle_timeout=60, started_at=0)
    clock.sent(30)
    assert clock.deadline(1) == (90, Overdue.IDLE)
    clock.idle_closing = True
    assert clock.deadline(1) is None


def test_our_own_pause_does_not_count_against_the_peer() -> None:
    clock = ReadClock(frame_timeout=30, idle_timeout=60, started_at=0)
    clock.received(1, completed=False, buffered=10)
    clock.resumed(100)
    assert clock.deadline(1) == (130, Overdue.FRAME_TOO_SLOW)
    clock.received(101, completed=True, buffered=0)
    assert clock.deadline(2) == (161, Overdue.IDLE)
