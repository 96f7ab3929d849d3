"""Catch-ups read the Redis tail through the script that leaves oversized entries in Redis.

The tail index, a catch-up's tail pages and its replay after the plan all read
entries by id range; a hostile 20 MB entry there was sent to ``sluice serve``
once per reader (42 MB here for two entries; seconds of socket reads on the
event loop of a loaded server). Now it never leaves Redis: counted as refused,
and the good blocks around it are served.
"""

from __future__ import annotations

import asyncio
import contextlib

import msgpack
import redis

from pipeline import keys
from pipeline.blockcodec import ENTRY_FIELD, MAX_ENTRY_BYTES
from pipeline.chain.history.entries import Refusals
from pipeline.chain.history.resumption import TieredResumption
from pipeline.chain.history.tail import SharedTail
from pipeline.chain.history.tailread import READ_BYTES, FilteredReads
from pipeline.chain.metrics import Metrics
from pipeline.chain.produce.generator import SyntheticChain, write_blocks
from pipeline.chain.produce.producer import WebsocketHub
from pipeline.redisio.conn import Role, connect
from tests.support.poll import until

from .conftest import STREAM, CollectingSink

KEY = keys.stream(STREAM)


def _hostile(num: int, parent: bytes) -> bytes:
    body = {
        "num": num,
        "hash": b"\xee" * 32,
        "parent": parent,
        "updates": {"k": b"\0" * (20 << 20)},
    }
    out: bytes = msgpack.packb(body, use_bin_type=True)
    assert len(out) > MAX_ENTRY_BYTES
    return out


def _sent(client: redis.Redis) -> int:
    return int(client.info("stats")["total_net_output_bytes"])


async def test_a_catchup_never_fetches_an_oversized_tail_entry(
    redis_url, redis_client: redis.Redis
) -> None:
    gen = SyntheticChain(seed=31)
    first = gen.take(10)
    write_blocks(redis_client, STREAM, first)
    redis_client.xadd(KEY, {ENTRY_FIELD: _hostile(10, first[-1].hash)})  # in the indexed tail
    second = gen.take(10)
    write_blocks(redis_client, STREAM, second)
    metrics = Metrics()
    client = connect(redis_url, Role.SERVE)
    try:
        resumption = TieredResumption(
            redis=client, stream=STREAM, hub=WebsocketHub(), refused=Refusals(metrics)
        )
        before = _sent(redis_client)
        plan = await resumption.resolve(0, first[0].hash, None)  # the tail index reads past it
        # after the plan: met by the catch-up's replay
        redis_client.xadd(KEY, {ENTRY_FIELD: _hostile(20, second[-1].hash)})
        third = gen.take(5)
        write_blocks(redis_client, STREAM, third)
        sink = CollectingSink()
        task = asyncio.create_task(resumption.stream(plan, None, sink))
        try:
            await until(lambda: sink.head is not None or task.done(), "caught up", within_s=60)
            if task.done():
                task.result()
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        sent = _sent(redis_client) - before
    finally:
        await client.aclose()
    assert [(e.num, e.hash) for e in sink.blocks] == [
        (b.num, b.hash.hex()) for b in first + second + third
    ]
    assert metrics.values["sluice_serve_entries_refused_total"] == 2
    assert sent < 1 << 20, f"{sent} bytes sent by redis: a hostile entry left it"


async def test_a_range_past_the_byte_budget_is_read_in_several_calls(
    redis_url, redis_client: redis.Redis
) -> None:
    big = b"\1" * (MAX_ENTRY_BYTES - 100)  # under the bound: sent, but a few fill a call
    ids = [redis_client.xadd(KEY, {ENTRY_FIELD: big}) for _ in range(5)]
    ids += [redis_client.xadd(KEY, {ENTRY_FIELD: b"small"}) for _ in range(2)]
    client = connect(redis_url, Role.SERVE)
    try:
        reads = FilteredReads(client, KEY)
        page, more = await reads.page(b"-", b"+", 100)
        assert more and 1 < len(page) < 5 and len(page) * len(big) >= READ_BYTES
        entries = await reads.range(b"-", b"+")
        assert [eid for eid, _ in entries] == ids
        assert entries[-1][1] == {ENTRY_FIELD: b"small"}
        assert [eid for eid, _ in await reads.range(b"(" + ids[0], ids[5], 3)] == ids[1:4]
    finally:
        await client.aclose()


async def test_the_tail_index_reloads_the_script_a_server_lost(
    redis_url, redis_client: redis.Redis
) -> None:
    gen = SyntheticChain(seed=32)
    write_blocks(redis_client, STREAM, gen.take(5))
    client = connect(redis_url, Role.SERVE)
    try:
        tail = SharedTail(client, KEY)
        await tail.refresh()
        redis_client.script_flush()  # as a restarted or promoted server
        write_blocks(redis_client, STREAM, gen.take(5))
        await tail.refresh()
        assert len(tail) == 10 and tail.index.hi == 9
    finally:
        await client.aclose()
