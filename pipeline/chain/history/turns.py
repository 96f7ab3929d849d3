"""Turns of event-loop time for catch-ups, so that live delivery never waits behind them.

Theory of operation. Catch-up (decoding lake pages and Redis entries, encoding
them for a subscriber) is CPU work done in the event loop, where the live
tailer and the fan-out also run. Left alone, each catch-up runs until its
subscriber's send buffer is full, and with dozens of them the loop's ready
queue holds dozens of long steps in front of the live tailer's wake-up: a live
subscriber's delay grew to the sum of them (20 s with 48 catch-ups).

A :class:`Turns` is one per server. A catch-up does its CPU work only while
it holds a :class:`Turn`: at most ``slots`` catch-ups hold one at once
(waiters queue in order, :class:`asyncio.Semaphore`); taking a turn first
lets the loop run once (``sleep(0)``: I/O callbacks, the live tailer, the
writers), and a holder gives it back as soon as it has worked ``slice_s``
(:meth:`Turn.over`). A turn is never held across a wait for the subscriber
(its send buffer); it is held across a read of a page of the Redis tail (a
bounded call whose reply is parsed in the caller's step: 16 catch-ups parsing
1,000-entry pages in one loop iteration were most of the seconds of delay).
So the live path waits about ``slots * slice_s`` plus one page for
catch-ups, however many there are; their total throughput is unchanged (the
loop is busy either way).
"""

from __future__ import annotations

import asyncio
import time

#: Catch-ups working at once, and how long one works before it lets the loop run.
SLOTS = 1
SLICE_S = 0.005


class Turns:
    """The server's catch-up turns (see the module doc)."""

    def __init__(self, slots: int = SLOTS, slice_s: float = SLICE_S) -> None:
        if slots < 1 or slice_s <= 0:
            raise ValueError("slots and slice_s must be positive")
        self.slice_s = slice_s
        self._sem = asyncio.Semaphore(slots)
        #: Turns given out (for tests and the bench: catch-ups really took turns).
        self.taken = 0

    async def take(self) -> Turn:
        """Wait for a turn; the caller must :meth:`Turn.release` it (``async with`` does)."""
        turn = Turn(self)
        await turn.acquire()
        return turn


class Turn:
    """One catch-up's hold on the loop: check :meth:`over`, :meth:`next` when it is."""

    __slots__ = ("_start", "_turns", "held")

    def __init__(self, turns: Turns) -> None:
        self._turns = turns
        self._start = 0.0
        self.held = False

    async def acquire(self) -> None:
        """Let the loop run once, then wait for the turn.

        The loop runs even when no other catch-up waits: a catch-up whose
        subscriber has room would otherwise go from turn to turn without ever
        yielding (an uncontended semaphore and a send buffer with room never
        suspend), and the live tailer and the writers would wait for it.
        """
        if self.held:
            return
        await asyncio.sleep(0)
        await self._turns._sem.acquire()
        self.held = True
        self._turns.taken += 1
        self._start = time.perf_counter()

    def release(self) -> None:
        if self.held:
            self.held = False
            self._turns._sem.release()

    def over(self) -> bool:
        """Whether this turn has worked its slice."""
        return time.perf_counter() - self._start > self._turns.slice_s

    async def next(self) -> None:
        """Give the turn back, let the loop run once, and queue for the next one."""
        self.release()
        await self.acquire()

    async def __aenter__(self) -> Turn:
        await self.acquire()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()


__all__ = ["SLICE_S", "SLOTS", "Turn", "Turns"]
