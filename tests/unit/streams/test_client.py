"""Stream client pieces that need no Redis."""

from __future__ import annotations

import pytest

from pipeline.errors import LocalProtocolError
from pipeline.streams.client import Consumer, _id_key


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
