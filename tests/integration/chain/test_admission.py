"""``sluice serve``'s door: a request head must come in time, and connections are capped.

The server runs as ``sluice serve`` runs it (an AppRunner behind
:meth:`ConnectionGuard.listen`); the peers are raw sockets that never finish
their upgrade request, or trickle it a byte at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from aiohttp import web

from pipeline.chain.produce.generator import SyntheticChain, write_blocks
from pipeline.chain.serve.appkeys import GUARD
from pipeline.chain.serve.server import create_app
from pipeline.settings import Settings
from tests.support.poll import until

from .conftest import STREAM, Client

UPGRADE = (
    b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
)


@asynccontextmanager
async def guarded(
    settings: Settings, middleware: Any = None
) -> AsyncIterator[tuple[str, int, web.Application]]:
    app = create_app(settings)
    if middleware is not None:  # a test's own, after the guard's
        app.middlewares.append(middleware)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    listener = await app[GUARD].listen(runner, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", port, app
    finally:
        listener.close()
        await runner.cleanup()
        await listener.wait_closed()


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def _metric(base: str, name: str) -> float:
    async with aiohttp.ClientSession() as http, http.get(base + "/metrics") as resp:
        assert resp.status == 200
        for line in (await resp.text()).splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return -1.0


async def test_peers_that_never_finish_their_request_head_are_closed(
    settings, redis_client
) -> None:
    gen = SyntheticChain(seed=221)
    write_blocks(redis_client, STREAM, gen.take(5))
    settings = settings.replace(serve_header_timeout_s=1.0)
    async with guarded(settings) as (base, port, app):
        fds_base = _fds()
        stop = asyncio.Event()
        peers: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        for _ in range(20):
            peers.append(await asyncio.open_connection("127.0.0.1", port))
        # Each answer is read as it comes: a trickler's byte after the server closed gets a
        # reset, and a reader that had not taken the 408 by then lost it (seen under load).
        answering = [asyncio.create_task(r.readline()) for r, _w in peers]
        for _reader, writer in peers[:10]:
            writer.write(UPGRADE)  # the head never ends (no blank line)

        async def trickle(writer: asyncio.StreamWriter, answer: asyncio.Task[bytes]) -> None:
            with contextlib.suppress(ConnectionError):
                for byte in UPGRADE * 100:  # one byte at a time, for ever as far as it knows
                    if stop.is_set() or writer.is_closing() or answer.done():
                        return
                    writer.write(bytes([byte]))
                    await writer.drain()
                    await asyncio.sleep(0.2)

        trickling = [
            asyncio.create_task(trickle(w, a))
            for (_r, w), a in zip(peers[10:], answering[10:], strict=True)
        ]
        try:
            # meanwhile a websocket subscriber, well past the deadline, is not cut
            async with aiohttp.ClientSession() as http, http.ws_connect(base + "/ws") as ws:
                client = Client(http, ws)
                head = gen.canonical[-1]
                await client.subscribe(head.num, head.hash)
                await client.blocks(1)
                answers = await asyncio.gather(*answering)
                assert all(a.startswith(b"HTTP/1.1 408") for a in answers), answers
                more = gen.take(3)
                write_blocks(redis_client, STREAM, more)
                assert await client.blocks(3) == more
        finally:  # a failed run leaves no socket behind for a later test's collection
            stop.set()
            for reading in answering:
                reading.cancel()  # those still waiting: a failed run
            await asyncio.gather(*trickling, *answering, return_exceptions=True)
            for _r, w in peers:
                w.close()
        assert await _metric(base, "sluice_serve_header_timeouts_total") == 20
        # 20 peers held 40 descriptors here (both ends); the Redis pool may have opened a few
        await until(
            lambda: _fds() <= fds_base + 8, "descriptors back near the baseline", within_s=30
        )


async def test_connections_past_the_cap_are_refused_with_503(settings) -> None:
    settings = settings.replace(serve_max_connections=10, serve_header_timeout_s=60.0)
    async with guarded(settings) as (base, port, app):
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(10)]
        await until(lambda: len(app[GUARD]) == 10, "10 connections admitted")
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        # (not /healthz nor /metrics: probes are served past the cap, test_serve_probes.py)
        writer.write(b"GET /status.json HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = await reader.read()
        assert answer.startswith(b"HTTP/1.1 503") and b"too many connections" in answer
        writer.close()
        for _r, w in held:
            w.close()
        await until(lambda: len(app[GUARD]) == 0, "held connections gone")

        # served again (the metrics page answers 200 whatever the health)
        assert await _metric(base, "sluice_serve_connections_refused_total") == 1


async def test_an_idle_keepalive_connection_is_closed_without_a_408(settings) -> None:
    settings = settings.replace(serve_header_timeout_s=1.0)
    async with guarded(settings) as (base, port, app):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 ")  # (503 here: no lake in this test)
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
        await reader.readexactly(length)
        assert await reader.read() == b""  # closed after the deadline, nothing written
        writer.close()
        assert await _metric(base, "sluice_serve_header_timeouts_total") == 0
