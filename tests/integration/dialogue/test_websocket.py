"""Dialogue over aiohttp websockets (server and client side), a real HTTP server on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from pipeline.dialogue.connection import Connection
from pipeline.dialogue.duplex import Duplex
from pipeline.dialogue.protocol import Role
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
        assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
