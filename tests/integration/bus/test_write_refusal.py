"""A bus handler (``BusServer``) whose reply Redis refuses (``maxmemory``, ``noeviction``).

The request was already popped from ``msgbus.$cmd`` when the reply is pushed: a
refused push must be pushed again once Redis takes writes, not logged and lost
(its caller would wait for ``exp`` and get "request expired").
"""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
import redis.asyncio as aioredis

from pipeline import keys
from pipeline.bus.server import BusServer
from tests.support.poll import until
from tests.support.refusal import refusing

from .test_process import seed_request


async def test_a_refused_reply_is_pushed_again_once_redis_takes_writes(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="pipeline.bus.server")
    client = aioredis.Redis.from_url(redis_url)
    server = BusServer.from_url(redis_url, workers=1)

    taken, release = asyncio.Event(), asyncio.Event()

    @server.handler("refusal.echo")
    async def echo(data: bytes, request: object) -> bytes:
        taken.set()
        await release.wait()
        return data

    request = seed_request("refusal.echo", [7], b"hello", uid="7.1", src=3)
    await client.rpush(keys.bus_command("refusal.echo"), json.dumps(request))
    task = asyncio.create_task(server.serve())
    try:
        # taken first (a server claims nothing while Redis refuses writes: a claim is
        # a move to its handling list, so what waits stays in the queue)
        await asyncio.wait_for(taken.wait(), 10)
        with refusing(redis_url):
            release.set()
            # The push was tried and refused (the server says so in its log).
            await until(
                lambda: any("repl" in r.getMessage() for r in caplog.records),
                "the reply's push refused",
                within_s=30,
            )
            assert await client.llen(keys.BUS_REPLY) == 0
        raw = await until(lambda: client.lpop(keys.BUS_REPLY), "the reply", within_s=30)
        reply = json.loads(raw)
        assert reply["uid"] == "7.1" and reply["err"] == "" and reply["dst"] == [3]
        assert server.served == 1 and server.retried > 0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await server.close()
        await client.aclose()
