"""When a Dialogue connection's next read must have returned (no I/O, no clock of its own).

A peer gets ``first_frame_timeout`` to complete its first frame,
``frame_timeout`` for any frame once its first byte arrived (a header
announcing 1 MiB followed by a trickle is cut here), and the connection is
closed politely after ``idle_timeout`` without a byte either way (the owner
re-checks that nothing is outstanding when it passes). Time the reader spends
paused by its own backpressure is not the peer's: :meth:`ReadClock.resumed`
moves the clocks past it. Times are the owner's loop time.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Overdue(enum.Enum):
    """Which read deadline passed (the value is the text of the close reason)."""

    NO_FIRST_FRAME = "no first frame"
    FRAME_TOO_SLOW = "frame too slow"
    IDLE = "idle"


@dataclass(slots=True, kw_only=True)
class ReadClock:
    first_frame_timeout: float | None = None
    frame_timeout: float | None = None
    idle_timeout: float | None = None
    started_at: float
    #: The last byte read or written (or the end of a pause of our own).
    last_activity: float = field(init=False)
    #: When the frame being received started (None between frames).
    frame_started: float | None = None
    #: The idle close was started: the idle deadline no longer applies.
    idle_closing: bool = False

    def __post_init__(self) -> None:
        self.last_activity = self.started_at

    def deadline(self, frames_in: int) -> tuple[float, Overdue] | None:
        """The next read deadline and its kind, or None; ``frames_in``: frames completed so far."""
        if self.first_frame_timeout is not None and not frames_in:
            return self.started_at + self.first_frame_timeout, Overdue.NO_FIRST_FRAME
        if self.frame_timeout is not None and self.frame_started is not None:
            return self.frame_started + self.frame_timeout, Overdue.FRAME_TOO_SLOW
        if self.idle_timeout is not None and not self.idle_closing:
            return self.last_activity + self.idle_timeout, Overdue.IDLE
        return None

    def resumed(self, now: float) -> None:
        """The reader resumes after a pause of our own backpressure."""
        self.last_activity = now
        if self.frame_started is not None:
            self.frame_started = now

    def received(self, now: float, *, completed: bool, buffered: int) -> None:
        """Bytes arrived; ``completed``: they completed a frame; ``buffered``: a partial one is held."""
        self.last_activity = now
        if not buffered:
            self.frame_started = None
        elif self.frame_started is None or completed:
            self.frame_started = now

    def sent(self, now: float) -> None:
        self.last_activity = now
