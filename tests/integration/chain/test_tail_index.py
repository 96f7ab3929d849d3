"""The shared tail index: incremental, trimmed with Redis, bounded, and stable under readers."""

from __future__ import annotations

import asyncio

from pipeline import keys
from pipeline.chain.history.tail import SharedTail
from pipeline.chain.produce.generator import SyntheticChain, write_blocks
from pipeline.redisio.conn import Role, connect
from tests.support.poll import until

from .conftest import STREAM, write_foreign_block

KEY = keys.stream(STREAM)


def ids(n: int, start: int = 1) -> list[str]:
    return [f"{start + i}-0" for i in range(n)]


async def test_refresh_reads_only_new_entries_and_follows_trims(redis_url, redis_client) -> None:
    gen = SyntheticChain(seed=51)
    blocks = gen.take(100)
    write_blocks(redis_client, STREAM, blocks[:60], ids=ids(60))
    client = connect(redis_url, Role.SERVE)
    try:
        tail = SharedTail(client, KEY)
        await tail.refresh()
        assert len(tail) == 60 and tail.index.lo == 0 and tail.index.hi == 59
        write_blocks(redis_client, STREAM, blocks[60:], ids=ids(40, 61))
        # blocks 0..39 archived and trimmed
        redis_client.xtrim(KEY, minid="41-0", approximate=False)
        await tail.refresh()
        assert len(tail) == 60 and tail.index.lo == 40 and tail.index.hi == 99
        assert blocks[10].hash.hex() not in tail.index.seen
        assert tail.index.chain[99][0] == blocks[99].hash.hex()
        # the stream deleted and written again from lower ids: the index starts over
        redis_client.delete(KEY)
        write_blocks(redis_client, STREAM, blocks[:5], ids=ids(5))
        await tail.refresh()
        assert len(tail) == 5 and tail.index.hi == 4 and tail.index.lo == 0
    finally:
        await client.aclose()


async def test_the_index_is_bounded(redis_url, redis_client) -> None:
    gen = SyntheticChain(seed=52)
    write_blocks(redis_client, STREAM, gen.take(3000))
    client = connect(redis_url, Role.SERVE)
    try:
        tail = SharedTail(client, KEY, max_entries=500)
        await tail.refresh()
        assert len(tail) == 500 and len(tail.index.chain) == 500
        assert tail.index.lo == 2500 and tail.index.hi == 2999
        assert len(tail.index.seen) == 500
    finally:
        await client.aclose()


async def test_readers_see_an_unchanging_index(redis_url, redis_client) -> None:
    gen = SyntheticChain(seed=53)
    write_blocks(redis_client, STREAM, gen.take(10))
    client = connect(redis_url, Role.SERVE)
    try:
        tail = SharedTail(client, KEY, writer_wait_s=5)
        await tail.refresh()
        release = asyncio.Event()
        seen_hi: list[int] = []

        async def reader() -> None:
            async with tail.reading() as index:
                seen_hi.append(index.hi)
                await release.wait()
                seen_hi.append(index.hi)

        holder = asyncio.create_task(reader())
        await asyncio.sleep(0)
        write_blocks(redis_client, STREAM, gen.take(5))
        refresh = asyncio.create_task(tail.refresh())
        # The refresh read Redis and closed the gate to new readers (no event says so).
        await until(lambda: not tail._gate.is_set(), "the refresh waits for the reader")
        assert not refresh.done()
        late = asyncio.create_task(reader())  # a new reader waits for the pending refresh
        for _ in range(5):
            await asyncio.sleep(0)  # (it would have taken the index within these turns)
        assert seen_hi == [9]
        release.set()
        await asyncio.gather(holder, refresh, late)
        assert seen_hi == [9, 9, 14, 14]
    finally:
        await client.aclose()


async def test_a_reader_that_holds_too_long_only_delays_the_refresh(
    redis_url, redis_client
) -> None:
    gen = SyntheticChain(seed=54)
    write_blocks(redis_client, STREAM, gen.take(10))
    client = connect(redis_url, Role.SERVE)
    try:
        tail = SharedTail(client, KEY, writer_wait_s=0.2)
        await tail.refresh()
        release = asyncio.Event()

        async def reader() -> None:
            async with tail.reading():
                await release.wait()

        holder = asyncio.create_task(reader())
        await asyncio.sleep(0)
        write_blocks(redis_client, STREAM, gen.take(5))
        await tail.refresh()  # gives up after writer_wait_s, index unchanged
        assert tail.index.hi == 9
        async with asyncio.timeout(1):
            async with tail.reading() as index:  # readers are not locked out
                assert index.hi == 9
        release.set()
        await holder
        await tail.refresh()
        assert tail.index.hi == 14
    finally:
        await client.aclose()


async def test_an_entry_past_the_largest_block_number_stays_out(redis_url, redis_client) -> None:
    gen = SyntheticChain(seed=55)
    blocks = gen.take(5)
    write_blocks(redis_client, STREAM, blocks[:3])
    poison_hash = write_foreign_block(redis_client, STREAM, 2**64 - 1, b"\x01" * 32, blocks[2].hash)
    write_blocks(redis_client, STREAM, blocks[3:])
    client = connect(redis_url, Role.SERVE)
    try:
        tail = SharedTail(client, KEY)
        await tail.refresh()
        assert tail.index.hi == 4 and sorted(tail.index.chain) == [0, 1, 2, 3, 4]
        assert poison_hash.hex() not in tail.index.seen
    finally:
        await client.aclose()
