"""BusClient and BusServer as async context managers; close() stops serve() and waits."""

from __future__ import annotations

import asyncio

from pipeline.bus import BusClient, BusServer
from pipeline.bus.envelope import Envelope


async def test_close_stops_a_running_serve_and_waits_for_it(redis_url: str) -> None:
    async with BusServer.from_url(redis_url, workers=2) as server:

        @server.handler("lifecycle.echo")
        async def echo(data: bytes, request: Envelope) -> bytes:
            return data

        serving = asyncio.create_task(server.serve())
        await asyncio.sleep(0)  # serve() started its workers
        closes = [asyncio.create_task(server.close()) for _ in range(2)]
        await asyncio.gather(*closes)
        assert serving.done()  # close() returned only after serve() ended
        await serving  # and it ended cleanly, not with an error
    await server.close()  # a third time, after the context: nothing left to do


async def test_client_is_an_async_context_manager(redis_url: str) -> None:
    async with BusClient.from_url(redis_url) as bus:
        assert await bus.redis.ping()
    await bus.close()  # twice: fine
