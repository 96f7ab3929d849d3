"""Seed 001: the stream transport, with the seed's "Tracing the message route and encoding"."""

from __future__ import annotations

import asyncio

import pytest
import redis as sync_redis

from pipeline import keys
from pipeline.routing.message import Address, Route, StreamAddress, TransportMessage
from pipeline.routing.node import Context, Node, Worker
from pipeline.streams import protocol as p

from .conftest import MakeNode, Recorder, eventually


class Replier(Worker):
    def __init__(self) -> None:
        self.got: list[TransportMessage] = []

    async def handle(self, ctx: Context) -> None:
        self.got.append(ctx.message)
        await ctx.reply(b"re:" + ctx.payload)


def local(name: str) -> Address:
    return Address.local(name)


def routed_to(node: Node, address: str) -> list[TransportMessage]:
    return [m for a, m in node.trace if a == local(address)]


async def test_seed_001_tracing_the_message_route_and_encoding(
    make_node: MakeNode, redis_client: sync_redis.Redis
) -> None:
    node_a, transport_a = await make_node("A")
    node_b, transport_b = await make_node("B")
    # B subscribes to its stream first.
    consumer_b = await transport_b.subscribe("stream_b")
    await asyncio.wait_for(consumer_b.ready.wait(), 5)
    b = Replier()
    await node_b.add_worker("B", b)
    a = Recorder()
    await node_a.add_worker("A", a)

    # A -> A:transport:
    sent = TransportMessage(
        Route(
            [StreamAddress(onward_stream="stream_b", return_stream="stream_a").to_address(), "B"]
        ),
        Route(["A"]),
        b"hello",
    )
    await node_a.deliver(sent)
    await eventually(lambda: len(a.got) == 1)

    # The transport reverts the stream address on send: A:transport: forwarded_message
    forwarded = TransportMessage(
        Route(["B"]),
        Route(
            [StreamAddress(onward_stream="stream_a", return_stream="stream_b").to_address(), "A"]
        ),
        b"hello",
    )
    # A:transport: stream push, onward [stream_b_address], return [A:transport],
    # payload: encoded forwarded_message
    stream_b_address = "stream_service:stream_b"
    pushes = [
        (m, p.decode(m.payload))
        for m in routed_to(node_a, stream_b_address)
        if isinstance(p.decode(m.payload), p.Push)
    ]
    assert len(pushes) == 1
    push_message, push = pushes[0]
    assert push_message.onward_route == Route([stream_b_address])
    assert push_message.return_route == Route(["A:transport"])
    assert isinstance(push, p.Push)
    assert push.data == (forwarded.encode(),)
    # The wire encoding in Redis is exactly the encoded forwarded_message.
    entries = redis_client.xrange(keys.stream("stream_b"))
    assert [TransportMessage.decode(fields[b"data"]) for _, fields in entries] == [forwarded]

    # Node B: consumer:stream_b: stream fetch, onward [stream_b_address], return [consumer:stream_b]
    fetches = [
        m for m in routed_to(node_b, stream_b_address) if isinstance(p.decode(m.payload), p.Pull)
    ]
    assert fetches
    assert all(m.return_route == Route(["consumer:stream_b"]) for m in fetches)
    # consumer:stream_b: stream fetch response, onward [consumer:stream_b],
    # return [stream_b_address], payload: encoded forwarded_message
    responses = [
        (m, p.decode(m.payload))
        for m in routed_to(node_b, "consumer:stream_b")
        if isinstance(p.decode(m.payload), p.Messages)
    ]
    delivering = [(m, r) for m, r in responses if isinstance(r, p.Messages) and r.messages]
    assert len(delivering) == 1
    response, messages = delivering[0]
    assert response.return_route == Route([stream_b_address])
    assert isinstance(messages, p.Messages)
    assert [data for _, data in messages.messages] == [forwarded.encode()]

    # B: receives forwarded_message
    assert b.got == [forwarded]
    # ...and B's reply came back to A through stream_a with the route traced.
    assert a.got == [
        TransportMessage(
            Route(["A"]),
            Route([StreamAddress("stream_b", "stream_a").to_address(), "B"]),
            b"re:hello",
        )
    ]
    # A:transport created the consumer for the return stream on first send.
    assert set(transport_a.consumers) == {"stream_a"}
    assert redis_client.sismember(keys.streams_registry(), "stream_b")


async def two_nodes(make_node: MakeNode, **kw: int) -> tuple[Node, Node, Replier, Recorder]:
    node_a, _ = await make_node("A", **kw)
    node_b, transport_b = await make_node("B", **kw)
    consumer = await transport_b.subscribe("stream_b")
    await asyncio.wait_for(consumer.ready.wait(), 5)
    b = Replier()
    await node_b.add_worker("B", b)
    a = Recorder()
    await node_a.add_worker("A", a)
    return node_a, node_b, b, a


def to_b(payload: bytes, target: str = "B") -> TransportMessage:
    return TransportMessage(
        Route([StreamAddress("stream_b", "stream_a").to_address(), target]), Route(["A"]), payload
    )


async def test_many_requests_and_replies(make_node: MakeNode) -> None:
    node_a, _, b, a = await two_nodes(make_node)
    for i in range(200):
        await node_a.deliver(to_b(str(i).encode()))
    await eventually(lambda: len(a.got) == 200)
    assert sorted(m.payload for m in a.got) == sorted(b"re:" + str(i).encode() for i in range(200))


async def test_malformed_entry_is_dead_lettered_and_others_flow(
    make_node: MakeNode, redis_client: sync_redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    node_a, node_b, b, a = await two_nodes(make_node)
    redis_client.xadd(keys.stream("stream_b"), {b"data": b"\x93not a message"})
    await node_a.deliver(to_b(b"after"))
    await eventually(lambda: len(a.got) == 1)
    assert node_b.counters["stream_transport.malformed"] == 1
    assert node_b.counters["consumer.dead_lettered"] == 1
    dead = redis_client.xrange(keys.dead_letter("stream_b"))
    assert dead[0][1][b"data"] == b"\x93not a message"
    assert b"RemoteProtocolError" in dead[0][1][b"reason"]
    assert "malformed message" in caplog.text


async def test_route_to_unknown_worker_is_dead_lettered_and_others_flow(
    make_node: MakeNode, redis_client: sync_redis.Redis
) -> None:
    node_a, node_b, b, a = await two_nodes(make_node)
    await node_a.deliver(to_b(b"lost?", target="nobody"))
    await node_a.deliver(to_b(b"fine"))
    await eventually(lambda: len(a.got) == 1)
    await eventually(lambda: node_b.counters["consumer.dead_lettered"] == 1)
    assert node_b.counters["unknown_worker"] == 1
    dead = redis_client.xrange(keys.dead_letter("stream_b"))
    assert TransportMessage.decode(dead[0][1][b"data"]).payload == b"lost?"
    assert b"UnroutableMessage" in dead[0][1][b"reason"]


async def test_unknown_address_type_in_a_received_message(
    make_node: MakeNode, redis_client: sync_redis.Redis
) -> None:
    node_a, node_b, b, a = await two_nodes(make_node)
    weird = TransportMessage(Route([Address(42, b"?")]), Route(), b"x")
    redis_client.xadd(keys.stream("stream_b"), {b"data": weird.encode()})
    await node_a.deliver(to_b(b"fine"))
    await eventually(lambda: len(a.got) == 1)
    await eventually(lambda: node_b.counters["unknown_address_type"] == 1)
    assert node_b.counters["consumer.dead_lettered"] == 1


async def test_oversized_payloads(make_node: MakeNode, redis_client: sync_redis.Redis) -> None:
    node_a, node_b, b, a = await two_nodes(make_node, max_payload=5000)
    # Refused by the sending node before it reaches a stream.
    done = await node_a.deliver_tracked(to_b(b"x" * 5001))
    with pytest.raises(Exception, match="exceeds 5000"):
        await done
    assert node_a.counters["oversized"] == 1
    # Written into the stream by someone else: moved to dead letters by the receiving side.
    redis_client.xadd(keys.stream("stream_b"), {b"data": b"y" * 20_000})
    await node_a.deliver(to_b(b"fine"))
    await eventually(lambda: len(a.got) == 1)
    await eventually(lambda: len(redis_client.xrange(keys.dead_letter("stream_b"))) == 1)
    assert node_b.counters["stream_service.oversized_entries"] == 1


async def test_bad_stream_address_is_counted(make_node: MakeNode) -> None:
    node_a, _ = await make_node("A")
    done = await node_a.deliver_tracked(
        TransportMessage(Route([Address(2, b"\xc1"), "B"]), Route(["A"]), b"")
    )
    with pytest.raises(Exception, match="malformed stream address"):
        await done
    assert node_a.counters["stream_transport.bad_address"] == 1
    assert node_a.counters["transport_errors"] == 1
