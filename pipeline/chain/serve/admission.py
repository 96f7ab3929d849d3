"""The HTTP door of ``sluice serve``: how many connections, and how long a request head may take.

aiohttp holds a connection for as long as its peer takes to send a request
head, and accepts as many as the kernel hands it: a peer that never finishes
its upgrade request, or sends a byte every 10 s, is held forever, and enough
of them exhaust the process's descriptors. :class:`ConnectionGuard` sits
between the listening socket and aiohttp's protocol (a thin
:class:`asyncio.Protocol` around each of aiohttp's ``RequestHandler``):

- at most ``max_connections`` at once; one more is answered
  ``503 Service Unavailable`` and closed, counted in
  ``sluice_serve_connections_refused_total``;
- a connection must complete a request head within ``header_timeout_s`` of
  being accepted (or of its previous response, for keep-alive); else it is
  answered ``408`` and closed, counted in ``sluice_serve_header_timeouts_total``
  (an idle keep-alive connection, with nothing sent since its last response,
  is closed without a word and not counted).
  A request whose head arrived (a websocket, a long ``/healthz``) is not timed
  here: :meth:`ConnectionGuard.middleware` marks it as being served.

The guard only uses public APIs: :attr:`aiohttp.web.AppRunner.server` (the
protocol factory aiohttp's own sites hand to ``loop.create_server``),
``loop.create_server`` and a middleware.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from pipeline.chain.metrics import Metrics

log = logging.getLogger(__name__)

_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Type: text/plain\r\n"
    b"Content-Length: 31\r\n\r\ntoo many connections: try later"
)
_TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"


class _Guarded(asyncio.Protocol):
    """One accepted connection: aiohttp's protocol inside, its deadline and its slot outside."""

    __slots__ = ("_guard", "_inner", "_timer", "_transport", "busy", "partial", "refused", "served")

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self._guard = guard
        self._inner = inner
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.busy = 0
        self.refused = False
        #: requests answered on this connection, and whether bytes came since the last one
        self.served = 0
        self.partial = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        if not self._guard._admit(self, transport):
            self.refused = True
            transport.write(_BUSY)
            transport.close()
            return
        self._inner.connection_made(transport)
        self.arm()

    def arm(self) -> None:
        """Start the wait for a complete request head."""
        self.disarm()
        self._timer = asyncio.get_running_loop().call_later(
            self._guard.header_timeout_s, self._expired
        )

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        transport = self._transport
        if self.busy or transport is None or transport.is_closing():
            return
        if self.served and not self.partial:
            transport.close()  # an idle keep-alive connection: closed without a word
            return
        self._guard._timed_out()
        transport.write(_TIMEOUT)
        transport.close()

    def data_received(self, data: bytes) -> None:
        if not self.refused:
            if not self.busy:
                self.partial = True
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return None if self.refused else self._inner.eof_received()

    def pause_writing(self) -> None:
        if not self.refused:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if not self.refused:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.disarm()
        if self.refused:
            return
        self._guard._left(self._transport)
        self._inner.connection_lost(exc)


class ConnectionGuard:
    """Connection cap and request-head deadline of one server (see the module doc)."""

    def __init__(
        self, *, max_connections: int, header_timeout_s: float, metrics: Metrics | None = None
    ) -> None:
        if max_connections < 1 or header_timeout_s <= 0:
            raise ValueError("max_connections and header_timeout_s must be positive")
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self._metrics = metrics
        self._open: dict[asyncio.BaseTransport, _Guarded] = {}
        self._at_cap = False

    def __len__(self) -> int:
        return len(self._open)

    def _admit(self, conn: _Guarded, transport: asyncio.BaseTransport) -> bool:
        if len(self._open) >= self.max_connections:
            self._count("sluice_serve_connections_refused_total")
            if not self._at_cap:  # one line per episode, not one per refused connection
                self._at_cap = True
                log.warning(
                    "connection cap reached (%d open): refusing new connections with 503 "
                    "(sluice_serve_connections_refused_total counts them)",
                    self.max_connections,
                )
            return False
        self._open[transport] = conn
        return True

    def _left(self, transport: asyncio.BaseTransport | None) -> None:
        if transport is not None:
            self._open.pop(transport, None)
        if self._at_cap and len(self._open) < self.max_connections * 9 // 10:
            self._at_cap = False
            log.info("connections below the cap again (%d open)", len(self._open))

    def _timed_out(self) -> None:
        self._count("sluice_serve_header_timeouts_total")

    def _count(self, name: str) -> None:
        if self._metrics is not None:
            self._metrics.inc(name)

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """A request head arrived: no deadline while it is served; a fresh one after it."""
        conn = self._open.get(request.transport) if request.transport is not None else None
        if conn is None:
            return await handler(request)
        conn.busy += 1
        conn.disarm()
        try:
            return await handler(request)
        finally:
            conn.busy -= 1
            conn.served += 1
            if not conn.busy:
                conn.partial = False
                conn.arm()

    async def listen(
        self, runner: web.AppRunner, host: str, port: int, **kwargs: Any
    ) -> asyncio.Server:
        """Listen on ``host:port`` with ``runner``'s protocol behind this guard.

        Close the returned server before ``runner.cleanup()`` (which then
        closes the connections still open, as with aiohttp's own sites).
        """
        factory = runner.server
        if factory is None:
            raise RuntimeError("call runner.setup() first")
        loop = asyncio.get_running_loop()
        return await loop.create_server(
            lambda: _Guarded(self, factory()),
            host,
            port,
            reuse_address=True,
            family=socket.AF_UNSPEC,
            **kwargs,
        )


__all__ = ["ConnectionGuard"]
