"""The head ``/healthz`` reports: live first, then Redis's newest block, then the lake (read rarely)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio as aioredis

from pipeline import keys
from pipeline.chain.produce.generator import SyntheticChain, write_blocks
from pipeline.chain.produce.producer import LiveBlock, WebsocketHub
from pipeline.chain.serve.head import LAKE_EVERY_S, HeadFinder
from pipeline.errors import LakePathError
from tests.support.clock import HandClock

STREAM = "chain:head"


@dataclass
class _Row:
    num: int


class _Lake:
    """A history port whose canonical head is ``top`` (None: no block; an error: unreadable)."""

    def __init__(self, top: int | None | Exception) -> None:
        self.top = top

    def head(self, stream: str) -> _Row | None:
        assert stream == STREAM
        if isinstance(self.top, Exception):
            raise self.top
        return None if self.top is None else _Row(self.top)


async def test_live_then_redis_then_the_lake(redis_url: str, redis_client: redis.Redis) -> None:
    gen = SyntheticChain(seed=7)
    hub, lake = WebsocketHub(), _Lake(41)
    client: Any = aioredis.Redis.from_url(redis_url)
    history: Any = lambda: lake  # noqa: E731
    finder = HeadFinder(stream=STREAM, hub=hub, redis=client, history=history)
    try:
        assert await finder.head() == 41  # Redis holds no block: the lake's head
        blocks = gen.take(3)
        write_blocks(redis_client, STREAM, blocks)
        assert await finder.head() == 2  # Redis's newest block
        redis_client.xadd(keys.stream(STREAM), {b"other": b"x"})  # not a block: the lake's again
        assert await finder.head() == 41
        hub.publish(LiveBlock.from_block(blocks[1]))
        assert await finder.head() == 1  # what was published live stands
    finally:
        await client.aclose()


async def test_the_lake_is_read_at_most_every_few_seconds_and_a_bad_one_gives_none() -> None:
    clock = HandClock()
    lake = _Lake(10)
    history: Any = lambda: lake  # noqa: E731 (a History port: head() is all it needs here)
    finder = HeadFinder(
        stream=STREAM, hub=WebsocketHub(), redis=None, history=history, clock=clock.monotonic
    )
    assert await finder.head() == 10
    lake.top = 11
    assert await finder.head() == 10 and finder.lake_reads == 1
    clock.now += LAKE_EVERY_S
    assert await finder.head() == 11 and finder.lake_reads == 2
    lake.top = LakePathError("cannot read the lake table: the store refused the connection")
    clock.now += LAKE_EVERY_S
    assert await finder.head() is None
    lake.top = None
    clock.now += LAKE_EVERY_S
    assert await finder.head() is None and finder.lake_reads == 4
    no_lake = HeadFinder(stream=STREAM, hub=WebsocketHub(), redis=None, history=None)
    assert await no_lake.head() is None
