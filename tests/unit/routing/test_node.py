"""Node routing: local mailboxes, route tracing, transports, and every bad route."""

from __future__ import annotations

import asyncio

import pytest

from pipeline.errors import (
    LocalProtocolError,
    PayloadTooLarge,
    UnknownAddressType,
    UnroutableMessage,
)
from pipeline.routing.message import Address, Route, TransportMessage
from pipeline.routing.node import Context, Node, Worker
from pipeline.routing.workers import Echo, Requester


class Recorder(Worker):
    def __init__(self) -> None:
        self.got: list[TransportMessage] = []
        self.event = asyncio.Event()

    async def handle(self, ctx: Context) -> None:
        self.got.append(ctx.message)
        self.event.set()


class Relay(Worker):
    async def handle(self, ctx: Context) -> None:
        await ctx.forward()


class Failing(Worker):
    async def handle(self, ctx: Context) -> None:
        if ctx.payload == b"boom":
            raise ValueError("handler bug")


class Gate(Worker):
    mailbox_size = 1

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.handled: list[bytes] = []

    async def handle(self, ctx: Context) -> None:
        await self.open.wait()
        self.handled.append(ctx.payload)


class Batcher(Worker):
    batch_size = 100

    def __init__(self) -> None:
        self.batches: list[int] = []

    async def handle_batch(self, batch: list[Context]) -> None:
        self.batches.append(len(batch))


class Loopback:
    """A transport for address type 1 that hands messages to another node (the interface contract)."""

    address_type = 1

    def __init__(self, peer: Node) -> None:
        self.peer = peer
        self.started = False
        self.stopped = False

    async def start(self, node: Node) -> None:
        self.started = True

    async def send(self, message: TransportMessage) -> None:
        rest = message.onward_route.rest()
        back = message.return_route.prepend(Address(1, b"back"))
        await self.peer.deliver(TransportMessage(rest, back, message.payload))

    async def stop(self) -> None:
        self.stopped = True


def msg(
    onward: list[Address | str], ret: list[Address | str], payload: bytes = b""
) -> TransportMessage:
    return TransportMessage(Route(onward), Route(ret), payload)


async def settle(node: Node) -> None:
    for _ in range(50):
        await asyncio.sleep(0)


@pytest.fixture
async def node() -> Node:
    n = Node("n", trace_size=100)
    await n.start()
    yield n  # type: ignore[misc]
    await n.stop()


async def test_reply_retraces_the_route(node: Node) -> None:
    rec = Recorder()
    await node.add_worker("echo", Echo())
    await node.add_worker("rec", rec)
    await node.deliver(msg(["echo"], ["rec"], b"hi"))
    await asyncio.wait_for(rec.event.wait(), 5)
    assert rec.got == [msg(["rec"], ["echo"], b"hi")]


async def test_forward_pops_itself_and_prepends_itself(node: Node) -> None:
    rec = Recorder()
    await node.add_worker("relay", Relay())
    await node.add_worker("rec", rec)
    await node.deliver(msg(["relay", "rec"], ["origin"], b"x"))
    await asyncio.wait_for(rec.event.wait(), 5)
    assert rec.got == [msg(["rec"], ["relay", "origin"], b"x")]


async def test_unknown_worker_is_dropped_counted_and_others_flow(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    rec = Recorder()
    await node.add_worker("rec", rec)
    done = await node.deliver_tracked(msg(["nobody"], ["rec"]))
    with pytest.raises(UnroutableMessage):
        await done
    await node.deliver(msg(["rec"], [], b"ok"))
    await asyncio.wait_for(rec.event.wait(), 5)
    assert node.counters["unknown_worker"] == 1
    assert "no worker at nobody" in caplog.text


async def test_empty_route_is_unroutable(node: Node) -> None:
    done = await node.deliver_tracked(msg([], []))
    with pytest.raises(UnroutableMessage):
        await done
    assert node.counters["unroutable"] == 1


async def test_unknown_address_type_is_dropped_and_counted(node: Node) -> None:
    done = await node.deliver_tracked(msg([Address(9, b"x"), "rec"], []))
    with pytest.raises(UnknownAddressType):
        await done
    assert node.counters["unknown_address_type"] == 1


async def test_oversized_payload_is_dropped_and_counted() -> None:
    node = Node("small", max_payload=10)
    rec = Recorder()
    await node.add_worker("rec", rec)
    done = await node.deliver_tracked(msg(["rec"], [], b"x" * 11))
    with pytest.raises(PayloadTooLarge):
        await done
    await node.deliver(msg(["rec"], [], b"x" * 10))
    await asyncio.wait_for(rec.event.wait(), 5)
    assert node.counters["oversized"] == 1
    await node.stop()


async def test_handler_error_is_counted_reported_and_node_keeps_going(node: Node) -> None:
    await node.add_worker("f", Failing())
    bad = await node.deliver_tracked(msg(["f"], [], b"boom"))
    good = await node.deliver_tracked(msg(["f"], [], b"fine"))
    with pytest.raises(ValueError, match="handler bug"):
        await bad
    await good
    assert node.counters["handler_errors"] == 1
    assert node.counters["handled"] == 1


async def test_mailbox_is_bounded_and_applies_back_pressure(node: Node) -> None:
    gate = Gate()
    await node.add_worker("gate", gate)
    await node.deliver(msg(["gate"], [], b"1"))  # taken by the handler, which waits
    await settle(node)
    await node.deliver(msg(["gate"], [], b"2"))  # fills the mailbox of 1
    third = asyncio.create_task(node.deliver(msg(["gate"], [], b"3")))
    await settle(node)
    assert not third.done()
    gate.open.set()
    await asyncio.wait_for(third, 5)
    await settle(node)
    assert gate.handled == [b"1", b"2", b"3"]


async def test_batch_worker_gets_batches(node: Node) -> None:
    batcher = Batcher()
    await node.add_worker("b", batcher)
    for i in range(250):
        await node.deliver(msg(["b"], [], str(i).encode()))
    await settle(node)
    assert sum(batcher.batches) == 250
    assert max(batcher.batches) <= 100


async def test_transport_by_address_type_with_route_tracing() -> None:
    remote = Node("remote")
    rec = Recorder()
    await remote.add_worker("rec", rec)
    local = Node("local")
    loop = Loopback(remote)
    local.register_transport(loop)
    await local.start()
    assert loop.started
    await local.add_worker("echo", Echo())
    await local.deliver(msg([Address(1, b"peer"), "rec"], ["me"], b"p"))
    await asyncio.wait_for(rec.event.wait(), 5)
    assert rec.got == [msg(["rec"], [Address(1, b"back"), "me"], b"p")]
    assert local.counters["sent"] == 1
    with pytest.raises(LocalProtocolError):
        local.register_transport(Loopback(remote))
    with pytest.raises(LocalProtocolError):
        local.register_transport(type("T", (), {"address_type": 0})())  # type: ignore[arg-type]
    await local.stop()
    assert loop.stopped
    await remote.stop()


async def test_aliases_and_duplicate_names(node: Node) -> None:
    rec = Recorder()
    await node.add_worker("rec", rec, aliases=["rec2"])
    await node.deliver(msg(["rec2"], [], b"via alias"))
    await asyncio.wait_for(rec.event.wait(), 5)
    assert rec.got[0].onward_route == Route(["rec2"])
    with pytest.raises(LocalProtocolError):
        await node.add_worker("rec2", Recorder())
    assert node.add_alias("rec", "rec2") == Address.local("rec2")


async def test_stop_drains_mailboxes_and_is_idempotent() -> None:
    node = Node("d")
    gate = Gate()
    gate.mailbox_size = 10
    await node.add_worker("gate", gate)
    for i in range(5):
        await node.deliver(msg(["gate"], [], str(i).encode()))
    gate.open.set()
    await node.stop()
    await node.stop()
    assert gate.handled == [b"0", b"1", b"2", b"3", b"4"]
    with pytest.raises(LocalProtocolError):
        await node.add_worker("late", Echo())


async def test_requester_sends_and_records(node: Node) -> None:
    requester = Requester(Route(["echo"]), 5)
    await node.add_worker("echo", Echo())
    await node.add_worker("req", requester)
    for _ in range(200):
        if len(requester.replies) == 5:
            break
        await asyncio.sleep(0.01)
    assert sorted(requester.replies) == [f"req-{i}".encode() for i in range(5)]


class Crashing(Worker):
    async def run(self, wctx: object) -> None:  # type: ignore[override]
        raise RuntimeError("run loop bug")

    async def handle(self, ctx: Context) -> None:
        await ctx.reply(b"still here")


async def test_a_crashing_run_loop_is_logged_counted_and_the_node_goes_on(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    rec = Recorder()
    await node.add_worker("crash", Crashing())
    await node.add_worker("rec", rec)
    for _ in range(100):
        if node.counters["worker_run_failures"]:
            break
        await asyncio.sleep(0.01)
    assert node.counters["worker_run_failures"] == 1
    assert "worker crash stopped running" in caplog.text
    await node.deliver(msg(["crash"], ["rec"], b"?"))
    await asyncio.wait_for(rec.event.wait(), 5)
    assert rec.got[0].payload == b"still here"


class Inline(Worker):
    """Answers ``ask`` inline (its text upper-cased), declines anything else."""

    def __init__(self) -> None:
        self.asked: list[tuple[Address, object, Route]] = []

    async def serve_inline(self, address: Address, request: object, origin: Route) -> object | None:
        self.asked.append((address, request, origin))
        return request.upper() if isinstance(request, str) and request.startswith("ask") else None

    async def handle(self, ctx: Context) -> None:
        pass


async def test_call_inline_resolves_counts_and_traces_as_routed() -> None:
    node = Node("N", trace_size=16)
    worker = Inline()
    await node.add_worker("svc", worker)
    await node.add_worker("plain", Recorder())
    back = Route([Address.local("caller")])
    try:
        assert (
            await node.call_inline(Route([Address.local("svc")]), back, "ask me", str.encode)
            == "ASK ME"
        )
        assert worker.asked == [(Address.local("svc"), "ask me", back)]
        assert node.counters["inline"] == 1
        (to, request), (to_back, reply) = list(node.trace)
        assert (to, request.payload, request.return_route) == (
            Address.local("svc"),
            b"ask me",
            back,
        )
        assert (to_back, reply.payload) == (Address.local("caller"), b"ASK ME")
        # declined, no such worker, a worker without an inline path, more than one hop:
        # None (the caller routes it), nothing counted or traced
        assert (
            await node.call_inline(Route([Address.local("svc")]), back, "other", str.encode) is None
        )
        assert (
            await node.call_inline(Route([Address.local("nobody")]), back, "ask", str.encode)
            is None
        )
        assert (
            await node.call_inline(Route([Address.local("plain")]), back, "ask", str.encode) is None
        )
        two = Route([Address.local("svc"), Address.local("plain")])
        assert await node.call_inline(two, back, "ask", str.encode) is None
        assert node.counters["inline"] == 1 and len(node.trace) == 2
    finally:
        await node.stop()
