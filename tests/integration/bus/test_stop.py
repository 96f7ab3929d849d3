"""A bus stopped under calls ends every task and gives its lease up, so the bus started
again is active at once (issue 31: the reverted 17a9bb3 failed test_outage with 'task
bus-seat did not stop in 5.0s', its restart standing by behind its own lease).

The cause: on Python 3.11, ``asyncio.wait_for`` (which redis-py awaits to send each
command) drops a cancellation that lands as the write completes; the seat and the
coalescer went on running after their stop (see pipeline/bus/tasks.py).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from typing import Any

import pytest

from pipeline.bus.envelope import Envelope
from pipeline.bus.lease import LEASE
from pipeline.bus.store import BusStore
from pipeline.errors import CallFailed
from pipeline.redisio import conn as redisconn
from tests.support.poll import until

pytestmark = pytest.mark.timeout(120)

CYCLES = 5


async def test_a_bus_stopped_under_calls_ends_and_its_restart_is_active_at_once(
    twins: Any, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = twins(2)
    await a.start_bus()
    await b.start_bus()
    ran: collections.Counter[bytes] = collections.Counter()
    server = b.server()

    @server.handler("echo")
    async def echo(data: bytes, request: Envelope) -> bytes:
        ran[data] += 1
        return data

    serving = asyncio.create_task(server.serve())
    client = a.client()
    answered: list[bytes] = []
    failed: list[str] = []
    gate = asyncio.Semaphore(24)

    async def one(i: int) -> None:
        async with gate:
            try:
                [got] = await client.call("echo", dst=[b.id], data=str(i).encode(), exp=60)
                answered.append(got)
            except CallFailed as exc:
                failed.append(str(exc))

    calls = [asyncio.create_task(one(i)) for i in range(400)]
    roles: list[str] = []
    rb = redisconn.connect(b.url, redisconn.Role.CLI)
    try:
        for cycle in range(CYCLES):
            await until(lambda n=cycle: len(answered) >= 40 * (n + 1), within_s=60)
            await b.stop_bus()
            assert await rb.get(LEASE) is None  # given up at the stop
            await b.start_bus()
            assert b.bus is not None
            roles.append(b.bus.role)
        await asyncio.gather(*calls)
    finally:
        for call in calls:
            call.cancel()
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        await rb.aclose()
    stuck = [r.getMessage() for r in caplog.records if "did not stop" in r.getMessage()]
    assert stuck == []
    assert roles == ["active"] * CYCLES  # not standing by behind its own lease
    assert failed == [] and len(answered) == 400
    assert set(ran.values()) == {1} and len(ran) == 400


async def test_the_coalescer_ends_after_a_cancellation_its_pipeline_dropped(
    redis_url: str,
) -> None:
    client = redisconn.connect(redis_url, redisconn.Role.BUS)
    store = BusStore(client)
    runner = asyncio.create_task(store.coalescer.run())
    entered = asyncio.Event()

    async def drops_a_cancel(pipe: Any) -> None:
        # what asyncio.wait_for does inside redis-py on Python 3.11 when the cancellation
        # lands as the command's write completes: the command goes on, the cancel is lost
        entered.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(3600)
        pipe.ping()

    try:
        caller = asyncio.create_task(store.coalescer.call(drops_a_cancel))
        await entered.wait()
        runner.cancel()
        done, _ = await asyncio.wait([runner], timeout=5)
        assert runner in done and runner.cancelled()  # not waiting for work forever
        await asyncio.gather(caller, return_exceptions=True)
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        await client.aclose()
