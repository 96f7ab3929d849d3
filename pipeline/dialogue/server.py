"""A TCP server of Dialogue connections (the server role), with a bounded, ordered shutdown.

``async with DialogueServer("127.0.0.1", 0, on_request=...) as server:`` accepts
connections, runs each as a :class:`Connection` with the given handlers and
options, and calls ``on_connection(conn)`` if given. :meth:`close` stops
accepting, closes every connection the seed's way (the server signals, the
clients close) bounded by ``close_timeout``, then waits for the listener.
Safe to call twice.

Hostile clients: a connection must complete its first frame within
``first_frame_timeout`` and any frame within ``frame_timeout`` of its first
byte (both on by default; ``None`` turns one off), and at ``max_connections``
the connection that matters least is evicted for the newcomer (see
:func:`least_valuable`), so silent sockets never lock real clients out; a
newcomer is refused only when every connection is busy talking.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from types import TracebackType
from typing import Any

from pipeline import lifecycle
from pipeline.dialogue.connection import Connection
from pipeline.dialogue.limits import ConnectionLimits
from pipeline.dialogue.protocol import Role

log = logging.getLogger(__name__)

DEFAULT_FIRST_FRAME_TIMEOUT = 10.0
DEFAULT_FRAME_TIMEOUT = 30.0


#: A connection that completed a frame is evicted only after this long without a byte.
EVICT_IDLE_S = 1.0


def least_valuable(conns: Iterable[Connection]) -> Connection | None:
    """The connection to evict for a newcomer, or None to refuse the newcomer instead.

    The oldest that never completed a frame (silent or trickling sockets),
    else the one idle longest if it has been idle for ``EVICT_IDLE_S``: a
    peer in the middle of talking is never dropped for an unknown one.
    """
    victim = min(conns, key=lambda c: (c.frames_received > 0, c.last_activity), default=None)
    if victim is None or not victim.frames_received:
        return victim
    idle = asyncio.get_running_loop().time() - victim.last_activity
    return victim if idle >= EVICT_IDLE_S else None


class DialogueServer:
    """Accepts Dialogue connections over TCP; each runs ``on_connection`` (or the
    handlers in ``options``: ``on_request``, ``on_duplex``, ``on_message``).

    ``async with DialogueServer(host, 0, ...) as server`` listens (``server.port``
    is the bound port) and closes on exit. :meth:`close` stops accepting, closes
    every connection the seed's way within ``close_timeout`` and returns when
    done; it is safe to call twice, and a second caller waits for the first.

    Each connection gets ``limits``; without them, the connection's defaults
    with the hostile-client deadlines on and the server's ``close_timeout``.
    The limits' fields are also accepted as keywords in ``options``, applied
    over ``limits`` (the connection's compatibility path).
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        on_connection: Callable[[Connection], Awaitable[None]] | None = None,
        max_connections: int = 1024,
        close_timeout: float = 5.0,
        limits: ConnectionLimits | None = None,
        **options: Any,
    ) -> None:
        self.host = host
        self.port = port
        self.on_connection = on_connection
        self.max_connections = max_connections
        self.close_timeout = close_timeout
        if limits is None:
            limits = ConnectionLimits(
                close_timeout=close_timeout,
                first_frame_timeout=DEFAULT_FIRST_FRAME_TIMEOUT,
                frame_timeout=DEFAULT_FRAME_TIMEOUT,
            )
        self.limits = limits
        self.options = options
        self.connections: set[Connection] = set()
        self.evicted = 0
        self._server: asyncio.Server | None = None
        self._closing = False
        self._closed = lifecycle.Once()

    async def start(self) -> None:
        """Listen on ``host:port`` (port 0: any free port, then read ``self.port``)."""
        self._server = await asyncio.start_server(self._accept, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def __aenter__(self) -> DialogueServer:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop accepting, close every connection, wait for them (safe to call twice)."""
        await self._closed.run(self._close)

    async def _close(self) -> None:
        self._closing = True
        if self._server is not None:
            self._server.close()
        await asyncio.gather(*(c.close(timeout=self.close_timeout) for c in list(self.connections)))
        if self._server is not None:
            await self._server.wait_closed()

    def _make_room(self) -> bool:
        if len(self.connections) < self.max_connections:
            return True
        victim = least_valuable(self.connections)
        if victim is None:
            return False
        self.connections.discard(victim)
        self.evicted += 1
        log.warning(
            "dialogue server: %d connections, evicting %s", self.max_connections, victim.name
        )
        victim.abort("evicted: too many connections")
        return True

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._closing or not self._make_room():
            log.warning("dialogue server: refusing %s", writer.get_extra_info("peername"))
            writer.close()
            return
        conn = Connection.over_streams(
            reader, writer, Role.SERVER, limits=self.limits, **self.options
        )
        self.connections.add(conn)
        try:
            async with conn:
                if self.on_connection is not None:
                    await self.on_connection(conn)
                await conn.wait_closed()
        finally:
            self.connections.discard(conn)
