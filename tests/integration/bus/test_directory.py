"""The Redis form of the twin directory, and ``sluice bus register``."""

from __future__ import annotations

import json

import redis.asyncio as aioredis

from pipeline import keys
from pipeline.bus import cli
from pipeline.bus.directory import RedisDirectory
from pipeline.bus.signing import Signer


def test_register_command(redis_client, redis_url):
    key = Signer.generate().public_key
    argv = ["register", "--twin", "7", "--url", "http://h:1/", "--key", key, "--redis", redis_url]
    assert cli.main(argv) == 0
    entry = json.loads(redis_client.hget(keys.bus_directory(), "7"))
    assert entry == {"url": "http://h:1", "key": key}


async def test_lookup_and_broken_entries(redis_url):
    key = Signer.generate().public_key
    client = aioredis.Redis.from_url(redis_url)
    try:
        await RedisDirectory.register(client, 7, "http://h:1/", key)
        directory = RedisDirectory(client)
        peer = await directory.lookup(7)
        assert peer is not None and peer.url == "http://h:1" and peer.verifier is not None
        assert await directory.lookup(8) is None
        # a broken entry reads as "not found", never as a crash
        await client.hset(keys.bus_directory(), "9", "{not json")
        await client.hset(keys.bus_directory(), "10", '{"url": "ftp://x"}')
        assert await directory.lookup(9) is None and await directory.lookup(10) is None
    finally:
        await client.aclose()


async def test_call_with_redis_directory(twins):
    """Both buses find each other through the Redis hash instead of a file."""
    import asyncio

    from pipeline.bus.process import BusProcess

    from .test_process import echo, serve, stop

    a, b = twins(2)
    buses = []
    for me in (a, b):
        client = aioredis.Redis.from_url(me.url)
        me.closers.append(_Closer(client))
        for peer in (a, b):
            await RedisDirectory.register(
                client, peer.id, f"http://127.0.0.1:{peer.port}", peer.signer.public_key
            )
        bus = BusProcess(
            me.config(), redis_url=me.url, directory=RedisDirectory(client), signer=me.signer
        )
        await bus.start()
        buses.append(bus)
    _, task = serve(b, echo=echo)
    try:
        assert await asyncio.wait_for(a.client().call("echo", dst=[b.id], data=b"r"), 10) == [
            b"echo:r"
        ]
    finally:
        await stop(task)
        for bus in buses:
            await bus.stop()


class _Closer:
    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client

    async def close(self) -> None:
        await self.client.aclose()
