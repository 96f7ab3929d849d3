"""The websocket writer (aiohttp's public send_frame) serves lake, tail and live blocks in order."""

from __future__ import annotations

import redis

from pipeline.chain.generator import SyntheticChain, write_blocks

from .conftest import STREAM, write_lake


async def test_lake_tail_and_live_in_order_through_the_public_writer(
    settings, serve, connect, redis_client: redis.Redis
) -> None:
    chain = SyntheticChain(seed=7)
    write_lake(settings.lake.uri, chain.take(600))
    write_blocks(redis_client, STREAM, chain.take(100))
    async with serve(settings) as (base, _app), connect(base) as client:
        await client.subscribe(0, chain.canonical[0].hash)
        got = await client.blocks(700)
        write_blocks(redis_client, STREAM, chain.take(50))
        got += await client.blocks(50)
    assert got == chain.canonical[:750]
