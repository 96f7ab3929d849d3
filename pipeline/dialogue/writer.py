"""The writing side of a connection: the one path every byte goes out through.

A :class:`Writer` is the body of a connection's writer task. Each turn it
takes whatever the machine produced since the last one as one write and
drains it; it sleeps when there is nothing to write and is woken by
:meth:`Writer.wake`, which the connection calls after every input to the
machine. Senders bound the machine's output buffer by waiting in
:meth:`Writer.flushed` while it holds more than ``high`` bytes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from pipeline.dialogue.channel import Channel
from pipeline.dialogue.protocol import Dialogue
from pipeline.dialogue.readclock import ReadClock
from pipeline.dialogue.states import State


class Writer:
    """Writes the machine's output until the dialogue is closed."""

    def __init__(
        self,
        proto: Dialogue,
        channel: Channel,
        clock: ReadClock,
        *,
        high: int,
        after: Callable[[], None],
    ) -> None:
        self._proto = proto
        self._channel = channel
        self._clock = clock
        self._high = high
        self._after = after
        self._loop = asyncio.get_running_loop()
        self._wake: asyncio.Future[None] | None = None
        self._flush_waiters: list[asyncio.Future[None]] = []
        #: The writer stopped: nothing more will be written.
        self.done = False

    def wake(self) -> None:
        """Wake the sleeping writer if the machine has bytes for it (or closed)."""
        wake = self._wake
        if (
            wake is not None
            and (self._proto.bytes_to_send or self._proto.state is State.CLOSED)
            and not wake.done()
        ):
            wake.set_result(None)

    async def flushed(self) -> bool:
        """Wait until at most ``high`` bytes are unwritten; False if the writer stopped first."""
        while self._proto.bytes_to_send > self._high:
            if self.done:
                return False
            waiter = self._loop.create_future()
            self._flush_waiters.append(waiter)
            await waiter
        return True

    async def run(self) -> None:
        """Write until the machine is closed; a failed write aborts the dialogue instead of raising."""
        proto = self._proto
        channel = self._channel
        try:
            while True:
                data = proto.data_to_send()
                if data:
                    await channel.send(data)
                    self._clock.sent(self._loop.time())
                    self._wake_flush_waiters()
                    continue
                self._wake_flush_waiters()
                if proto.state is State.CLOSED:
                    break
                self._wake = self._loop.create_future()
                try:
                    await self._wake
                finally:
                    self._wake = None
        except (ConnectionError, OSError) as exc:
            proto.abort(f"write failed: {exc!r}")
            self._after()
        finally:
            self.done = True
            self._wake_flush_waiters()

    def _wake_flush_waiters(self) -> None:
        waiters, self._flush_waiters = self._flush_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


__all__ = ["Writer"]
