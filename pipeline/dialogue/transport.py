"""The node-to-node TCP transport (address type 1): routed messages as Dialogue Messages.

An address ``tcp:HOST:PORT`` (value ``b"host:port"``) names another node's
listening transport. Route tracing is done by the *receiving* side, as in
Ockam's TCP transport: the sender pops its hop and sends the rest, the
receiver prepends the address of the connection the message came in on::

    A sends:     onward [tcp:B, echo]  return [requester]
    on the wire: onward [echo]         return [requester]
    B delivers:  onward [echo]         return [tcp:A', requester]

``A'`` is how B names that connection: the ``host:port`` B dialled for a
connection it opened, the peer's socket address for one it accepted. ``A'``
leads over that very connection, so a reply goes back the way the request
came, whether or not A listens and whatever A put on its return route (a peer
cannot make B send to a third address by claiming it).

Connections. One Dialogue connection per dialled address, opened on first
send (the opener is the Dialogue client) and reused in both directions. Dead
connections are dropped and re-opened on the next send; a reply to an
accepted connection that has gone is dialled like any address (and usually refused).

Bounds (``settings.node.tcp_*``): ``max_connections`` in and out; at the
bound the accepted connection that matters least is evicted for the
newcomer (the oldest that never completed a frame, else the one idle
longest if idle for a second), so silent sockets can never lock real peers
out. An accepted
connection must complete its first frame within ``first_frame_timeout``; any
frame must complete within ``frame_timeout`` of its first byte (a header
announcing 1 MiB followed by a trickle is cut there); a connection idle for
``idle_timeout`` is closed. Dialogue's frame limit is ``max_payload`` plus
routing overhead, and backpressure runs end to end: a full worker mailbox
stalls the connection's message dispatcher, whose bounded queue stops reading
the socket, so the sending node's writes wait.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from pipeline.dialogue.connection import Connection
from pipeline.dialogue.limits import ConnectionLimits
from pipeline.dialogue.protocol import Role
from pipeline.dialogue.server import least_valuable
from pipeline.errors import (
    ConfigError,
    DialogueClosed,
    DialogueError,
    LocalProtocolError,
    RemoteProtocolError,
)
from pipeline.routing.message import Address, AddressType, TransportMessage
from pipeline.routing.node import Node
from pipeline.settings import Settings

log = logging.getLogger(__name__)

#: Routes and msgpack framing on top of the payload, in a Dialogue frame.
ROUTE_OVERHEAD = 1 << 16


def parse_host_port(text: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for IPv6) -> (host, port); ConfigError if malformed."""
    host, sep, port_text = text.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ConfigError(f"not a host:port address: {text!r}")
    return host, int(port_text)


class TcpTransport:
    """Carries routed messages to ``tcp:HOST:PORT`` hops over Dialogue connections."""

    address_type = int(AddressType.TCP)

    def __init__(
        self,
        listen: str | None = None,
        settings: Settings | None = None,
        *,
        connect_timeout: float = 5.0,
        close_timeout: float = 5.0,
        max_connections: int | None = None,
        window: int | None = None,
        first_frame_timeout: float | None = None,
        frame_timeout: float | None = None,
        idle_timeout: float | None = None,
    ) -> None:
        settings = settings or Settings()
        self.listen = listen or None
        if self.listen is not None:
            parse_host_port(self.listen)
        self.max_payload = settings.max_payload
        self.connect_timeout = connect_timeout
        self.close_timeout = close_timeout
        self.max_connections = max(1, max_connections or settings.node.tcp_max_connections)
        #: The bounds of the connections we open, and of those we accept.
        self._limits = ConnectionLimits(
            max_frame=settings.max_payload + ROUTE_OVERHEAD,
            window=window,
            close_timeout=close_timeout,
            frame_timeout=frame_timeout or settings.node.tcp_frame_s or None,
            idle_timeout=idle_timeout or settings.node.tcp_idle_s or None,
        )
        self._accept_limits = self._limits.replace(
            first_frame_timeout=first_frame_timeout or settings.node.tcp_first_frame_s or None,
        )
        #: Our listen address once started (None when not listening).
        self.address: str | None = None
        self._node: Node | None = None
        self._server: asyncio.Server | None = None
        #: dialled address -> the connection we opened to it
        self._opened: dict[str, Connection] = {}
        #: accepted connection -> the address it goes by on return routes, and back
        self._incoming: dict[Connection, str] = {}
        self._by_peer: dict[str, Connection] = {}
        self._connecting: dict[str, asyncio.Future[Connection]] = {}
        self._stopping = False
        self.evicted = 0

    @classmethod
    def from_settings(cls, settings: Settings) -> TcpTransport:
        return cls(settings.node.listen or None, settings)

    # ---------------------------------------------------------------- lifecycle

    async def start(self, node: Node) -> None:
        self._node = node
        self._stopping = False
        if self.listen is None or self._server is not None:
            return
        host, port = parse_host_port(self.listen)
        self._server = await asyncio.start_server(self._accept, host, port)
        bound = self._server.sockets[0].getsockname()
        self.address = f"{host}:{bound[1]}"
        log.info("tcp transport of %s listening on %s", node.name, self.address)

    async def stop(self) -> None:
        """Stop accepting, close every connection (bounded), wait for the listener. Idempotent."""
        self._stopping = True
        if self._server is not None:
            self._server.close()
        conns = {*self._opened.values(), *self._incoming}
        await asyncio.gather(*(c.close(timeout=self.close_timeout) for c in conns))
        self._opened.clear()
        self._by_peer.clear()
        self._incoming.clear()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def statistics(self) -> dict[str, int]:
        return {
            "opened": len(self._opened),
            "incoming": len(self._incoming),
            "learned": len(self._by_peer),
            "evicted": self.evicted,
        }

    # --------------------------------------------------------------------- send

    async def send(self, message: TransportMessage) -> None:
        first = message.onward_route.first
        if first.type != AddressType.TCP:
            raise DialogueError(f"not a TCP hop: {first}")
        target = first.value.decode(errors="replace")
        conn = await self._connection(target)
        out = TransportMessage(message.onward_route.rest(), message.return_route, message.payload)
        await conn.send_message(out.encode())

    async def _connection(self, target: str) -> Connection:
        if self._stopping or self._node is None:
            raise DialogueClosed("tcp transport is not running")
        accepted = self._by_peer.get(target)
        if accepted is not None and not accepted.closed:
            return accepted
        conn = self._opened.get(target)
        if conn is not None:
            if not conn.closed:
                return conn
            del self._opened[target]
            await conn.close(timeout=self.close_timeout)
        pending = self._connecting.get(target)
        if pending is not None:
            return await asyncio.shield(pending)
        if len(self._opened) + len(self._incoming) >= self.max_connections and not self._evict():
            raise DialogueError(f"more than {self.max_connections} tcp connections")
        future: asyncio.Future[Connection] = asyncio.get_running_loop().create_future()
        self._connecting[target] = future
        try:
            conn = await self._open(target)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved here; waiters re-raise it
            raise
        finally:
            del self._connecting[target]
        future.set_result(conn)
        self._opened[target] = conn
        return conn

    async def _open(self, target: str) -> Connection:
        host, port = parse_host_port(target)
        try:
            async with asyncio.timeout(self.connect_timeout):
                reader, writer = await asyncio.open_connection(host, port)
        except (OSError, TimeoutError) as exc:
            raise DialogueError(f"cannot connect to tcp:{target}: {exc!r}") from exc
        conn = Connection.over_streams(
            reader,
            writer,
            Role.CLIENT,
            on_message=self._on_message_from(target),
            name=f"tcp-to-{target}",
            limits=self._limits,
        )
        conn.start()
        return conn

    # ------------------------------------------------------------------ receive

    def _evict(self) -> bool:
        """Make room for one connection by dropping the accepted one that matters least
        (:func:`~pipeline.dialogue.server.least_valuable`); False if none may go."""
        victim = least_valuable(self._incoming)
        if victim is None:
            return False
        self._forget(victim)
        self.evicted += 1
        if self._node is not None:
            self._node.counters["tcp_transport.evicted"] += 1
        log.warning("tcp transport: %d connections, evicting %s", self.max_connections, victim.name)
        victim.abort("evicted: too many connections")
        return True

    def _forget(self, conn: Connection) -> None:
        peer = self._incoming.pop(conn, None)
        if peer is not None and self._by_peer.get(peer) is conn:
            del self._by_peer[peer]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peername = writer.get_extra_info("peername")
        peer = f"{peername[0]}:{peername[1]}" if peername else f"unknown-{id(writer)}:0"
        if self._stopping or (
            len(self._opened) + len(self._incoming) >= self.max_connections and not self._evict()
        ):
            log.warning("tcp transport: refusing connection from %s", peer)
            writer.close()
            return
        conn = Connection.over_streams(
            reader,
            writer,
            Role.SERVER,
            on_message=self._on_message_from(peer),
            name=f"tcp-from-{peer}",
            limits=self._accept_limits,
        )
        self._incoming[conn] = peer
        self._by_peer[peer] = conn
        try:
            async with conn:
                await conn.wait_closed()
        finally:
            self._forget(conn)

    def _on_message_from(self, peer: str) -> Any:
        """The message handler of one connection; ``peer`` is its address on return routes."""
        back = Address(AddressType.TCP, peer.encode())

        async def on_message(data: bytes) -> None:
            node = self._node
            assert node is not None
            try:
                message = TransportMessage.decode(data, max_payload=self.max_payload)
                traced = message._replace(return_route=message.return_route.prepend(back))
            except (RemoteProtocolError, LocalProtocolError) as exc:
                # LocalProtocolError: the return route is already MAX_HOPS long.
                node.counters["tcp_transport.bad_messages"] += 1
                log.warning("tcp transport: dropped a malformed message from %s: %s", peer, exc)
                return
            node.counters["tcp_transport.received"] += 1
            await node.deliver(traced)

        return on_message
