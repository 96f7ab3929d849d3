"""Stream client pieces that need no Redis."""

from __future__ import annotations

import asyncio

from pipeline.routing.message import Address
from pipeline.routing.node import Node
from pipeline.streams.client import StreamClient


async def test_an_abort_is_repeated_while_the_pull_still_runs() -> None:
    """redis-py may swallow a cancellation that lands while it sends a command; the
    abort of a pull served in the consumer's task cancels again until it stops."""
    client = StreamClient(Node("n"), Address.local("c"))
    swallowed = 0

    async def pull() -> str:
        task = asyncio.current_task()
        assert task is not None
        client._running["r"] = task
        try:
            try:
                try:
                    await asyncio.sleep(10)
                except asyncio.CancelledError:
                    nonlocal swallowed
                    swallowed += 1  # eaten, as redis-py may: the long poll goes on
                await asyncio.sleep(10)
            finally:
                del client._running["r"]
        except asyncio.CancelledError:
            assert client._took_abort("r")
            assert task.cancelling() == 0  # both cancellations taken back
            return "aborted"
        return "finished"

    job = asyncio.create_task(pull())
    await asyncio.sleep(0)
    client.abort_pulls()
    assert await asyncio.wait_for(job, 2) == "aborted"
    assert swallowed == 1
    assert not client._aborted
