"""Consumer pieces that need no Redis: its settings, entry-id order, the retry pause."""

from __future__ import annotations

import asyncio
import time

import pytest

from pipeline.errors import LocalProtocolError
from pipeline.routing.node import Node
from pipeline.streams.consumer import (
    RETRY_PAUSE_MAX_S,
    RETRY_PAUSE_S,
    Consumer,
    _id_key,
    retry_pause,
)


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


def test_the_retry_pause_doubles_is_capped_and_never_zero() -> None:
    for retry in range(1, 12):
        full = min(RETRY_PAUSE_S * 2 ** (retry - 1), RETRY_PAUSE_MAX_S)
        for _ in range(50):
            pause = retry_pause(retry, RETRY_PAUSE_MAX_S)
            assert full / 2 <= pause <= full
            assert pause > 0
    assert retry_pause(10_000, 0.2) <= 0.2  # no overflow however many retries


async def test_a_cancellation_during_the_retry_pause_propagates() -> None:
    """Cancelled in the pause after a failed attempt: the cancellation reaches the
    caller, the entry is neither retried nor dead-lettered."""
    calls = 0
    failed = asyncio.Event()

    async def failing(index: str, data: bytes) -> None:
        nonlocal calls
        calls += 1
        failed.set()
        raise ConnectionError("downstream blip")

    node = Node("n")
    consumer = Consumer("s", failing, client_id="c", holder="h", max_failures=3)
    consumer._node = node
    consumer._renewed = time.monotonic()  # a fresh lease: no renewal due before the pause
    task = asyncio.create_task(consumer._process([("1-0", b"m")]))
    await failed.wait()  # the failed attempt ran on into its pause without yielding
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
    assert calls == 1
    assert node.counters["consumer.handler_failures"] == 1
    assert node.counters["consumer.dead_lettered"] == 0
