"""The node-to-node TCP transport (address type 1): routed messages as Dialogue Messages.

An address ``tcp:HOST:PORT`` (value ``b"host:port"``) names another node's
listening transport. On send the transport pops that hop from the onward
route and prepends the address that leads back to this node onto the return
route (route tracing, as every transport does), encodes the message with the
one routing codec and sends it as one Dialogue ``Message`` packet::

    in:   onward [tcp:B, echo]   return [requester]
    sent: onward [echo]          return [tcp:A, requester]    (A = our listen address)

The receiving transport decodes it and hands it to its node unchanged.

Connections. One Dialogue connection per peer, opened on first send (the
opener is the Dialogue client) and reused in both directions: a message that
arrives with a TCP first hop on its return route teaches the receiver that
this address is reachable over that connection, so a reply to a node that is
not listening (its return hop is then its socket's local address) goes back
the way the request came. A connection this node opened always wins over a
learned one. Dead connections are dropped and re-opened on the next send.

Bounds: ``max_connections`` peers, a connect timeout, Dialogue's frame limit
(``max_payload`` plus routing overhead), and backpressure end to end: a full
worker mailbox stalls the connection's message dispatcher, whose bounded
queue stops reading the socket, so the sending node's writes wait.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from pipeline.dialogue.connection import Connection
from pipeline.dialogue.protocol import Role
from pipeline.errors import ConfigError, DialogueClosed, DialogueError, RemoteProtocolError
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
        max_connections: int = 256,
        window: int | None = None,
    ) -> None:
        settings = settings or Settings()
        self.listen = listen or None
        if self.listen is not None:
            parse_host_port(self.listen)
        self.max_payload = settings.max_payload
        self.connect_timeout = connect_timeout
        self.close_timeout = close_timeout
        self.max_connections = max_connections
        self._options: dict[str, Any] = {
            "max_frame": settings.max_payload + ROUTE_OVERHEAD,
            "window": window,
            "close_timeout": close_timeout,
        }
        #: Our own return address (the bound listen address once started).
        self.address: str | None = None
        self._node: Node | None = None
        self._server: asyncio.Server | None = None
        self._opened: dict[str, Connection] = {}
        self._learned: dict[str, Connection] = {}
        self._incoming: set[Connection] = set()
        self._connecting: dict[str, asyncio.Future[Connection]] = {}
        self._stopping = False

    @classmethod
    def from_settings(cls, settings: Settings) -> TcpTransport:
        return cls(settings.node_listen or None, settings)

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
        self._learned.clear()
        self._incoming.clear()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def statistics(self) -> dict[str, int]:
        return {
            "opened": len(self._opened),
            "incoming": len(self._incoming),
            "learned": len(self._learned),
        }

    # --------------------------------------------------------------------- send

    async def send(self, message: TransportMessage) -> None:
        first = message.onward_route.first
        if first.type != AddressType.TCP:
            raise DialogueError(f"not a TCP hop: {first}")
        target = first.value.decode(errors="replace")
        conn = await self._connection(target)
        back = Address(AddressType.TCP, self._return_address(conn).encode())
        out = TransportMessage(
            message.onward_route.rest(), message.return_route.prepend(back), message.payload
        )
        await conn.send_message(out.encode())

    def _return_address(self, conn: Connection) -> str:
        if self.address is not None:
            return self.address
        writer = getattr(conn.channel, "writer", None)
        sockname = writer.get_extra_info("sockname") if writer is not None else None
        return f"{sockname[0]}:{sockname[1]}" if sockname else "0.0.0.0:0"

    async def _connection(self, target: str) -> Connection:
        if self._stopping or self._node is None:
            raise DialogueClosed("tcp transport is not running")
        for table in (self._opened, self._learned):
            conn = table.get(target)
            if conn is not None:
                if not conn.closed:
                    return conn
                del table[target]
                if table is self._opened:
                    await conn.close(timeout=self.close_timeout)
        pending = self._connecting.get(target)
        if pending is not None:
            return await asyncio.shield(pending)
        if len(self._opened) + len(self._incoming) >= self.max_connections:
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
            on_message=self._on_message_from(None),
            name=f"tcp-to-{target}",
            **self._options,
        )
        conn.start()
        return conn

    # ------------------------------------------------------------------ receive

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        if self._stopping or len(self._opened) + len(self._incoming) >= self.max_connections:
            log.warning("tcp transport: refusing connection from %s", peer)
            writer.close()
            return
        holder: list[Connection] = []
        conn = Connection.over_streams(
            reader,
            writer,
            Role.SERVER,
            on_message=self._on_message_from(holder),
            name=f"tcp-from-{peer}",
            **self._options,
        )
        holder.append(conn)
        self._incoming.add(conn)
        async with conn:
            await conn.wait_closed()
        self._incoming.discard(conn)
        for address, learned in list(self._learned.items()):
            if learned is conn:
                del self._learned[address]

    def _on_message_from(self, holder: list[Connection] | None) -> Any:
        async def on_message(data: bytes) -> None:
            node = self._node
            assert node is not None
            try:
                message = TransportMessage.decode(data, max_payload=self.max_payload)
            except RemoteProtocolError as exc:
                node.counters["tcp_transport.bad_messages"] += 1
                log.warning("tcp transport: dropped a malformed message: %s", exc)
                return
            if holder and message.return_route:
                back = message.return_route[0]
                if back.type == AddressType.TCP:
                    address = back.value.decode(errors="replace")
                    if address not in self._opened and address not in self._learned:
                        self._learned[address] = holder[0]
            node.counters["tcp_transport.received"] += 1
            await node.deliver(message)

        return on_message
