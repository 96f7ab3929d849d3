"""A client's push and pull served in its own task (StreamService.serve_now), and the
ways around it: the node's delivery path, queued pulls, slow handlers, stops and vanished peers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis as sync_redis

from pipeline import keys
from pipeline.errors import StreamError
from pipeline.routing.message import Route, StreamAddress, TransportMessage
from pipeline.routing.node import Context, Node, Worker, WorkerContext
from pipeline.routing.workers import Echo
from pipeline.streams.client import StreamClient, new_request_id
from pipeline.streams.consumer import Consumer
from pipeline.streams.pusher import StreamPusher
from pipeline.streams.service import StreamService
from pipeline.streams.serviceredis import HELD_IDLE, connect, connect_hot

from .conftest import MakeNode, Recorder, eventually


class Client(Worker):
    """A worker that owns a stream client (its replies are intercepted)."""

    client: StreamClient

    async def setup(self, wctx: WorkerContext) -> None:
        self.client = StreamClient(wctx.node, wctx.address)

    def intercept(self, message: TransportMessage) -> bool:
        return self.client.intercept(message)


class Sink:
    def __init__(self) -> None:
        self.got: list[bytes] = []

    async def __call__(self, index: str, data: bytes) -> None:
        self.got.append(data)


class Slow(Worker):
    """Replies after ``delay_s``; counts what it handled."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.got: list[bytes] = []

    async def handle(self, ctx: Context) -> None:
        self.got.append(ctx.payload)
        await asyncio.sleep(self.delay_s)
        await ctx.reply(b"re:" + ctx.payload)


class Stuck(Worker):
    """Never finishes a message (until its node cancels it)."""

    def __init__(self) -> None:
        self.got: list[bytes] = []

    async def handle(self, ctx: Context) -> None:
        self.got.append(ctx.payload)
        await asyncio.Event().wait()


def service_of(node: Node) -> StreamService:
    service = node.worker("stream_service")
    assert isinstance(service, StreamService)
    return service


def to_b(payload: bytes, target: str = "B") -> TransportMessage:
    return TransportMessage(
        Route([StreamAddress("stream_b", "stream_a").to_address(), target]), Route(["A"]), payload
    )


async def test_pushes_keep_their_order_across_the_fast_and_the_codec_path(
    make_node: MakeNode, redis_client: sync_redis.Redis
) -> None:
    # 960 bytes may not fit a node limit of 1000 once encoded (the size bound says
    # no), so that push is routed through the node; the small ones are served in the
    # caller's task. All go into the stream in the order they were pushed.
    node, _ = await make_node("A", max_payload=1000)
    worker = Client()
    await node.add_worker("w", worker)
    pusher = StreamPusher(worker.client, "s")
    sent: list[bytes] = []
    for i in range(20):
        item = f"{i}:".encode() + (b"x" * 956 if i % 3 == 0 else b"small")
        await pusher.push([item])
        sent.append(item)
    stored = [fields[b"data"] for _, fields in redis_client.xrange(keys.stream("s"))]
    assert stored == sent
    assert node.counters["stream_service.pushed"] == 20


class SeenService(StreamService):
    """Records what the service's batches are made of (routed requests come as Context)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kinds: list[str] = []

    async def handle_batch(self, batch: Any) -> None:
        self.kinds += [type(item).__name__ for item in batch]
        await super().handle_batch(batch)


async def test_requests_not_served_in_the_callers_task_are_delivered_by_the_node(
    redis_url: str,
) -> None:
    # Create, save/get index and a push too big for the fast path's size bound: each
    # goes through Node.deliver to the service's mailbox (no side door that hands the
    # service the request beside the node), so the node's trace shows them as sent.
    redis = connect(redis_url)
    node = Node("A", max_payload=1000, trace_size=64)
    service = SeenService(redis, max_payload=1000 + 65536, hot=connect_hot(redis_url))
    try:
        await node.add_worker("stream_service", service)
        worker = Client()
        await node.add_worker("w", worker)
        address = (await worker.client.create("seen")).address
        await worker.client.push(address, [b"x" * 960], new_request_id())
        await worker.client.save_index("c", "seen", "1-0")
        assert await worker.client.get_index("c", "seen") == "1-0"
        assert service.kinds == ["Context"] * 4
        sent = [m for a, m in node.trace if a.value.startswith(b"stream_service")]
        assert len(sent) == 4 and all(m.payload for m in sent)  # the real messages
    finally:
        await node.stop()
        await redis.aclose()


async def test_pulls_keep_their_order_when_they_wait_for_a_slot(make_node: MakeNode) -> None:
    # One pull slot for two consumers: one long-polls in its own task while the
    # other's pulls queue in the service (a task each), so each consumer's pulls
    # take both paths. Each stream is still consumed in order, nothing lost.
    node, _ = await make_node("A", max_pulls=1)
    worker = Client()
    await node.add_worker("w", worker)
    sinks = {"s1": Sink(), "s2": Sink()}
    for stream, sink in sinks.items():
        consumer = Consumer(stream, sink, client_id="c", holder="A", wait_ms=100)
        await node.add_worker(f"consumer:{stream}", consumer)
    pushers = {stream: StreamPusher(worker.client, stream) for stream in sinks}
    for i in range(60):
        for stream, pusher in pushers.items():
            await pusher.push([f"{stream}:{i}".encode()])
        if i % 10 == 0:
            await asyncio.sleep(0.05)  # let the long polls run and queue meanwhile
    await eventually(lambda: all(len(sink.got) == 60 for sink in sinks.values()))
    for stream, sink in sinks.items():
        assert sink.got == [f"{stream}:{i}".encode() for i in range(60)]
    assert node.counters["stream_service.pulls_waited"] >= 1
    assert node.counters["stream_service.pulls_refused"] == 0
    assert service_of(node)._active_pulls() <= 1


async def test_a_slow_handler_keeps_the_lease_and_the_order(make_node: MakeNode) -> None:
    # Each message takes longer than a third of the lease: the consumer renews it
    # while it waits, so a second node is refused and nothing is delivered twice.
    node_a, _ = await make_node("A")
    node_b, transport_b = await make_node("B", lease_ttl_ms=300)
    consumer = await transport_b.subscribe("stream_b")
    await asyncio.wait_for(consumer.ready.wait(), 5)
    slow = Slow(0.25)
    await node_b.add_worker("B", slow)
    a = Recorder()
    await node_a.add_worker("A", a)
    for i in range(4):
        await node_a.deliver(to_b(str(i).encode()))
    _, rival = await make_node("B2", lease_ttl_ms=300)
    refused = await rival.subscribe("stream_b")
    await eventually(lambda: len(a.got) == 4)
    assert [m.payload for m in a.got] == [b"re:0", b"re:1", b"re:2", b"re:3"]
    assert slow.got == [b"0", b"1", b"2", b"3"]
    assert refused.refused is not None and not refused.ready.is_set()
    assert node_b.counters["consumer.lease_refused"] == 0


async def test_stop_interrupts_a_long_poll_served_in_the_consumers_task(
    make_node: MakeNode, redis_client: sync_redis.Redis
) -> None:
    # A 100 s long poll: a stop that waited for it would take that long; the limit
    # below only bounds that wait, not how fast the interruption is.
    node, _ = await make_node("A", max_wait_ms=100_000, lease_ttl_ms=300_000)
    sink = Sink()
    consumer = Consumer("s", sink, client_id="c", holder="A", wait_ms=100_000, lease_ttl_ms=300_000)
    await node.add_worker("consumer:s", consumer)
    service = service_of(node)
    await eventually(lambda: service._inline_pulls == 1)  # in its XREAD BLOCK
    await asyncio.wait_for(node.stop(grace_s=200), 60)
    assert redis_client.get(keys.consumer_lease("s")) is None  # released on the way out
    assert node.counters["consumer.errors"] == 0
    assert node.counters["consumer.crashes"] == 0


async def test_a_receiver_that_vanishes_mid_round_trip_answers_after_its_restart(
    make_node: MakeNode,
) -> None:
    node_a, _ = await make_node("A")
    node_b, transport_b = await make_node("B")
    consumer = await transport_b.subscribe("stream_b")
    await asyncio.wait_for(consumer.ready.wait(), 5)
    stuck = Stuck()
    await node_b.add_worker("B", stuck)
    a = Recorder()
    await node_a.add_worker("A", a)
    await node_a.deliver(to_b(b"ping"))
    await eventually(lambda: stuck.got == [b"ping"])
    await node_b.stop(grace_s=0.5)  # the handler never finished: its entry is not saved
    # B comes back (same name, so the same lease holder and consumer index).
    node_b2, transport_b2 = await make_node("B")
    await node_b2.add_worker("B", Echo())
    await transport_b2.subscribe("stream_b")
    await eventually(lambda: len(a.got) == 1)
    assert a.got[0].payload == b"ping"
    assert node_b2.counters["consumer.handled"] == 1


async def test_a_sender_that_vanishes_mid_round_trip_gets_its_reply_after_its_restart(
    make_node: MakeNode,
) -> None:
    node_a, transport_a = await make_node("A")
    consumer_a = await transport_a.subscribe("stream_a")
    await asyncio.wait_for(consumer_a.ready.wait(), 5)
    node_b, transport_b = await make_node("B")
    consumer_b = await transport_b.subscribe("stream_b")
    await asyncio.wait_for(consumer_b.ready.wait(), 5)
    slow = Slow(0.3)
    await node_b.add_worker("B", slow)
    await node_a.add_worker("A", Recorder())
    await node_a.deliver(to_b(b"ping"))
    await eventually(lambda: slow.got == [b"ping"])
    await node_a.stop()  # gone before the reply is written to stream_a
    await eventually(lambda: node_b.counters["sent"] >= 1)
    node_a2, transport_a2 = await make_node("A")
    a2 = Recorder()
    await node_a2.add_worker("A", a2)
    await transport_a2.subscribe("stream_a")
    await eventually(lambda: len(a2.got) == 1)
    assert a2.got[0].payload == b"re:ping"
    assert a2.got[0].return_route[0] == StreamAddress("stream_b", "stream_a").to_address()


async def test_held_clients_are_bounded(
    make_node: MakeNode, redis_client: sync_redis.Redis
) -> None:
    node, _ = await make_node("A")
    worker = Client()
    await node.add_worker("w", worker)
    pushers = [StreamPusher(worker.client, f"s{i}") for i in range(3 * HELD_IDLE)]
    confirms = await asyncio.gather(*(pusher.push([b"x"]) for pusher in pushers))
    assert all(len(confirm.indexes) == 1 for confirm in confirms)
    assert all(redis_client.xlen(keys.stream(f"s{i}")) == 1 for i in range(3 * HELD_IDLE))
    assert len(service_of(node)._held._idle) <= HELD_IDLE  # the others went back to the pool


class HurriedClient(Client):
    """A client whose calls time out after 0.3 s."""

    async def setup(self, wctx: WorkerContext) -> None:
        self.client = StreamClient(wctx.node, wctx.address, timeout_s=0.3)


async def test_a_stalled_redis_is_bounded_by_the_callers_deadline_not_a_socket_timeout(
    make_node: MakeNode, redis_client: sync_redis.Redis
) -> None:
    # The service's hot client has no socket timeout (Role.STREAM_HOT): the local
    # client's deadline is what ends a command Redis does not answer.
    node, _ = await make_node("A")
    assert service_of(node)._held.redis.connection_pool.connection_kwargs["socket_timeout"] is None
    worker = HurriedClient()
    await node.add_worker("w", worker)
    address = (await worker.client.create("stalled")).address
    rid = new_request_id()
    # Paused for 60 s: without the caller's deadline the push would wait for the
    # pause's end and succeed; with it, it fails (how soon is the benchmark's business).
    redis_client.execute_command("CLIENT", "PAUSE", "60000", "WRITE")
    try:
        with pytest.raises(StreamError, match="did not answer Push in time"):
            await worker.client.push(address, [b"x"], rid)
    finally:
        redis_client.execute_command("CLIENT", "UNPAUSE")
    confirm = await worker.client.push(address, [b"x"], rid)  # the same push, retried
    assert len(confirm.indexes) in (0, 1)  # pushed now, or already by the stalled one
    assert redis_client.xlen(keys.stream("stalled")) == 1
    assert (await worker.client.push(address, [b"y"], new_request_id())).status == 1
