"""DialogueServer over real TCP: many clients, server-initiated shutdown of all of them."""

from __future__ import annotations

import asyncio

import pytest

from pipeline.dialogue import protocol
from pipeline.dialogue.connection import Connection
from pipeline.dialogue.handlers import HandlerRunner
from pipeline.dialogue.packets import PacketType, encode_packet
from pipeline.dialogue.server import DialogueServer
from pipeline.errors import InternalProtocolError


async def upper(data: bytes) -> bytes:
    return data.upper()


async def test_many_clients_then_shutdown_closes_them_all() -> None:
    seen: list[Connection] = []

    async def on_connection(conn: Connection) -> None:
        seen.append(conn)

    async with DialogueServer(
        "127.0.0.1", 0, on_request=upper, on_connection=on_connection
    ) as server:
        clients = [await Connection.connect("127.0.0.1", server.port) for _ in range(5)]
        answers = await asyncio.gather(*(c.request(b"hi %d" % i) for i, c in enumerate(clients)))
        assert answers == [b"HI %d" % i for i in range(5)]
        assert len(server.connections) == 5 == len(seen)
    # Leaving the block closed every connection the seed's way: the clients closed cleanly.
    for client in clients:
        await asyncio.wait_for(client.wait_closed(), 5)
        assert client.close_reason == "closed"
        await client.close()
    assert not server.connections


async def test_refuses_over_the_connection_limit() -> None:
    async with DialogueServer("127.0.0.1", 0, on_request=upper, max_connections=1) as server:
        first = await Connection.connect("127.0.0.1", server.port)
        assert await first.request(b"a") == b"A"
        second = await Connection.connect("127.0.0.1", server.port)
        await asyncio.wait_for(second.wait_closed(), 5)  # refused: the socket is closed
        assert second.close_reason == "connection lost"
        await second.close()
        await first.close()


async def test_silent_sockets_do_not_lock_out_a_client() -> None:
    async with DialogueServer("127.0.0.1", 0, on_request=upper, max_connections=8) as server:
        silent = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(16)]
        for _ in range(500):  # the server accepts (and evicts) in its own time
            if server.evicted >= 8:
                break
            await asyncio.sleep(0.01)
        client = await Connection.connect("127.0.0.1", server.port)
        try:
            assert await asyncio.wait_for(client.request(b"a"), 5) == b"A"
            assert server.evicted >= 9 and len(server.connections) <= 8
        finally:
            await client.close()
            for _, writer in silent:
                writer.close()


async def test_a_silent_socket_is_closed_after_the_first_frame_timeout() -> None:
    async with DialogueServer("127.0.0.1", 0, first_frame_timeout=0.3) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        async with asyncio.timeout(5):
            assert await reader.read() == b""
        writer.close()


SECRET = "token=s3cr3t in /srv/sluice/handlers.py"


def _raise(*args: object) -> None:
    raise RuntimeError(SECRET)


@pytest.mark.parametrize("where", ["machine", "runner"])
async def test_a_bug_in_inbound_handling_closes_and_sends_the_peer_nothing_of_it(
    where: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug in the machine's packet handling or in the event dispatch above it (the reader's
    catch-all) closes the dialogue as an internal error: over TCP the peer sees the stream
    end and not a byte of the exception; the detail is in the local log."""
    if where == "machine":
        monkeypatch.setitem(protocol._RECEIVE, PacketType.MESSAGE, _raise)
    else:
        monkeypatch.setattr(HandlerRunner, "message_received", _raise)
    seen: list[Connection] = []

    async def on_connection(conn: Connection) -> None:
        seen.append(conn)

    async with DialogueServer("127.0.0.1", 0, on_connection=on_connection) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"".join(encode_packet(PacketType.MESSAGE, 0, b"boom")))
        received = await asyncio.wait_for(reader.read(), 5)  # until the server closes
        writer.close()
        await writer.wait_closed()
        assert b"s3cr3t" not in received and b"RuntimeError" not in received
        assert b"/srv" not in received
        (conn,) = seen
        await asyncio.wait_for(conn.wait_closed(), 5)
        assert isinstance(conn.error, InternalProtocolError)
        assert conn.error.public_message == "internal error"
    causes = [r.exc_info[1] for r in caplog.records if r.exc_info]
    assert any(isinstance(c, RuntimeError) and SECRET in str(c) for c in causes)
