"""The machine's deadlines on the event loop: one timer, kept at the next deadline.

The Dialogue machine has no clock; it says when its next deadline is
(:meth:`~pipeline.dialogue.protocol.Dialogue.next_deadline`). A
:class:`DeadlineTimer` keeps one loop timer at that time (:meth:`DeadlineTimer.update`,
after every input to the machine) and, when it fires, lets the machine
expire what is due and calls ``after`` to dispatch what that produced.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from pipeline.dialogue.protocol import Dialogue


class DeadlineTimer:
    """One loop timer at the machine's next deadline (none when it has none)."""

    def __init__(self, proto: Dialogue, after: Callable[[], None]) -> None:
        self._proto = proto
        self._after = after
        self._loop = asyncio.get_running_loop()
        self._handle: asyncio.TimerHandle | None = None
        self._when: float | None = None

    def update(self) -> None:
        """Move the timer to the machine's next deadline, if that changed."""
        proto = self._proto
        if proto.has_deadlines or self._handle is not None:
            when = proto.next_deadline()
            if when != self._when:
                if self._handle is not None:
                    self._handle.cancel()
                self._handle = None if when is None else self._loop.call_at(when, self._fire)
                self._when = when

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()

    def _fire(self) -> None:
        self._handle = None
        self._when = None
        self._proto.expire(self._loop.time())
        self._after()


__all__ = ["DeadlineTimer"]
