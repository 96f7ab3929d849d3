"""Stream client pieces that need no Redis."""

from __future__ import annotations

import asyncio

import pytest

from pipeline.errors import LocalProtocolError
from pipeline.routing.message import Address
from pipeline.routing.node import Node
from pipeline.streams.client import Consumer, StreamClient, _id_key


async def handler(index: str, data: bytes) -> None:
    return None


async def batch(entries: list[tuple[str, bytes]]) -> list[object]:
    return [None] * len(entries)


def test_a_consumer_needs_exactly_one_handler() -> None:
    with pytest.raises(LocalProtocolError):
        Consumer("s", client_id="c", holder="h")
    with pytest.raises(LocalProtocolError):
        Consumer("s", handler, batch_handler=batch, client_id="c", holder="h")
    assert Consumer("s", batch_handler=batch, client_id="c", holder="h").batch_handler is batch


def test_consumer_wait_is_bounded_by_the_lease() -> None:
    consumer = Consumer("s", handler, client_id="c", holder="h", wait_ms=5000, lease_ttl_ms=900)
    assert consumer.wait_ms == 300


def test_entry_id_order() -> None:
    assert _id_key("10-1") > _id_key("9-5") > _id_key("9-4") > _id_key("") == _id_key("junk")
    assert _id_key("7") == (7, 0)


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
