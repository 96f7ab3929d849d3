from __future__ import annotations

import redis

from pipeline.chain.produce.generator import SyntheticChain, write_blocks

from .conftest import STREAM, write_lake


async def test_subscribe_from_lake_then_redis_then_live(
    settings, serve, connect, redis_client: redis.Redis
) -> None:
    chain = SyntheticChain(seed=1)
    write_lake(settings.lake.uri, chain.take(50))
    write_blocks(redis_client, STREAM, chain.take(20))
    async with serve(settings) as (base, _app), connect(base) as client:
        await client.subscribe(10, chain.canonical[10].hash)
        got = await client.blocks(60)
        write_blocks(redis_client, STREAM, chain.take(5))
        got += await client.blocks(5)
    assert [b.num for b in got] == list(range(10, 75))
    assert got == chain.canonical[10:75]
