"""Read deadlines of a Connection: first frame, per frame, idle (and what does not count as idle)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

Connect = Callable[..., Awaitable[Any]]


async def test_idle_close_waits_for_outstanding_requests(connect: Connect) -> None:
    async def slow(data: bytes) -> bytes:
        await asyncio.sleep(0.8)
        return data

    client, server = await connect({}, {"idle_timeout": 0.3, "on_request": slow})
    assert await asyncio.wait_for(client.request(b"x"), 5) == b"x"  # not cut while pending
    async with asyncio.timeout(5):
        await server.wait_closed()  # then idle: closed the seed's way
    assert server.close_reason == "closed" and server.error is None


async def test_traffic_keeps_a_connection_alive(connect: Connect) -> None:
    # 3 s of ticks 0.1 s apart against a 1 s idle timeout (a tick late by 0.9 s under
    # load would still be in time)
    client, server = await connect({}, {"idle_timeout": 1.0, "on_message": lambda d: None})
    for _ in range(30):
        await client.send_message(b"tick")
        await asyncio.sleep(0.1)
    assert not server.closed


async def test_first_frame_deadline_counts_only_until_the_first_frame(connect: Connect) -> None:
    client, server = await connect({}, {"first_frame_timeout": 0.3, "on_message": lambda d: None})
    await client.send_message(b"first")
    await asyncio.sleep(0.6)  # past the first-frame deadline: it no longer applies
    assert not server.closed
    await client.send_message(b"second")


async def test_frame_deadline_cuts_a_slow_frame(connect: Connect) -> None:
    client, server = await connect({}, {"frame_timeout": 0.3})
    writer = client.channel.writer
    writer.write(b"\x08\x00\x00\x00\x00\x00\x00\x10\x00")  # 4 KiB announced ...
    for _ in range(20):
        if server.closed:
            break
        writer.write(b"z")  # ... arriving a byte at a time
        await asyncio.sleep(0.05)
    async with asyncio.timeout(5):
        await server.wait_closed()
    assert server.error is not None and "frame too slow" in str(server.error)


async def test_queued_messages_are_bounded_in_bytes(connect: Connect) -> None:
    """A stalled async message handler: the peer's big messages stop being read at the bound."""
    release = asyncio.Event()
    got: list[bytes] = []

    async def slow(data: bytes) -> None:
        await release.wait()
        got.append(data)

    limit = 1 << 20
    client, server = await connect({}, {"on_message": slow, "max_queued_bytes": limit})
    chunk = 256 << 10
    sender = asyncio.gather(*(client.send_message(bytes([i]) * chunk) for i in range(40)))
    async with asyncio.timeout(10):
        while server._runner.queued_bytes < limit:  # noqa: ASYNC110 - no event for this
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)  # then give the reader every chance to over-read
    queued = server._runner.queued_bytes
    assert queued <= limit + (256 << 10) + (1 << 20) + chunk, queued
    release.set()
    await asyncio.wait_for(sender, 10)
    async with asyncio.timeout(10):
        while len(got) < 40:  # noqa: ASYNC110 - the handler has no completion event
            await asyncio.sleep(0.01)
    assert [m[0] for m in got] == list(range(40))
