"""One duplex stream as the application sees it: async iteration in, ``send``/``end`` out.

Received data waits in a bounded queue. When it holds more than ``high``
bytes the connection stops reading the transport (the seed-wire fallback,
which also stalls the connection's other traffic) until the application
drains it below ``low``; with flow control negotiated, the peer never sends
more than the granted window, so the fallback does not trigger.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING

from pipeline.errors import DialogueError, DuplexError

if TYPE_CHECKING:
    from pipeline.dialogue.connection import Connection


class Duplex:
    """A duplex on a :class:`Connection` (``local``: we opened it)."""

    def __init__(
        self, conn: Connection, pid: int, local: bool, initial: bytes | None, high: int
    ) -> None:
        self._conn = conn
        self.id = pid
        self.local = local
        #: The data of the DuplexInitial packet (incoming duplexes).
        self.initial = initial
        self._queue: deque[bytes] = deque()
        self._queued = 0
        self._high = high
        self._low = high // 2
        self._waiter: asyncio.Future[None] | None = None
        self._writable: asyncio.Future[None] | None = None
        #: The peer ended its half: None = not yet; (error data or None,)
        self._peer_end: tuple[bytes | None] | None = None
        self._failure: BaseException | None = None
        self.sending = True
        #: The application no longer reads (left the ``async with``): drop data.
        self.detached = False

    # ------------------------------------------------------------ application

    def __aiter__(self) -> Duplex:
        return self

    async def __anext__(self) -> bytes:
        while not self._queue:
            if self._failure is not None:
                raise self._failure
            if self._peer_end is not None:
                error = self._peer_end[0]
                if error is not None:
                    raise DuplexError("peer ended the duplex with an error", data=error)
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        data = self._queue.popleft()
        self._queued -= len(data)
        self._conn._consumed(self, len(data), self._queued <= self._low)
        return data

    async def receive(self) -> bytes | None:
        """The next chunk, or None once the peer ended its half without error."""
        try:
            return await self.__anext__()
        except StopAsyncIteration:
            return None

    async def send(self, data: bytes) -> None:
        """Send one chunk (waits for flow-control credit and write buffer space)."""
        await self._conn._duplex_send(self, data)

    async def end(self, error: bytes | None = None) -> None:
        """End our sending half; ``error`` data tells the peer it was an error. Idempotent."""
        if self.sending:
            self.sending = False
            await self._conn._duplex_end(self, error)

    @property
    def peer_ended(self) -> bool:
        return self._peer_end is not None or self._failure is not None

    def statistics(self) -> dict[str, int]:
        return {"queued_items": len(self._queue), "queued_bytes": self._queued, "high": self._high}

    async def __aenter__(self) -> Duplex:
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._detach()
        if self.sending and not self._conn.closed:
            await self.end(b"aborted" if exc is not None else None)

    # --------------------------------------------------------- connection side

    def _detach(self) -> None:
        """The application stops reading: drop what is queued (granting it back)."""
        self.detached = True
        dropped = self._queued
        self._queue.clear()
        self._queued = 0
        self._conn._consumed(self, dropped, True)

    def _feed(self, data: bytes) -> bool:
        """Queue received data; True when the queue is over its high watermark."""
        if self.detached:
            self._conn._consumed(self, len(data), True)
            return False
        self._queue.append(data)
        self._queued += len(data)
        self._wake()
        return self._queued > self._high

    def _ended(self, error: bytes | None) -> None:
        self._peer_end = (error,)
        self._wake()

    def _fail(self, exc: DialogueError | TimeoutError) -> None:
        if self._peer_end is None and self._failure is None:
            self._failure = exc
        self.sending = False
        self._wake()
        self._wake_writer()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _wake_writer(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
