"""No oversized entry leaves Redis for serve, wherever it sits (issue 32, item 7).

The live tailer and the catch-ups' pages already read the chain stream through the
filtering script, but the tail index's refresh read the stream's first and newest
entries whole (``XRANGE``/``XREVRANGE COUNT 1``), so did the live tailer's start, and
the status page's tail (``XREAD``) and hot window (``XINFO STREAM``) read every entry
arriving live and both ends whole: 20-100 MB through serve's event loop for hostile
entries it then refused. Here hostile entries sit at both ends of a real Redis
stream and more arrive while a subscriber catches up and follows; Redis sends serve
less than one of them in all, and the subscriber gets every good block.
"""

from __future__ import annotations

from typing import cast

import aiohttp
import pytest
import redis

from pipeline import keys
from pipeline.blockcodec import ENTRY_FIELD, MAX_ENTRY_BYTES
from pipeline.chain.history.tailread import FilteredReads
from pipeline.chain.produce.generator import SyntheticChain, write_blocks
from pipeline.redisio.conn import Role, connect

from .conftest import STREAM

pytestmark = pytest.mark.timeout(120)

#: Each hostile entry: twice what serve reads of any entry.
HOSTILE = 2 * MAX_ENTRY_BYTES


def _sent(client: redis.Redis) -> int:
    return int(client.info("stats")["total_net_output_bytes"])


def _hostile(client: redis.Redis, count: int = 1) -> None:
    for _ in range(count):
        client.xadd(keys.stream(STREAM), {ENTRY_FIELD: b"\x00" * HOSTILE})


async def test_hostile_entries_at_the_ends_and_live_never_leave_redis(
    settings, serve, connect, redis_factory
) -> None:
    server = redis_factory()
    client = redis.Redis.from_url(server.url)
    gen = SyntheticChain(seed=71)
    _hostile(client)  # the stream's first entry
    write_blocks(client, STREAM, gen.take(20))
    _hostile(client)  # its newest entry
    before = _sent(client)
    try:
        async with serve(settings.replace(redis_url=server.url)) as (base, _app):
            async with aiohttp.ClientSession() as http:
                # /healthz's head before any live block: from Redis's newest entry (hostile)
                assert await _status(http, base, "/healthz") in (200, 503)
                async with connect(base) as sub:
                    await sub.subscribe(0, gen.canonical[0].hash)
                    assert await sub.blocks(20) == gen.canonical[:20]
                    _hostile(client, 3)  # arriving live, then good blocks after them
                    write_blocks(client, STREAM, gen.take(2))
                    assert await sub.blocks(2) == gen.canonical[20:22]
                assert await _status(http, base, "/status.json") == 200
            sent = _sent(client) - before
    finally:
        client.close()
    assert sent < HOSTILE // 2, f"redis sent {sent} bytes: a hostile entry left it"


async def _status(http: aiohttp.ClientSession, base: str, path: str) -> int:
    async with http.get(base + path) as resp:
        await resp.read()
        return resp.status


async def test_ends_name_the_stream_by_ids_alone(redis_url: str, redis_client: redis.Redis) -> None:
    client = connect(redis_url, Role.SERVE)
    reads = FilteredReads(client, keys.stream(STREAM))
    try:
        assert await reads.ends() == (0, None, None)  # no such stream
        ids = [redis_client.xadd(keys.stream(STREAM), {ENTRY_FIELD: b"x"}) for _ in range(3)]
        _hostile(redis_client)  # the newest entry
        ids.append(cast(bytes, redis_client.xrevrange(keys.stream(STREAM), count=1)[0][0]))
        assert await reads.ends() == (4, ids[0], ids[3])
        assert await reads.ends(2) == (4, ids[0], ids[2])
        assert await reads.ends(9) == (4, ids[0], ids[0])  # fewer entries: the oldest
        redis_client.xtrim(keys.stream(STREAM), maxlen=0)
        assert await reads.ends() == (0, None, None)  # emptied: no ids
    finally:
        await client.aclose()
