"""The HTTP door of ``sluice serve``: how many connections, how long a request head may
take, and the probes that get in whatever the load.

aiohttp holds a connection for as long as its peer takes to send a request
head, and accepts as many as the kernel hands it: a peer that never finishes
its upgrade request, or sends a byte every 10 s, is held forever, and enough
of them exhaust the process's descriptors. :class:`ConnectionGuard` sits
between the listening socket and aiohttp's protocol (a thin
:class:`asyncio.Protocol` around each of aiohttp's ``RequestHandler``):

- at most ``max_connections`` at once (the cap). A connection past the cap
  waits at the door, at most :data:`DOOR_SLOTS` of them (when the door is
  full, the one that waited longest is refused to make room), until its
  request head is complete: a probe (``GET`` or ``HEAD`` of ``/healthz`` or
  ``/metrics``) is then served outside the cap, on one of :data:`PROBE_SLOTS`
  reserved slots, and closed after its answer, so an orchestrator's liveness
  probe is answered while the cap is full; anything else is answered
  ``503 Service Unavailable`` (once its head was read: a close with unread
  bytes would reset the connection and lose the answer) and closed, counted
  in ``sluice_serve_connections_refused_total``;
- a connection must complete a request head within ``header_timeout_s`` of
  being accepted (or of its previous response, for keep-alive); else it is
  answered ``408`` and closed, counted in ``sluice_serve_header_timeouts_total``
  (an idle keep-alive connection, with nothing sent since its last response,
  is closed without a word and not counted). What counts is what was
  received: the deadline stops when the head's last byte is read, even if a
  busy server has not started its handler yet (asyncio's loop reads sockets
  before it runs the timers due in the same turn), so a peer whose head came
  in time is never answered 408, however loaded the server.
  A request whose head arrived (a websocket, a long ``/healthz``) is not timed
  here: :meth:`ConnectionGuard.middleware` marks it as being served.

The guard only uses public APIs: :attr:`aiohttp.web.AppRunner.server` (the
protocol factory aiohttp's own sites hand to ``loop.create_server``),
``loop.create_server`` and a middleware.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any, cast

from aiohttp import web

from pipeline.chain.metrics import Metrics

log = logging.getLogger(__name__)

_BUSY_TEXT = b"too many connections: try later"
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Type: text/plain\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(_BUSY_TEXT), _BUSY_TEXT)
)
_TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"


class _Seat(enum.Enum):
    """Where a connection stands at the door."""

    ADMITTED = "under the cap"
    WAITING = "past the cap, its head being read"
    PROBE = "past the cap, a probe on a reserved slot"
    REFUSED = "answered 503 or 408 and closed"


#: Paths served past the cap (on the reserved probe slots).
PROBES = frozenset({"/healthz", "/metrics"})
#: Connections past the cap whose request head is being read, at most.
DOOR_SLOTS = 512
#: Probes served past the cap at once; each is closed after its answer.
PROBE_SLOTS = 8
#: The listening socket's accept queue (asyncio's default, 100, dropped the SYNs of a storm:
#: a probe's connection then waited a second for its retry; the kernel caps it at somaxconn).
BACKLOG = 2048
#: Seconds a refused connection waits for its peer to close (reading and dropping bytes).
LINGER_S = 1.0
#: The longest request head read at the door (aiohttp's own line limit is 8,190 bytes).
_HEAD_MAX = 16384
_END = b"\r\n\r\n"


class _Guarded(asyncio.Protocol):
    """One accepted connection: aiohttp's protocol inside, its deadline and its seat outside."""

    __slots__ = (
        "_guard",
        "_head",
        "_inner",
        "_tail",
        "_timer",
        "_transport",
        "busy",
        "partial",
        "seat",
        "served",
    )

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self._guard = guard
        self._inner = inner
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.busy = 0
        self.seat = _Seat.REFUSED
        #: requests answered on this connection, and whether bytes came since the last one
        self.served = 0
        self.partial = False
        #: the last bytes read while a head was awaited (its end may span two reads)
        self._tail = b""
        #: what a connection at the door sent so far
        self._head = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports have a Transport's methods but are not its subclass)
        self._transport = cast(asyncio.Transport, transport)
        self.seat = self._guard._admit(self)
        if self.seat is _Seat.ADMITTED:
            self._inner.connection_made(transport)
        self.arm()

    def arm(self) -> None:
        """Start the wait for a complete request head."""
        self.disarm()
        self._tail = b""
        self._timer = asyncio.get_running_loop().call_later(
            self._guard.header_timeout_s, self._expired
        )

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def refuse(self, answer: bytes = _BUSY) -> None:
        """Answer (503 unless told) and close; the seat is given back at once. The answer
        is read whole: the connection lingers (at most :data:`LINGER_S`, :data:`DOOR_SLOTS`
        of them) reading and dropping what the peer still sends, until the peer closes."""
        self.disarm()
        self._guard._left(self)
        self.seat = _Seat.REFUSED
        if answer is _BUSY:
            self._guard._count("sluice_serve_connections_refused_total")
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        transport.write(answer)
        if transport.can_write_eof() and self._guard._linger(self):
            # Closed with unread bytes (a head still coming), the socket would be reset and
            # the answer lost: end our half, drop what comes, close when the peer does.
            transport.write_eof()
            self._timer = asyncio.get_running_loop().call_later(LINGER_S, transport.close)
        else:
            transport.close()

    def _expired(self) -> None:
        self._timer = None
        transport = self._transport
        if self.busy or transport is None or transport.is_closing():
            return
        if self.served and not self.partial and self.seat is not _Seat.WAITING:
            transport.close()  # an idle keep-alive connection: closed without a word
            return
        self._guard._count("sluice_serve_header_timeouts_total")
        self.refuse(_TIMEOUT)

    def data_received(self, data: bytes) -> None:
        seat = self.seat
        if seat is _Seat.WAITING:
            self._at_door(data)
            return
        if seat is _Seat.REFUSED:
            return
        if not self.busy:
            self.partial = True
            if self._timer is not None:
                # a complete head stops the deadline now, not when its handler starts
                if _END in self._tail + data:
                    self.disarm()
                else:
                    self._tail = data[-3:]
        self._inner.data_received(data)

    def _at_door(self, data: bytes) -> None:
        """Read a head past the cap: a probe gets a reserved slot, anything else a 503."""
        head = self._head
        head += data
        if head.find(_END, max(0, len(head) - len(data) - 3)) < 0:  # (only the new bytes)
            if len(head) > _HEAD_MAX:
                self.refuse()
            return
        line = bytes(head.split(b"\r\n", 1)[0]).split(b" ")
        path = line[1].split(b"?", 1)[0].decode("latin-1") if len(line) == 3 else ""
        if line[0] not in (b"GET", b"HEAD") or path not in PROBES:
            self.refuse()
            return
        if not self._guard._probe(self):
            self.refuse()
            return
        self.seat = _Seat.PROBE
        self.disarm()
        self._head = bytearray()
        assert self._transport is not None
        self._inner.connection_made(self._transport)
        self.partial = True
        self._inner.data_received(bytes(head))

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._serving() else None

    def pause_writing(self) -> None:
        if self._serving():
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._serving():
            self._inner.resume_writing()

    def _serving(self) -> bool:
        return self.seat is _Seat.ADMITTED or self.seat is _Seat.PROBE

    def connection_lost(self, exc: Exception | None) -> None:
        self.disarm()
        serving = self._serving()
        self._guard._left(self)
        if serving:
            self._inner.connection_lost(exc)


class ConnectionGuard:
    """Connection cap, probe slots and request-head deadline of one server (see the module doc)."""

    def __init__(
        self, *, max_connections: int, header_timeout_s: float, metrics: Metrics | None = None
    ) -> None:
        if max_connections < 1 or header_timeout_s <= 0:
            raise ValueError("max_connections and header_timeout_s must be positive")
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self._metrics = metrics
        self._open: dict[asyncio.BaseTransport, _Guarded] = {}
        #: past the cap: reading their heads (oldest first), and probes being served
        self._door: dict[asyncio.BaseTransport, _Guarded] = {}
        self._probes: dict[asyncio.BaseTransport, _Guarded] = {}
        #: refused, answered, waiting for their peers to close
        self._leaving: dict[asyncio.BaseTransport, _Guarded] = {}
        self._at_cap = False

    def __len__(self) -> int:
        """Connections under the cap (the door and the probe slots not counted)."""
        return len(self._open)

    @property
    def probes(self) -> int:
        """Probes being served past the cap now."""
        return len(self._probes)

    def _admit(self, conn: _Guarded) -> _Seat:
        transport = conn._transport
        assert transport is not None
        if len(self._open) < self.max_connections:
            self._open[transport] = conn
            return _Seat.ADMITTED
        if not self._at_cap:  # one line per episode, not one per refused connection
            self._at_cap = True
            log.warning(
                "connection cap reached (%d open): new connections other than /healthz and "
                "/metrics are refused with 503 (sluice_serve_connections_refused_total counts them)",
                self.max_connections,
            )
        if len(self._door) >= DOOR_SLOTS:
            next(iter(self._door.values())).refuse()  # the longest wait makes room
        self._door[transport] = conn
        return _Seat.WAITING

    def _probe(self, conn: _Guarded) -> bool:
        """Move ``conn`` from the door to a probe slot; False when none is free."""
        transport = conn._transport
        if transport is None or len(self._probes) >= PROBE_SLOTS:
            return False
        self._door.pop(transport, None)
        self._probes[transport] = conn
        return True

    def _linger(self, conn: _Guarded) -> bool:
        """Note a refused connection that waits for its peer to close; False when too many do."""
        if conn._transport is None or len(self._leaving) >= DOOR_SLOTS:
            return False
        self._leaving[conn._transport] = conn
        return True

    def _left(self, conn: _Guarded) -> None:
        transport = conn._transport
        if transport is None:
            return
        self._door.pop(transport, None)
        self._probes.pop(transport, None)
        self._leaving.pop(transport, None)
        if self._open.pop(transport, None) is None:
            return
        if self._at_cap and len(self._open) < self.max_connections * 9 // 10:
            self._at_cap = False
            log.info("connections below the cap again (%d open)", len(self._open))

    def _count(self, name: str) -> None:
        if self._metrics is not None:
            self._metrics.inc(name)

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """A request head arrived: no deadline while it is served; a fresh one after it.

        On a probe slot only ``/healthz`` and ``/metrics`` are served, and the
        connection is closed after the answer (the slot is free again)."""
        transport = request.transport
        conn = (
            None if transport is None else self._open.get(transport) or self._probes.get(transport)
        )
        if conn is None:
            return await handler(request)
        conn.busy += 1
        conn.disarm()
        try:
            if conn.seat is _Seat.PROBE and request.path not in PROBES:
                self._count("sluice_serve_connections_refused_total")
                response: web.StreamResponse = web.Response(status=503, body=_BUSY_TEXT)
            else:
                response = await handler(request)
            if conn.seat is _Seat.PROBE:
                response.force_close()
            return response
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
            **{"backlog": BACKLOG, **kwargs},
        )


__all__ = ["ConnectionGuard"]
