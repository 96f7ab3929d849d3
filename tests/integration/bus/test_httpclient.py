"""The pooled HTTP/1.1 client against a real aiohttp server and raw sockets on loopback."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from pipeline.bus.httpclient import HttpError, HttpPool
from pipeline.localredis import free_port

pytestmark = pytest.mark.timeout(30)


async def test_keep_alive_reuse_and_peer_closing_idle_connections():
    peers: set[object] = set()

    async def echo(request: web.Request) -> web.Response:
        peers.add(request.transport.get_extra_info("peername") if request.transport else None)
        return web.Response(status=201, body=b"got:" + await request.read())

    app = web.Application()
    app.router.add_post("/x", echo)
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=0.2)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    pool = HttpPool(per_host=4)
    try:
        for i in range(5):
            assert await pool.post(f"http://127.0.0.1:{port}/x", str(i).encode(), {}) == (
                201,
                f"got:{i}".encode(),
            )
        assert len(peers) == 1  # one pooled connection served all five
        await asyncio.sleep(0.6)  # the server drops the idle connection
        assert await pool.post(f"http://127.0.0.1:{port}/x", b"again", {}) == (201, b"got:again")
        many = await asyncio.gather(
            *(pool.post(f"http://127.0.0.1:{port}/x", b"m", {}) for _ in range(20))
        )
        assert all(r == (201, b"got:m") for r in many)
    finally:
        pool.close()
        await runner.cleanup()


async def raw_server(reply: bytes | None) -> tuple[asyncio.Server, int]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        if reply is None:
            await asyncio.sleep(5)
        else:
            writer.write(reply)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


@pytest.mark.parametrize(
    ("reply", "text"),
    [
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", "chunked"),
        (b"SMTP ready\r\n\r\n", "bad status line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", "connection failed"),
        (b"", "closed by the peer"),
        (None, "no response"),
    ],
)
async def test_bad_responses_are_errors(reply, text):
    server, port = await raw_server(reply)
    pool = HttpPool(deadline_s=0.5)
    try:
        with pytest.raises(HttpError, match=text):
            await pool.post(f"http://127.0.0.1:{port}/x", b"{}", {})
    finally:
        pool.close()
        server.close()
        await server.wait_closed()


async def test_refused_and_non_http_urls():
    pool = HttpPool()
    with pytest.raises(HttpError, match="cannot connect"):
        await pool.post(f"http://127.0.0.1:{free_port()}/x", b"", {})
    with pytest.raises(ValueError, match="plain http"):
        await pool.post("https://example.invalid/x", b"", {})
