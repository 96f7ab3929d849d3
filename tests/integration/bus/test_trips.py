"""Redis round trips of the bus's queue loops: none wasted between batches.

Every round trip costs a bus a redis-py call and a wake-up (and a lone call its
latency), so a loop that already knows a queue is empty must go straight back
to its blocking wait.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import pytest
import redis.asyncio as aioredis

from pipeline import keys

from .conftest import eventually

pytestmark = pytest.mark.timeout(60)


def request(dst: int) -> tuple[str, str]:
    ret = str(uuid.uuid4())
    doc = {
        "ver": 1, "uid": "", "cmd": "x.y", "exp": 60, "try": 4, "dat": "", "src": 0,
        "dst": [dst], "ret": ret, "shm": "", "now": int(time.time()), "err": "",
    }  # fmt: skip
    return ret, json.dumps(doc)


async def test_a_loop_claims_no_batch_apart_from_its_wait_and_transaction(twins):
    """A lone request costs the local loop its wait and its transaction, no extra claim."""
    [a] = twins(1)
    bus = await a.start_bus()
    claims = 0
    claim = bus.store.claim

    async def counted(queue: str, count: int) -> list[bytes]:
        nonlocal claims
        claims += 1
        return await claim(queue, count)

    client = aioredis.Redis.from_url(a.url)
    try:
        # warm-up: the claim script is loaded (a first EVALSHA may meet NOSCRIPT)
        ret, body = request(dst=9999)
        await client.rpush(keys.BUS_LOCAL, body)
        assert await client.blpop([ret], timeout=30) is not None
        bus.store.claim = counted  # type: ignore[method-assign]
        for _ in range(20):
            ret, body = request(dst=9999)  # unknown twin: answered by the local loop
            await client.rpush(keys.BUS_LOCAL, body)
            popped: Any = await client.blpop([ret], timeout=30)
            assert json.loads(popped[1])["err"] == "destination not found"

        async def idle() -> bool:  # back in its wait, with nothing in flight
            return await client.llen(keys.bus_inflight(keys.BUS_LOCAL)) == 0

        await eventually(idle)
        assert claims == 0
    finally:
        await client.aclose()


async def test_a_batch_writes_its_backlog_as_one_packed_argument(twins):
    """The backlog entries and deadlines of a batch go as one argument, not two each
    (redis-py packs every argument in Python: microseconds per argument)."""
    a, b = twins(2)  # b never starts: the requests wait in a's backlog
    await a.start_bus()
    client = aioredis.Redis.from_url(a.url)
    watcher = aioredis.Redis.from_url(a.url)
    longest: dict[str, int] = {}
    try:
        async with watcher.monitor() as monitor:

            async def watch() -> None:
                while True:
                    command = (await monitor.next_command())["command"]
                    name = command.split(" ", 1)[0].upper()
                    longest[name] = max(longest.get(name, 0), len(command.split(" ")))

            watching = asyncio.create_task(watch())
            try:
                bodies = [request(dst=b.id) for _ in range(100)]
                await client.rpush(keys.BUS_LOCAL, *(body for _, body in bodies))

                async def recorded() -> bool:
                    return await client.zcard(keys.bus_expiry()) == 100

                await eventually(recorded)
            finally:
                watching.cancel()
        assert await client.hlen(keys.BUS_BACKLOG) == 100
        deadlines = await client.zrange(keys.bus_expiry(), 0, -1, withscores=True)
        assert all(score > time.time() + 30 for _, score in deadlines)
        # (one argument per entry would be HSET backlog uid body ... : 201 words)
        assert longest.get("HSET", 0) < 10 and longest.get("ZADD", 0) < 10
    finally:
        await client.aclose()
        await watcher.aclose()
