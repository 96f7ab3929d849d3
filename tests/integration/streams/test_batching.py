"""Messages that fit the node's limit one by one are never refused for being pushed together."""

from __future__ import annotations

import asyncio

import redis as sync_redis

from pipeline import keys
from pipeline.routing.message import Route, StreamAddress, TransportMessage
from pipeline.streams.publisher import Publisher
from pipeline.streams.pusher import split_pushes

from .conftest import MakeNode, eventually


def test_split_pushes_keeps_order_and_bounds_each_push() -> None:
    data = [bytes([i]) * (100 + 37 * i) for i in range(40)]
    chunks = split_pushes(data, 1000)
    assert [item for chunk in chunks for item in chunk] == data
    assert all(64 + sum(len(d) + 5 for d in chunk) <= 1000 for chunk in chunks if len(chunk) > 1)
    assert split_pushes([b"x" * 5000], 1000) == [[b"x" * 5000]]  # alone: the service says no
    assert split_pushes([], 1000) == []


async def test_concurrent_sends_through_the_transport_are_split_by_size(
    make_node: MakeNode, redis_client: sync_redis.Redis
) -> None:
    node, _ = await make_node("A", max_payload=20_000)
    route = Route([StreamAddress("b", "a").to_address(), "x"])
    payloads = [str(i).encode().ljust(2000, b".") for i in range(100)]
    dones = await asyncio.gather(
        *(node.deliver_tracked(TransportMessage(route, Route(["y"]), p)) for p in payloads)
    )
    outcomes = await asyncio.gather(*dones, return_exceptions=True)
    assert [o for o in outcomes if o is not None] == []
    stored = redis_client.xrange(keys.stream("b"))
    assert sorted(TransportMessage.decode(f[b"data"]).payload for _, f in stored) == sorted(
        payloads
    )
    assert node.counters["transport_errors"] == 0


async def test_a_publisher_batch_is_split_by_size(
    make_node: MakeNode, redis_client: sync_redis.Redis
) -> None:
    node, _ = await make_node("A", max_payload=20_000)
    await node.add_worker("pub", Publisher("s"))
    payloads = [str(i).encode().ljust(2000, b".") for i in range(100)]
    for payload in payloads:  # queued faster than pushed: the mailbox hands them over in batches
        await node.deliver(TransportMessage(Route(["pub"]), Route(), payload))
    await eventually(lambda: redis_client.xlen(keys.stream("s")) == 100)
    stored = [f[b"data"] for _, f in redis_client.xrange(keys.stream("s"))]
    assert stored == payloads
    assert node.counters["handler_errors"] == 0
