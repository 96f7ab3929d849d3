"""Publisher and Consumer workers: at-least-once, dead letters, leases, faults under a consumer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
import redis as sync_redis

from pipeline import keys
from pipeline.errors import LeaseHeld
from pipeline.local.redisserver import LocalRedis
from pipeline.routing.message import Route, TransportMessage
from pipeline.routing.node import Node
from pipeline.streams.consumer import Consumer
from pipeline.streams.publisher import Publisher
from tests.support.poll import until

from .conftest import MakeNode, eventually


class Sink:
    """A consumer handler that records data and fails on demand."""

    def __init__(self, fail_on: bytes | None = None) -> None:
        self.got: list[bytes] = []
        self.calls: dict[bytes, int] = {}
        self.fail_on = fail_on

    async def __call__(self, index: str, data: bytes) -> None:
        self.calls[data] = self.calls.get(data, 0) + 1
        if data == self.fail_on:
            raise ValueError(f"cannot handle {data!r}")
        self.got.append(data)


async def publish(node: Node, items: list[bytes], to: str = "pub") -> None:
    for item in items:
        await node.deliver(TransportMessage(Route([to]), Route(), item))


def items(start: int, stop: int) -> list[bytes]:
    return [f"m{i}".encode() for i in range(start, stop)]


async def start_consumer(
    node: Node, sink: Sink, *, stream: str = "s", client_id: str = "c", holder: str = "A", **kw: int
) -> Consumer:
    consumer = Consumer(stream, sink, client_id=client_id, holder=holder, wait_ms=100, **kw)
    await node.add_worker(f"consumer:{stream}:{holder}", consumer)
    return consumer


async def test_publish_consume_and_save_index(
    make_node: MakeNode, redis_client: sync_redis.Redis
) -> None:
    node, _ = await make_node("A")
    await node.add_worker("pub", Publisher("s"))
    sink = Sink()
    consumer = await start_consumer(node, sink)
    await publish(node, items(0, 50))
    await eventually(lambda: len(sink.got) == 50)
    assert sink.got == items(0, 50)
    last = redis_client.xrevrange(keys.stream("s"), count=1)[0][0].decode()
    await eventually(lambda: consumer.saved == last)
    assert consumer.index == last
    assert redis_client.hget(keys.consumer_index("s"), "c") == last.encode()
    assert node.counters["publisher.s.pushed"] == 50


async def test_consumer_restart_resumes_from_saved_index(make_node: MakeNode) -> None:
    node, _ = await make_node("A")
    await node.add_worker("pub", Publisher("s"))
    first = Sink()
    await start_consumer(node, first)
    await publish(node, items(0, 10))
    await eventually(lambda: len(first.got) == 10)
    await node.remove_worker("consumer:s:A")  # graceful: index saved, lease released
    await publish(node, items(10, 20))
    second = Sink()
    await start_consumer(node, second)
    await eventually(lambda: len(second.got) == 10)
    assert second.got == items(10, 20)


async def test_failing_entry_goes_to_dead_letter_and_stream_flows(
    make_node: MakeNode, redis_client: sync_redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    node, _ = await make_node("A")
    await node.add_worker("pub", Publisher("s"))
    sink = Sink(fail_on=b"m3")
    await start_consumer(node, sink, max_failures=3)
    await publish(node, items(0, 8))
    await eventually(lambda: len(sink.got) == 7 and node.counters["consumer.dead_lettered"] == 1)
    assert sink.calls[b"m3"] == 3
    assert b"m3" not in sink.got
    dead = redis_client.xrange(keys.dead_letter("s"))
    assert len(dead) == 1
    assert dead[0][1][b"data"] == b"m3"
    assert b"ValueError" in dead[0][1][b"reason"]
    assert node.counters["consumer.handler_failures"] == 3
    assert "dead-lettered" in caplog.text


async def test_second_node_is_refused_while_the_lease_lives(make_node: MakeNode) -> None:
    node_a, _ = await make_node("A")
    node_b, _ = await make_node("B")
    a = await start_consumer(node_a, Sink(), holder="A")
    await asyncio.wait_for(a.ready.wait(), 5)
    b = await start_consumer(node_b, Sink(), holder="B", client_id="c")
    await eventually(lambda: b.refused is not None)
    assert isinstance(b.refused, LeaseHeld)
    assert "consumed by 'A'" in str(b.refused)
    assert node_b.counters["consumer.lease_refused"] >= 1
    assert not b.ready.is_set()
    await node_a.remove_worker("consumer:s:A")  # releases the lease
    await asyncio.wait_for(b.ready.wait(), 10)


async def test_lease_is_renewed_while_the_consumer_lives(
    make_node: MakeNode, redis_client: sync_redis.Redis
) -> None:
    node_a, _ = await make_node("A")
    node_b, _ = await make_node("B")
    a = await start_consumer(node_a, Sink(), holder="A", lease_ttl_ms=300)
    await asyncio.wait_for(a.ready.wait(), 5)
    # Watch the lease's TTL go back up (a renewal) until it has outlived several TTLs:
    # only renewals keep it alive that long.
    lease = keys.consumer_lease("s")
    began, last, renewals = time.monotonic(), redis_client.pttl(lease), 0

    def renewed_past_ttls() -> bool:
        nonlocal last, renewals
        assert redis_client.get(lease) == b"A", "the lease expired or changed hands"
        ttl = redis_client.pttl(lease)
        renewals += ttl > last
        last = ttl
        return renewals >= 3 and time.monotonic() - began > 3 * 0.3

    await until(renewed_past_ttls, "three renewals of the lease, past three TTLs")
    b = await start_consumer(node_b, Sink(), holder="B", lease_ttl_ms=300)
    await eventually(lambda: b.refused is not None)
    assert not b.ready.is_set()


async def test_stream_deleted_under_a_consumer(
    make_node: MakeNode, redis_client: sync_redis.Redis
) -> None:
    node, _ = await make_node("A")
    await node.add_worker("pub", Publisher("s"))
    sink = Sink()
    consumer = await start_consumer(node, sink)
    await asyncio.wait_for(consumer.ready.wait(), 5)
    await publish(node, items(0, 5))
    await eventually(lambda: len(sink.got) == 5)
    redis_client.delete(keys.stream("s"))
    await eventually(lambda: node.counters["consumer.stream_missing"] >= 1)
    await publish(node, items(5, 10))
    await eventually(lambda: len(sink.got) == 10)
    assert sink.got == items(0, 10)


async def test_redis_restart_under_a_consumer_loses_nothing(
    make_node: MakeNode, redis_factory: Callable[..., LocalRedis]
) -> None:
    server = redis_factory(aof=True)
    node, _ = await make_node("A", url=server.url)
    await node.add_worker("pub", Publisher("s"))
    sink = Sink()
    await start_consumer(node, sink)
    await publish(node, items(0, 20))
    await eventually(lambda: len(sink.got) == 20)
    server.kill()
    await eventually(lambda: node.counters["consumer.errors"] >= 1)
    server.start()
    await publish(node, items(20, 40))
    await eventually(lambda: len(set(sink.got)) == 40, limit_s=20)
    assert set(sink.got) == set(items(0, 40))
