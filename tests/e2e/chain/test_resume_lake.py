"""End to end with the real Spark jobs: archive, mark canonical, trim, then resume across the seam."""

from __future__ import annotations

import asyncio

import redis

from pipeline import keys
from pipeline.chain.produce.generator import SyntheticChain, write_blocks
from tests.integration.chain.conftest import STREAM


async def test_resume_across_spark_archive_and_trim(
    settings, serve, connect, redis_client: redis.Redis, spark
) -> None:
    from pipeline.lake.archive import archive_interval
    from pipeline.lake.canonical import mark_canonical
    from pipeline.lake.trim import safe_trim

    settings = settings.replace(streams=(STREAM,), chain_streams=(STREAM,), hot_retention_s=0)
    gen = SyntheticChain(seed=31, reorg_every=10, reorg_depth=2)
    emitted = gen.take(60)
    write_blocks(redis_client, STREAM, emitted, ids=[f"{1000 + i}-0" for i in range(len(emitted))])
    cut = 1000 + len(emitted) - 15  # archive all but the last 15 entries

    def lake_jobs() -> None:
        archive_interval(spark, settings, STREAM, 0, cut)
        mark_canonical(spark, settings, STREAM)
        safe_trim(settings, STREAM, now_ms=10**13)

    await asyncio.to_thread(lake_jobs)
    first = redis_client.xrange(keys.stream(STREAM), "-", "+", count=1)[0][0]
    assert first == f"{cut}-0".encode(), "safe_trim must have trimmed the archived entries"
    async with serve(settings) as (base, _app), connect(base) as client:
        await client.subscribe(0, gen.canonical[0].hash)
        got = await client.blocks(len(gen.canonical))
        live = gen.take(5)
        write_blocks(redis_client, STREAM, live)
        got += await client.blocks(len(live))
    pairs = [(b.num, b.hash) for b in got]
    assert len(pairs) == len(set(pairs))
    assert got[: len(gen.canonical) - len(live)] == gen.canonical[: len(gen.canonical) - len(live)]
    assert got[-len(live) :] == live
