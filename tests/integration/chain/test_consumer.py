"""The subscriber library: ordered updates through reorgs and a server restart."""

from __future__ import annotations

import asyncio

import pytest
import redis
from aiohttp.test_utils import TestServer

from pipeline.chain.client.consumer import subscribe
from pipeline.chain.client.ordered import Added, Removed
from pipeline.chain.produce.generator import SyntheticChain, write_blocks
from pipeline.chain.serve.server import create_app
from pipeline.errors import BadParams

from .conftest import STREAM


async def test_updates_follow_reorgs_and_survive_a_server_restart(
    settings, redis_client: redis.Redis
) -> None:
    gen = SyntheticChain(seed=41, reorg_every=7, reorg_depth=2)
    write_blocks(redis_client, STREAM, gen.take(20))
    server = TestServer(create_app(settings), host="127.0.0.1", shutdown_timeout=5)
    await server.start_server()
    port = server.port
    url = f"ws://127.0.0.1:{port}/ws"
    state: dict[int, bytes] = {}
    removed = 0
    producer: asyncio.Task[None] | None = None
    restarted: TestServer | None = None

    async def produce_live() -> None:
        for _ in range(40):  # reorgs while the subscriber is live: it sees removals
            await asyncio.sleep(0.025)
            write_blocks(redis_client, STREAM, gen.step())  # done right after the last write

    def at_head() -> bool:
        return state.get(gen.canonical[-1].num) == gen.canonical[-1].hash

    updates = subscribe(url, 0, None, retry_delay_s=0.05)
    try:
        async with asyncio.timeout(60):
            async for update in updates:
                if isinstance(update, Added):
                    state[update.block.num] = update.block.hash
                else:
                    assert isinstance(update, Removed)
                    assert state.pop(update.num) == update.hash
                    removed += 1
                if restarted is None and at_head():
                    await server.close()  # the subscriber must reconnect by itself
                    write_blocks(redis_client, STREAM, gen.take(5))
                    restarted = TestServer(
                        create_app(settings), host="127.0.0.1", port=port, shutdown_timeout=5
                    )
                    await restarted.start_server()
                    producer = asyncio.create_task(produce_live())
                if producer is not None and producer.done() and at_head():
                    break
    finally:
        await updates.aclose()
        if producer is not None:
            await producer
        if restarted is not None:
            await restarted.close()
    assert state == {b.num: b.hash for b in gen.canonical}
    assert removed > 0 and gen.reorgs > 0


async def test_bad_patterns_raise(settings, serve, redis_client) -> None:
    async with serve(settings) as (base, _app):
        updates = subscribe(base.replace("http", "ws") + "/ws", 0, None, ["(("])
        with pytest.raises(BadParams, match="does not compile"):
            await anext(updates)
