"""A dead peer gets a few connection attempts, not one per waiting call (issue 31, item 4:
~87 a second, 15,784 retries for ~357 requests in 3 minutes); the calls keep their
``exp`` and are all answered once the peer is back."""

from __future__ import annotations

import asyncio
import collections

import pytest

from pipeline.bus.envelope import Envelope
from pipeline.errors import CallFailed

pytestmark = pytest.mark.timeout(90)

CALLS = 200
OUTAGE_S = 3.0


async def test_a_dead_peer_is_probed_not_flooded_and_every_call_survives(twins) -> None:
    a, b = twins(2)
    sender = await a.start_bus()  # retries from 0.05 s, capped at 0.5 s (conftest)
    connections = 0

    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        writer.close()  # a peer that answers nothing

    dead = await asyncio.start_server(refuse, "127.0.0.1", b.port)
    client = a.client()
    failed: list[str] = []
    answered: list[bytes] = []

    async def one(i: int) -> None:
        try:
            [got] = await client.call("echo", dst=[b.id], data=str(i).encode(), exp=60)
            answered.append(got)
        except CallFailed as exc:
            failed.append(str(exc))

    calls = [asyncio.create_task(one(i)) for i in range(CALLS)]
    ran: collections.Counter[bytes] = collections.Counter()
    serving = None
    try:
        await asyncio.sleep(OUTAGE_S)  # the outage itself, not a wait for a result
        dead.close()
        await dead.wait_closed()
        attempts = connections
        waiting = sender.forwarder.unreachable()
        await b.start_bus()
        server = b.server()

        @server.handler("echo")
        async def echo(data: bytes, request: Envelope) -> bytes:
            ran[data] += 1
            return data

        serving = asyncio.create_task(server.serve())
        await asyncio.gather(*calls)
    finally:
        for call in calls:
            call.cancel()
        if serving is not None:
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)
    # the first POSTs (16 at once, before it is known dead), then a probe at a time
    assert attempts <= 60, f"{attempts} connection attempts in {OUTAGE_S}s for {CALLS} calls"
    assert b.id in waiting
    assert failed == [] and len(answered) == CALLS
    assert set(ran.values()) == {1} and len(ran) == CALLS
