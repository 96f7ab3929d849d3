"""Producers: the Redis stream producer, the hub, the mux (in-process mode) and its failure report."""

from __future__ import annotations

import redis.asyncio as aioredis

from pipeline import keys
from pipeline.blockcodec import ENTRY_FIELD, Block, decode_block
from pipeline.chain.produce.generator import SyntheticChain
from pipeline.chain.produce.producer import MuxProducer, RedisStreamProducer, WebsocketHub
from pipeline.chain.serve.server import HUB
from pipeline.errors import ChainError, MuxError

from .conftest import STREAM


class Failing:
    def __init__(self, name: str) -> None:
        self.name = name

    async def send(self, block: Block) -> None:
        raise ChainError(f"{self.name} is down")

    async def close(self) -> None:
        return None


async def test_mux_reports_every_failure_and_still_sends_to_the_others(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    block = SyntheticChain(seed=51).take(1)[0]
    mux = MuxProducer(
        [("a", Failing("a")), ("redis", RedisStreamProducer(client, STREAM)), ("b", Failing("b"))]
    )
    try:
        await mux.send(block)
    except MuxError as exc:
        assert [name for name, _ in exc.failures] == ["a", "b"]
        assert "a is down" in str(exc) and "b is down" in str(exc)
    else:
        raise AssertionError("MuxError expected")
    entries = await client.xrange(keys.stream(STREAM))
    assert [decode_block(f[ENTRY_FIELD]) for _, f in entries] == [block]
    await client.aclose()


async def test_in_process_mode_through_the_mux(settings, serve, connect, redis_url: str) -> None:
    gen = SyntheticChain(seed=52)
    hub = WebsocketHub()
    client = aioredis.Redis.from_url(redis_url)
    mux = MuxProducer([("redis", RedisStreamProducer(client, STREAM)), ("websocket", hub)])
    for block in gen.take(5):
        await mux.send(block)
    async with serve(settings, relay=False, hub=hub) as (base, app), connect(base) as sub:
        assert app[HUB] is hub
        await sub.subscribe(0, gen.canonical[0].hash)
        got = await sub.blocks(5)
        for block in gen.take(10):
            await mux.send(block)
        got += await sub.blocks(10)
    await mux.close()
    assert got == gen.canonical[:15]
    assert hub.published == 15
