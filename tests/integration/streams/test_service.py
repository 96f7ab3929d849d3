"""The stream service on a real redis-server, driven through routed messages only."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import redis as sync_redis

from pipeline import keys
from pipeline.errors import (
    LeaseHeld,
    PayloadTooLarge,
    RedisUnavailable,
    RemoteProtocolError,
    StreamNotFound,
)
from pipeline.local.redisserver import LocalRedis
from pipeline.routing.message import Route, TransportMessage
from pipeline.routing.node import Context, Node, Worker, WorkerContext
from pipeline.streams import protocol as p
from pipeline.streams.client import StreamClient, new_request_id
from pipeline.streams.service import StreamService

from .conftest import MakeNode, eventually


class Probe(Worker):
    """A worker that talks the stream protocol and keeps stray messages."""

    def __init__(self) -> None:
        self.client: StreamClient | None = None
        self.stray: list[TransportMessage] = []

    async def setup(self, wctx: WorkerContext) -> None:
        self.client = StreamClient(wctx.node, wctx.address, timeout_s=5)

    def intercept(self, message: TransportMessage) -> bool:
        assert self.client is not None
        return self.client.intercept(message)

    async def handle(self, ctx: Context) -> None:
        self.stray.append(ctx.message)


async def probe(node: Node) -> StreamClient:
    worker = Probe()
    await node.add_worker("probe", worker)
    assert worker.client is not None
    return worker.client


async def test_create_push_pull(make_node: MakeNode, redis_client: sync_redis.Redis) -> None:
    node, _ = await make_node("A")
    client = await probe(node)
    init = await client.create("orders")
    assert init.name == "orders"
    assert init.address == "stream_service:orders"
    confirm = await client.push(init.address, [b"one", b"two"], new_request_id())
    assert confirm.status == p.NEW
    assert len(confirm.indexes) == 2
    got = await client.pull(init.address, "0-0", 10, 0)
    assert [d for _, d in got.messages] == [b"one", b"two"]
    assert [i for i, _ in got.messages] == list(confirm.indexes)
    after = await client.pull(init.address, confirm.indexes[0], 10, 0)
    assert [d for _, d in after.messages] == [b"two"]
    assert redis_client.xlen(keys.stream("orders")) == 2
    assert redis_client.sismember(keys.streams_registry(), "orders")


async def test_push_is_idempotent(make_node: MakeNode, redis_client: sync_redis.Redis) -> None:
    node, _ = await make_node("A")
    client = await probe(node)
    address = (await client.create("s")).address
    first = await client.push(address, [b"a", b"b"], "req-1")
    again = await client.push(address, [b"a", b"b"], "req-1")
    assert again.status == p.DUPLICATE
    assert again.indexes == first.indexes
    assert redis_client.xlen(keys.stream("s")) == 2
    assert node.counters["stream_service.duplicate_pushes"] == 1


async def test_pull_is_a_long_poll(make_node: MakeNode) -> None:
    node, _ = await make_node("A", max_wait_ms=60_000)
    client = await probe(node)
    address = (await client.create("s")).address
    empty = await client.pull(address, "0-0", 10, 20)
    assert empty.messages == ()
    pull = asyncio.create_task(client.pull(address, "0-0", 10, 60_000))
    service = node.worker("stream_service")
    assert isinstance(service, StreamService)
    await eventually(lambda: service._active_pulls() == 1)  # in its XREAD BLOCK
    assert not pull.done()
    await client.push(address, [b"late"], new_request_id())
    got = await asyncio.wait_for(pull, 5)
    assert [d for _, d in got.messages] == [b"late"]


async def test_index_is_monotonic(make_node: MakeNode) -> None:
    node, _ = await make_node("A")
    client = await probe(node)
    assert await client.get_index("c", "s") == ""
    assert await client.save_index("c", "s", "5-1") == "5-1"
    assert await client.save_index("c", "s", "5-0") == "5-1"
    assert await client.save_index("c", "s", "4-9") == "5-1"
    assert await client.save_index("c", "s", "10-0") == "10-0"
    assert await client.get_index("c", "s") == "10-0"
    assert await client.get_index("other", "s") == ""
    with pytest.raises(RemoteProtocolError, match="bad index"):
        await client.save_index("c", "s", "nope")


async def test_index_survives_redis_restart_with_aof(
    make_node: MakeNode, redis_factory: Callable[..., LocalRedis]
) -> None:
    server = redis_factory(aof=True)
    node, _ = await make_node("A", url=server.url)
    client = await probe(node)
    address = (await client.create("s")).address
    confirm = await client.push(address, [b"x"], new_request_id())
    await client.save_index("c", "s", confirm.index)
    server.kill()
    server.start()
    assert await client.get_index("c", "s") == confirm.index


async def test_malformed_request_gets_an_error_and_service_goes_on(
    make_node: MakeNode, caplog: pytest.LogCaptureFixture
) -> None:
    node, _ = await make_node("A")
    client = await probe(node)
    worker = node.worker("probe")
    assert isinstance(worker, Probe)
    await node.deliver(
        TransportMessage(Route(["stream_service"]), Route(["probe"]), b"\xc1garbage")
    )
    await eventually(lambda: node.counters["stream_client.late_replies"] == 1)
    assert node.counters["stream_service.bad_request"] == 1
    assert worker.stray == []
    assert "malformed stream message" in caplog.text
    assert (await client.create("s")).name == "s"


async def test_oversized_push_is_refused(make_node: MakeNode) -> None:
    node, _ = await make_node("A", service_max_payload=1000)
    client = await probe(node)
    address = (await client.create("s")).address
    with pytest.raises(PayloadTooLarge):
        await client.push(address, [b"x" * 1001], new_request_id())
    assert node.counters["stream_service.too_large"] == 1
    assert (await client.push(address, [b"ok"], new_request_id())).status == p.NEW


async def test_request_the_node_cannot_route_fails_at_once(make_node: MakeNode) -> None:
    node, _ = await make_node("A", max_payload=1000)
    client = await probe(node)
    address = (await client.create("s")).address
    with pytest.raises(PayloadTooLarge):
        await client.push(address, [b"x" * 2000], new_request_id())
    assert node.counters["oversized"] == 1


async def test_push_to_unknown_stream_address(make_node: MakeNode) -> None:
    node, _ = await make_node("A")
    client = await probe(node)
    with pytest.raises(StreamNotFound):
        await client.push("stream_service", [b"x"], new_request_id())


async def test_deleted_stream_is_not_found(
    make_node: MakeNode, redis_client: sync_redis.Redis
) -> None:
    node, _ = await make_node("A")
    client = await probe(node)
    address = (await client.create("s")).address
    redis_client.delete(keys.stream("s"))
    with pytest.raises(StreamNotFound):
        await client.pull(address, "0-0", 10, 0)
    assert node.counters["stream_service.not_found"] == 1


async def test_redis_down_is_an_error_reply_then_recovers(
    make_node: MakeNode, redis_factory: Callable[..., LocalRedis]
) -> None:
    server = redis_factory(aof=True)
    node, _ = await make_node("A", url=server.url)
    client = await probe(node)
    address = (await client.create("s")).address
    server.kill()
    with pytest.raises(RedisUnavailable):
        await client.push(address, [b"x"], "r1")
    with pytest.raises(RedisUnavailable):
        await client.get_index("c", "s")
    assert node.counters["stream_service.unavailable"] == 2
    server.start()
    assert (await client.push(address, [b"x"], "r1")).status == p.NEW


async def test_leases(make_node: MakeNode, redis_client: sync_redis.Redis) -> None:
    node, _ = await make_node("A")
    client = await probe(node)
    await client.lease("s", "node-a", 10_000)
    await client.lease("s", "node-a", 10_000)  # renewal
    with pytest.raises(LeaseHeld, match="consumed by 'node-a'"):
        await client.lease("s", "node-b", 10_000)
    await client.release("s", "node-b")  # not the holder: no effect
    assert redis_client.get(keys.consumer_lease("s")) == b"node-a"
    await client.release("s", "node-a")
    await client.lease("s", "node-b", 10_000)


async def test_dead_letter(make_node: MakeNode, redis_client: sync_redis.Redis) -> None:
    node, _ = await make_node("A")
    client = await probe(node)
    await client.dead_letter("s", "1-0", b"bad", "ValueError: no")
    entries = redis_client.xrange(keys.dead_letter("s"))
    assert entries[0][1] == {b"data": b"bad", b"index": b"1-0", b"reason": b"ValueError: no"}


async def test_bad_stream_name(make_node: MakeNode) -> None:
    node, _ = await make_node("A")
    client = await probe(node)
    with pytest.raises(RemoteProtocolError, match="invalid stream name"):
        await client.create("has space")


async def test_a_client_on_the_services_node_is_served_without_the_mailbox(
    make_node: MakeNode, redis_client: sync_redis.Redis
) -> None:
    node, _ = await make_node("A")
    client = await probe(node)
    address = (await client.create("direct")).address
    handled = node.counters["handled"]  # what the mailbox loops handled
    intercepted = node.counters["intercepted"]  # replies resolved by the client
    confirm = await client.push(address, [b"one"], new_request_id())
    pulled = await client.pull(address, "0-0", 10, 0)
    assert [data for _, data in pulled.messages] == [b"one"]
    assert pulled.messages[0][0] == confirm.indexes[0]
    assert node.counters["handled"] == handled and node.counters["intercepted"] == intercepted
    # Any other request goes through the node (Node.deliver): the service's mailbox,
    # the reply intercepted; errors come back the same way.
    with pytest.raises(StreamNotFound):
        await client.push("stream_service", [b"x"], new_request_id())
    assert node.counters["handled"] == handled + 1
    assert node.counters["intercepted"] == intercepted + 1
    # A stopping service is reached through its mailbox again (which still drains).
    service = node.worker("stream_service")
    assert service is not None
    service.stopping()
    await client.push(address, [b"two"], new_request_id())
    assert node.counters["handled"] == handled + 2
    assert node.counters["intercepted"] == intercepted + 2
    assert len(redis_client.xrange(keys.stream("direct"))) == 2
