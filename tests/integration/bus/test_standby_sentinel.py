"""A twin's active bus and its standby on Sentinel, the master killed under calls
(issue 31, item 1): one bus stays active across the failover, every call answered once."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from redis.exceptions import RedisError

from pipeline import keys
from pipeline.redisio import conn as redisconn

from .conftest import eventually
from .test_ha import on_sentinel
from .test_process import seed_request, serve, stop
from .test_standby import Handler, started_buses

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def buses() -> Any:
    yield from started_buses()


async def _retrying(step: Any) -> Any:
    """A client step, again while the master is away (the failover takes a few seconds)."""
    for _ in range(200):
        try:
            return await step()
        except (RedisError, OSError):
            await asyncio.sleep(0.1)
    raise AssertionError("redis did not come back")


async def test_active_and_standby_on_sentinel_survive_the_masters_death(
    twins: Any, buses: Any, redis_sentinels: Any, sentinel_url: str
) -> None:
    a, b = twins(2)
    on_sentinel(a, sentinel_url)
    b.spawn()
    handler = Handler()
    _, task = serve(b, work=handler.work)
    first = buses(a, "first")
    second = buses(a, "second")
    ra = redisconn.connect(sentinel_url, redisconn.Role.CLI)
    rets: list[str] = []
    try:

        async def push(i: int) -> None:
            docs = [seed_request("work", [b.id], str(j).encode(), exp=60) for j in range(i, i + 5)]
            await _retrying(lambda: ra.rpush(keys.BUS_LOCAL, *[json.dumps(d) for d in docs]))
            rets.extend(d["ret"] for d in docs)

        for i in range(0, 100, 5):
            await push(i)
        await eventually(lambda: len(handler.executions) >= 60)
        dead = redis_sentinels.kill_master()
        await asyncio.to_thread(redis_sentinels.wait_failed_over, dead)
        for i in range(100, 200, 5):
            await push(i)
            await asyncio.sleep(0.02)
        answers: dict[str, Any] = {}
        deadline = time.monotonic() + 60
        while len(answers) < len(rets) and time.monotonic() < deadline:
            pending = [r for r in rets if r not in answers][:200]
            popped = await _retrying(lambda p=pending: ra.blpop(p, timeout=1))
            if popped is not None:
                answers[popped[0].decode()] = json.loads(popped[1])
        await asyncio.sleep(1.0)
        extra = sum([await _retrying(lambda r=r: ra.llen(r)) for r in rets])
        roles = sorted([await first.role(), await second.role()])
    finally:
        await stop(task)
        await ra.aclose()
        await asyncio.to_thread(redis_sentinels.heal)
    assert extra == 0, f"{extra} calls answered twice"
    assert len(answers) == 200, f"{200 - len(answers)} calls never answered"
    failed = {r: ans["err"] for r, ans in answers.items() if ans["err"]}
    assert not failed, failed
    counts = handler.per_call()
    assert len(counts) == 200 and set(counts.values()) == {1}, counts.most_common(3)
    assert roles == ["active", "standby"], (first.log()[-2000:], second.log()[-2000:])
