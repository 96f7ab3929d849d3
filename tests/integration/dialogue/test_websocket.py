"""Dialogue over aiohttp websockets (server and client side), a real HTTP server on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from pipeline.dialogue import protocol
from pipeline.dialogue.connection import Connection
from pipeline.dialogue.duplex import Duplex
from pipeline.dialogue.events import CloseCode
from pipeline.dialogue.packets import PacketType, encode_packet
from pipeline.dialogue.protocol import Dialogue, Role
from pipeline.errors import DialogueClosed


async def upper(data: bytes) -> bytes:
    return data.upper()


async def echo(d: Duplex) -> None:
    async for chunk in d:
        await d.send(chunk)


@pytest.fixture
async def ws_url() -> AsyncIterator[str]:
    async def handler(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        conn = Connection.over_websocket(ws, Role.SERVER, on_request=upper, on_duplex=echo)
        async with conn:
            await conn.wait_closed()
        return ws

    app = web.Application()
    app.router.add_get("/dialogue", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/dialogue"
    finally:
        await runner.cleanup()


async def test_requests_duplex_and_close_over_websocket(ws_url: str) -> None:
    async with aiohttp.ClientSession() as session, session.ws_connect(ws_url) as ws:
        conn = Connection.over_websocket(ws, Role.CLIENT)
        async with conn:
            got = await asyncio.gather(*(conn.request(b"r%d" % i, timeout=5) for i in range(50)))
            assert got == [b"R%d" % i for i in range(50)]
            async with conn.duplex() as d:
                for i in range(10):
                    await d.send(b"%d" % i * 1000)
                await d.end()
                assert [c async for c in d] == [b"%d" % i * 1000 for i in range(10)]
        assert conn.close_reason == "closed"
        with pytest.raises(DialogueClosed):
            await conn.request(b"after close")


async def test_text_frame_is_a_protocol_failure(ws_url: str) -> None:
    async with aiohttp.ClientSession() as session, session.ws_connect(ws_url) as ws:
        await ws.send_str("not binary")
        msg = await ws.receive(timeout=5)  # the server drops the dialogue and closes
        assert msg.type is aiohttp.WSMsgType.CLOSE
        assert (msg.data, msg.extra) == (CloseCode.PROTOCOL_ERROR, "binary only")


async def test_a_bug_in_inbound_handling_tells_the_peer_only_internal_error(
    ws_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A real websocket client sees close 1011 ``internal error``; the detail stays in our log."""
    secret = "token=s3cr3t in /srv/sluice/handlers.py"

    def broken(d: Dialogue, pid: int, data: bytes | None) -> None:
        raise RuntimeError(secret)

    monkeypatch.setitem(protocol._RECEIVE, PacketType.MESSAGE, broken)
    async with aiohttp.ClientSession() as session, session.ws_connect(ws_url) as ws:
        await ws.send_bytes(b"".join(encode_packet(PacketType.MESSAGE, 0, b"boom")))
        seen = []
        while (msg := await ws.receive(timeout=5)).type is aiohttp.WSMsgType.BINARY:
            seen.append(msg.data)  # anything the server sent before closing
        assert msg.type is aiohttp.WSMsgType.CLOSE
        assert (msg.data, msg.extra) == (CloseCode.INTERNAL_ERROR, "internal error")
        for text in [msg.extra, *map(repr, seen)]:
            assert "s3cr3t" not in text and "RuntimeError" not in text and "/srv" not in text
    logged = [r for r in caplog.records if r.exc_info and r.exc_info[1] is not None]
    assert any(secret in repr(r.exc_info[1]) for r in logged if r.exc_info)
