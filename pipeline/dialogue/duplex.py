"""One duplex stream as the application sees it: async iteration in, ``send``/``end`` out.

Received data waits in a bounded queue. When it holds more than ``high``
bytes the connection stops reading the transport (the seed-wire fallback,
which also stalls the connection's other traffic) until the application
drains it below ``low``; with flow control negotiated, the peer never sends
more than the granted window, so the fallback does not trigger.

A duplex talks to its connection only through :class:`DuplexHost` (which
:class:`~pipeline.dialogue.connection.Connection` implements), and the
connection drives it only through the methods under "connection side".
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Protocol

from pipeline.errors import DialogueClosed, DialogueError, DuplexError


class DuplexHost(Protocol):
    """What a :class:`Duplex` needs from its connection."""

    @property
    def closed(self) -> bool:
        """The dialogue is over."""
        ...

    def send_credit(self, duplex: Duplex) -> int | None:
        """Bytes the duplex may send now; None without flow control."""
        ...

    async def duplex_send(self, duplex: Duplex, data: bytes) -> None:
        """Send one chunk on our half (credit already checked); waits for buffer space."""
        ...

    async def duplex_end(self, duplex: Duplex, error: bytes | None) -> None:
        """End our half (a no-op once the duplex failed or the dialogue closed)."""
        ...

    def duplex_consumed(self, duplex: Duplex, nbytes: int, low: bool) -> None:
        """The application took ``nbytes``; ``low``: the queue is below its low watermark."""
        ...


class Duplex:
    """A duplex on a connection (``local``: we opened it)."""

    def __init__(
        self, host: DuplexHost, pid: int, local: bool, initial: bytes | None, high: int
    ) -> None:
        self._host = host
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
        self._host.duplex_consumed(self, len(data), self._queued <= self._low)
        return data

    async def receive(self) -> bytes | None:
        """The next chunk, or None once the peer ended its half without error."""
        try:
            return await self.__anext__()
        except StopAsyncIteration:
            return None

    async def send(self, data: bytes) -> None:
        """Send one chunk (waits for flow-control credit and write buffer space).

        Raises :class:`DialogueClosed` once our half ended, or what ended the duplex.
        """
        host = self._host
        while True:
            if not self.sending:
                raise DialogueClosed("duplex is ended") if self._failure is None else self._failure
            credit = host.send_credit(self)
            if credit is None or credit > 0:
                break
            self._writable = asyncio.get_running_loop().create_future()
            try:
                await self._writable
            finally:
                self._writable = None
        await host.duplex_send(self, data)

    async def end(self, error: bytes | None = None) -> None:
        """End our sending half; ``error`` data tells the peer it was an error. Idempotent."""
        if self.sending:
            self.sending = False
            await self._host.duplex_end(self, error)

    @property
    def host(self) -> DuplexHost:
        """The connection this duplex runs on (one object per connection)."""
        return self._host

    @property
    def peer_ended(self) -> bool:
        return self._peer_end is not None or self._failure is not None

    @property
    def failed(self) -> bool:
        """The duplex ended abnormally (dialogue closed, peer never ended, ...)."""
        return self._failure is not None

    def statistics(self) -> dict[str, int]:
        return {"queued_items": len(self._queue), "queued_bytes": self._queued, "high": self._high}

    async def __aenter__(self) -> Duplex:
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.detach()
        if self.sending and not self._host.closed:
            await self.end(b"aborted" if exc is not None else None)

    # --------------------------------------------------------- connection side
    # Called by the connection (and the handler runner), not by applications.

    def detach(self) -> None:
        """The application stops reading: drop what is queued (granting it back)."""
        self.detached = True
        dropped = self._queued
        self._queue.clear()
        self._queued = 0
        self._host.duplex_consumed(self, dropped, True)

    def feed(self, data: bytes) -> bool:
        """Queue received data; True when the queue is over its high watermark."""
        if self.detached:
            self._host.duplex_consumed(self, len(data), True)
            return False
        self._queue.append(data)
        self._queued += len(data)
        self._wake()
        return self._queued > self._high

    def peer_end(self, error: bytes | None) -> None:
        """The peer ended its half (``error``: its error data)."""
        self._peer_end = (error,)
        self._wake()

    def fail(self, exc: DialogueError | TimeoutError) -> None:
        """End the duplex abnormally: readers and a waiting sender get ``exc``."""
        if self._peer_end is None and self._failure is None:
            self._failure = exc
        self.sending = False
        self._wake()
        self.wake_writer()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def wake_writer(self) -> None:
        """Flow-control credit came back: a sender waiting for it retries."""
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
