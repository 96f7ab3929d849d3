"""Serve after its Redis lost its data (FLUSHALL, a restart without persistence).

The lake holds what was archived; the blocks Redis held above it are gone for
good. A subscriber live through the loss goes on with the blocks written after
it; one resuming below the loss is told "history gap" in one line (never a
hang, never a block twice); one resuming above it is served."""

from __future__ import annotations

import asyncio

import pytest

from pipeline.chain.produce.generator import SyntheticChain, write_blocks

from .conftest import STREAM, write_lake


async def test_serve_after_redis_lost_the_tail(settings, serve, connect, redis_client) -> None:
    gen = SyntheticChain(seed=41)
    blocks = gen.take(60)
    write_lake(settings.lake.uri, blocks[:50])
    write_blocks(redis_client, STREAM, blocks[40:60])
    async with serve(settings) as (base, _app), connect(base) as live:
        await live.subscribe(0, blocks[0].hash)
        got = await live.blocks(60)
        assert [b.num for b in got] == list(range(60))
        redis_client.flushall()
        await asyncio.sleep(0.5)
        more = gen.take(5)
        write_blocks(redis_client, STREAM, more)
        after = await live.blocks(5, wait_s=20)
        assert [b.num for b in after] == list(range(60, 65))
        assert [b.hash for b in after] == [b.hash for b in more]

        for start in (0, 45, 55):  # from below the loss: 50..59 are nowhere
            async with connect(base) as late:
                await late.subscribe(start, blocks[start].hash)
                with pytest.raises(ConnectionError, match="1011.*history gap") as end:
                    await late.blocks(65 - start, wait_s=20)
                assert "resubscribe later" in str(end.value)

        async with connect(base) as above:  # from above the loss: Redis has it
            await above.subscribe(62, more[2].hash)
            got = await above.blocks(3, wait_s=20)
            assert [b.hash for b in got] == [b.hash for b in more[2:]]
        async with connect(base) as again:  # the live one's resume: its head, in Redis
            await again.subscribe(64, more[4].hash)
            assert [b.num for b in await again.blocks(1)] == [64]
