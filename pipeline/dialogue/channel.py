"""Byte channels the Dialogue connection runs over: TCP streams and aiohttp websockets.

A channel is a reliable ordered byte pipe: ``read()`` returns the next chunk
(b"" at the end), ``send()`` writes and drains, ``close(code, reason)`` ends it
(bounded). ``code`` and ``reason`` are the public close of
:meth:`~pipeline.dialogue.events.ConnectionClosed.public` (never a local
reason): a websocket sends them in its close frame; TCP has no place for them
(the seed's wire carries no close reason), so the peer sees the stream end.
Over a websocket, each binary message carries a chunk of the Dialogue byte
stream (the writer batches whole frames into one message).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Protocol

import aiohttp
from aiohttp import web

from pipeline.errors import RemoteProtocolError

READ_SIZE = 1 << 18
_TCP = (socket.AF_INET, socket.AF_INET6)
_TCP_INFO: int | None = getattr(socket, "TCP_INFO", None)
#: TCP states (linux/tcp_states.h) after the peer's FIN or reset: CLOSE, CLOSE_WAIT, LAST_ACK.
_PEER_CLOSED = frozenset({7, 8, 9})
#: Drain only when the transport buffers more than this (draining an empty buffer costs a hop).
DRAIN_ABOVE = 1 << 16


class Channel(Protocol):
    async def read(self) -> bytes: ...

    async def send(self, data: bytes) -> None: ...

    async def close(self, code: int = 1000, reason: str = "") -> None: ...

    def abort(self) -> None: ...

    def peer_gone(self) -> bool:
        """Whether the peer closed its end, seen without reading (False: not known)."""
        ...


class StreamChannel:
    """An asyncio stream pair (TCP, Unix socket, socketpair)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def read(self) -> bytes:
        return await self.reader.read(READ_SIZE)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        if self.writer.transport.get_write_buffer_size() > DRAIN_ABOVE:
            await self.writer.drain()

    async def close(self, code: int = 1000, reason: str = "") -> None:
        writer = self.writer
        if writer.is_closing():
            return
        try:
            await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError):
            pass  # the peer is gone already: closing is all that is left
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()

    def abort(self) -> None:
        self.writer.transport.abort()

    def peer_gone(self) -> bool:
        """The peer closed or reset the connection (Linux's ``TCP_INFO`` state: the stream's
        end may sit unread behind data, and is seen here without reading)."""
        sock = self.writer.get_extra_info("socket")
        if sock is None or _TCP_INFO is None or sock.family not in _TCP:
            return False
        try:
            state = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 1)[0]
        except OSError:
            return True
        return state in _PEER_CLOSED


WebSocket = web.WebSocketResponse | aiohttp.ClientWebSocketResponse


class WebSocketChannel:
    """An aiohttp websocket (server or client side); binary messages only."""

    def __init__(self, ws: WebSocket) -> None:
        self.ws = ws

    async def read(self) -> bytes:
        msg = await self.ws.receive()
        if msg.type is aiohttp.WSMsgType.BINARY:
            data: bytes = msg.data
            return data if data else await self.read()
        if msg.type in (
            aiohttp.WSMsgType.CLOSE,
            aiohttp.WSMsgType.CLOSING,
            aiohttp.WSMsgType.CLOSED,
        ):
            return b""
        if msg.type is aiohttp.WSMsgType.ERROR:
            raise ConnectionError(f"websocket error: {msg.data!r}")
        raise RemoteProtocolError(f"websocket {msg.type.name} message", public="binary only")

    async def send(self, data: bytes) -> None:
        await self.ws.send_bytes(data)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        if not self.ws.closed:
            await self.ws.close(code=code, message=reason.encode())

    def abort(self) -> None:
        """Nothing to do synchronously: aiohttp bounds its own close handshake."""

    def peer_gone(self) -> bool:
        return self.ws.closed
