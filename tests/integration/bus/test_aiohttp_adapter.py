"""Contract of pipeline.bus.aiohttp_adapter with aiohttp: fails loudly when an upgrade breaks it.

The adapter relies on aiohttp behaviour that is not documented (see its
docstring). Each test here checks one such fact directly on a bare
BoundedServer, so a failure names the fact, not some bus symptom.
"""

from __future__ import annotations

import asyncio
import inspect

import aiohttp
import pytest
from aiohttp import web

from pipeline.bus import aiohttp_adapter
from pipeline.bus.aiohttp_adapter import BoundedServer

pytestmark = pytest.mark.timeout(30)

UPGRADE = (
    f"aiohttp {aiohttp.__version__} broke a private contract of pipeline/bus/aiohttp_adapter.py "
    "(checked on {tested}): re-check the adapter against this aiohttp before shipping"
)


def _broken() -> str:
    return UPGRADE.format(tested=aiohttp_adapter.TESTED)


async def _hello(request: web.BaseRequest) -> web.Response:
    return web.Response(text="hi")


async def _serve(server: web.Server) -> tuple[asyncio.Server, int]:
    loop = asyncio.get_running_loop()
    listener = await loop.create_server(server, "127.0.0.1", 0)
    return listener, listener.sockets[0].getsockname()[1]


def test_the_private_names_still_exist():
    assert hasattr(web.Server, "connection_made"), _broken()
    assert list(inspect.signature(web.Server.connection_made).parameters) == [
        "self",
        "handler",
        "transport",
    ], _broken()
    assert isinstance(inspect.getattr_static(web.Server, "connections"), property), _broken()
    assert callable(getattr(web.RequestHandler, "force_close", None)), _broken()


def test_the_version_was_checked():
    """A new aiohttp minor: run this file, then add it to TESTED (or fix the adapter)."""
    assert aiohttp_adapter.aiohttp_version() in aiohttp_adapter.TESTED, _broken()


async def test_connections_past_the_cap_are_closed_on_arrival():
    server = BoundedServer(_hello, max_connections=2, keepalive_timeout=30)
    listener, port = await _serve(server)
    try:
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(reader.read(), 5) == b"", _broken()
        writer.close()
        for hold_reader, hold_writer in held:  # the first two still get answers
            hold_writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await asyncio.wait_for(hold_reader.readline(), 5)).startswith(b"HTTP/1.1 200")
            hold_writer.close()
    finally:
        await server.shutdown(1)
        listener.close()
        await listener.wait_closed()


async def test_keepalive_timeout_closes_a_connection_that_never_sent_a_request():
    server = BoundedServer(_hello, max_connections=8, keepalive_timeout=0.5)
    listener, port = await _serve(server)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        # without the keep-alive timeout the server would hold it open: the limit
        # only bounds that hang
        assert await asyncio.wait_for(reader.read(), 60) == b"", _broken()
        writer.close()
    finally:
        await server.shutdown(1)
        listener.close()
        await listener.wait_closed()
