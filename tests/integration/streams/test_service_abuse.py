"""The stream service under hostile or heavy requests: held polls, bad requests, Redis gone."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import msgpack
import redis as sync_redis

from pipeline import keys
from pipeline.local.redisserver import LocalRedis
from pipeline.routing.message import Route, TransportMessage
from pipeline.routing.node import Node
from pipeline.streams import protocol as p
from pipeline.streams.consumer import Consumer
from pipeline.streams.publisher import Publisher
from pipeline.streams.service import StreamService
from pipeline.streams.serviceredis import connect

from .conftest import MakeNode, Recorder, eventually


async def service_node(url: str, **options: int) -> tuple[Node, StreamService, Recorder]:
    node = Node("svc")
    service = StreamService(connect(url, block_s=10), **options)
    await node.add_worker("stream_service", service)
    recorder = Recorder()
    await node.add_worker("peer", recorder)
    return node, service, recorder


def replies(recorder: Recorder) -> dict[str, p.StreamMessage]:
    out: dict[str, p.StreamMessage] = {}
    for message in recorder.got:
        reply = p.decode(message.payload)
        out[getattr(reply, "request_id", "")] = reply
    return out


async def send(node: Node, to: str, request: p.StreamMessage) -> None:
    await node.deliver(TransportMessage(Route([to]), Route(["peer"]), p.encode(request)))


async def test_a_push_is_not_stalled_by_held_long_polls(redis_url: str) -> None:
    """70 long polls (64 slots) and a push in the same batch: the push is confirmed at once
    (not after the polls' 120 s: the deadline below only bounds that stall)."""
    node, service, recorder = await service_node(redis_url, max_wait_ms=120_000)
    try:
        await send(node, "stream_service", p.CreateStream(request_id="c", name="held"))
        await eventually(lambda: "c" in replies(recorder))
        init = replies(recorder)["c"]
        assert isinstance(init, p.Init)
        # No await yields between these: they all land in one mailbox batch.
        for i in range(70):
            pull = p.Pull(request_id=f"pull-{i}", index="0-0", limit=10, wait_ms=120_000)
            await send(node, init.address, pull)
        await send(node, init.address, p.Push(request_id="push", data=(b"x",)))
        await eventually(lambda: "push" in replies(recorder), limit_s=60)
        confirm = replies(recorder)["push"]
        assert isinstance(confirm, p.PushConfirm) and confirm.status == p.NEW
        # Every poll, held or queued, gets the entry.
        await eventually(lambda: len(replies(recorder)) == 72, limit_s=10)
        for i in range(70):
            got = replies(recorder)[f"pull-{i}"]
            assert isinstance(got, p.Messages), got
            assert [d for _, d in got.messages] == [b"x"]
    finally:
        await node.stop(grace_s=2)
        await service.redis.aclose()


async def test_pulls_beyond_the_queue_are_refused_not_held(redis_url: str) -> None:
    node, service, recorder = await service_node(
        redis_url, max_wait_ms=10_000, max_pulls=2, max_waiting_pulls=2
    )
    try:
        await send(node, "stream_service", p.CreateStream(request_id="c", name="few"))
        await eventually(lambda: "c" in replies(recorder))
        address = "stream_service:few"
        for i in range(5):
            await send(
                node, address, p.Pull(request_id=f"p{i}", index="0-0", limit=1, wait_ms=10_000)
            )
        await eventually(lambda: "p4" in replies(recorder), limit_s=5)
        refused = replies(recorder)["p4"]
        assert isinstance(refused, p.Error) and refused.code == p.ErrorCode.UNAVAILABLE
        assert node.counters["stream_service.pulls_refused"] == 1
    finally:
        await node.stop(grace_s=2)
        await service.redis.aclose()


async def test_error_texts_are_public(redis_factory: Callable[..., LocalRedis]) -> None:
    """Bad requests get our own reasons; a Redis failure says only "redis unavailable"."""
    server = redis_factory()
    node, service, recorder = await service_node(server.url)
    try:
        await send(node, "stream_service", p.CreateStream(request_id="c", name="pub"))
        await eventually(lambda: "c" in replies(recorder))
        bad_name = p.CreateStream(request_id="bad-name", name="a{b}")
        await send(node, "stream_service", bad_name)
        raw = msgpack.packb([p.Kind.PUSH, "bad-type", [1, 2]])
        await node.deliver(TransportMessage(Route(["stream_service:pub"]), Route(["peer"]), raw))
        await node.deliver(
            TransportMessage(Route(["stream_service"]), Route(["peer"]), b"\x93\xc1\xc1\xc1")
        )
        await eventually(lambda: {"bad-name", "bad-type", ""} <= set(replies(recorder)))
        got = replies(recorder)
        assert got["bad-name"] == p.Error(
            request_id="bad-name", code=p.ErrorCode.BAD_REQUEST, message="invalid stream name"
        )
        bad_type = got["bad-type"]
        assert isinstance(bad_type, p.Error) and "data entries must be bytes" in bad_type.message
        assert got[""] == p.Error(
            request_id="",
            code=p.ErrorCode.BAD_REQUEST,
            message="malformed stream message: bad msgpack",
        )
        server.stop()
        await send(node, "stream_service", p.GetIndex(request_id="gi", client_id="x", stream="pub"))
        await send(node, "stream_service:pub", p.Push(request_id="ps", data=(b"x",)))
        await eventually(lambda: {"gi", "ps"} <= set(replies(recorder)), limit_s=30)
        for rid in ("gi", "ps"):
            assert replies(recorder)[rid] == p.Error(
                request_id=rid, code=p.ErrorCode.UNAVAILABLE, message="redis unavailable"
            )
    finally:
        await node.stop(grace_s=2)
        await service.redis.aclose()


async def test_a_request_that_trips_a_bug_is_answered_and_the_batch_goes_on(
    redis_url: str,
) -> None:
    node, service, recorder = await service_node(redis_url)

    async def broken(ctx: object, req: object) -> None:
        raise RuntimeError("secret internal state")

    service._control = broken  # type: ignore[method-assign]
    try:
        await send(node, "stream_service", p.GetIndex(request_id="g", client_id="x", stream="s"))
        await eventually(lambda: "g" in replies(recorder))
        assert replies(recorder)["g"] == p.Error(
            request_id="g", code=p.ErrorCode.BAD_REQUEST, message="internal error"
        )
        assert node.counters["stream_service.internal_errors"] == 1
        assert node.counters["handler_errors"] == 0
    finally:
        await node.stop(grace_s=2)
        await service.redis.aclose()


async def test_a_hanging_handler_is_dead_lettered_and_the_stream_flows(
    make_node: MakeNode, redis_client: sync_redis.Redis
) -> None:
    node, _ = await make_node("H")
    await node.add_worker("pub", Publisher("hang"))
    got: list[bytes] = []
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def handler(index: str, data: bytes) -> asyncio.Future[None] | None:
        if data == b"hang":
            return never  # a handler that never finishes
        got.append(data)
        return None

    consumer = Consumer(
        "hang",
        handler,
        client_id="c",
        holder="H",
        wait_ms=100,
        max_failures=2,
        handler_timeout_s=0.3,
    )
    await node.add_worker("consumer:hang", consumer)
    for item in (b"a", b"hang", b"b"):
        await node.deliver(TransportMessage(Route(["pub"]), Route(), item))
    await eventually(lambda: got == [b"a", b"b"] and node.counters["consumer.dead_lettered"] == 1)
    dead = redis_client.xrange(keys.dead_letter("hang"))
    assert [fields[b"data"] for _, fields in dead] == [b"hang"]
    assert b"did not finish" in dead[0][1][b"reason"]
    never.cancel()


async def test_a_bug_in_a_consumer_session_is_retried_not_fatal(make_node: MakeNode) -> None:
    node, _ = await make_node("K")
    await node.add_worker("pub", Publisher("buggy"))
    got: list[bytes] = []

    async def handler(index: str, data: bytes) -> None:
        got.append(data)

    consumer = Consumer("buggy", handler, client_id="c", holder="K", wait_ms=100)
    real = consumer._process
    calls = 0

    async def once_broken(entries: list[tuple[str, bytes]]) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise KeyError("a bug")
        await real(entries)

    consumer._process = once_broken  # type: ignore[method-assign]
    await node.add_worker("consumer:buggy", consumer)
    await node.deliver(TransportMessage(Route(["pub"]), Route(), b"x"))
    await eventually(lambda: got == [b"x"])
    assert node.counters["consumer.crashes"] == 1
