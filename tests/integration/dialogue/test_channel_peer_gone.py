"""A TCP channel tells that its peer left without reading what the peer sent before (issue 32, 1).

The Dialogue reader, paused by backpressure, looks at it: the peer's end of
stream sits unread behind its data, so only the socket's state can say so.
"""

from __future__ import annotations

import asyncio

from pipeline.dialogue.channel import StreamChannel
from pipeline.dialogue.connection import Connection
from pipeline.dialogue.server import DialogueServer
from tests.support.poll import until


async def test_a_peer_that_closed_behind_unread_data_is_seen_gone() -> None:
    accepted: asyncio.Queue[StreamChannel] = asyncio.Queue()

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accepted.put(StreamChannel(reader, writer))

    server = await asyncio.start_server(on_client, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        for abort in (False, True):
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            channel = await accepted.get()
            assert not channel.peer_gone()
            writer.write(b"x" * 100_000)  # never read by the server
            await writer.drain()
            assert not channel.peer_gone()
            if abort:
                writer.transport.abort()
            else:
                writer.close()
            await until(channel.peer_gone, "the peer seen gone")
            channel.abort()
    finally:
        server.close()
        await server.wait_closed()


async def test_a_peer_that_leaves_while_its_reading_is_paused_is_let_go() -> None:
    """Two request handlers at most, both stuck: the server stops reading the connection,
    so the peer's close sits unread behind its requests. Before, the connection and its
    handlers stayed for as long as the handlers did (the socket in CLOSE-WAIT)."""
    stuck = asyncio.Event()
    started: list[bytes] = []
    cancelled: list[bytes] = []

    async def on_request(data: bytes) -> bytes:
        started.append(data)
        try:
            await stuck.wait()  # never set
        except asyncio.CancelledError:
            cancelled.append(data)
            raise
        return data

    async with DialogueServer("127.0.0.1", 0, on_request=on_request, max_handlers=2) as server:
        client = await Connection.connect("127.0.0.1", server.port)
        asking = [asyncio.create_task(client.request(b"%d" % i)) for i in range(10)]
        await until(lambda: server.connections and not next(iter(server.connections)).reading)
        await client.close(timeout=0.5)
        await until(lambda: not server.connections, "the server let the connection go")
        assert started and sorted(cancelled) == sorted(started)  # every handler let go
        for task in asking:
            task.cancel()
        await asyncio.gather(*asking, return_exceptions=True)
