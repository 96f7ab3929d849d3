"""Hostile TCP peers against a node's transport: route tracing, silent sockets, trickles, floods."""

from __future__ import annotations

import asyncio
import logging
import struct
import time

import pytest

from pipeline.dialogue.connection import Connection
from pipeline.dialogue.packets import HAS_DATA, PacketType
from pipeline.dialogue.transport import TcpTransport, parse_host_port
from pipeline.routing.message import Address, AddressType, Route, TransportMessage
from pipeline.routing.node import Context, Node, Worker
from pipeline.routing.workers import Echo
from pipeline.settings import Settings


class Collector(Worker):
    def __init__(self) -> None:
        self.got: list[TransportMessage] = []
        self.arrived = asyncio.Event()

    async def handle(self, ctx: Context) -> None:
        self.got.append(ctx.message)
        self.arrived.set()


def tcp(address: str) -> Address:
    return Address(AddressType.TCP, address.encode())


async def make_node(name: str, listen: str | None, **options: float) -> tuple[Node, TcpTransport]:
    node = Node(name)
    transport = TcpTransport(listen, Settings(), **options)  # type: ignore[arg-type]
    node.register_transport(transport)
    await node.start()
    return node, transport


async def eof_within(reader: asyncio.StreamReader, seconds: float) -> float:
    """Read (and discard) until the peer closes; return how long it took. Fails after ``seconds``."""
    start = time.monotonic()
    async with asyncio.timeout(seconds):
        while await reader.read(1 << 16):
            pass
    return time.monotonic() - start


async def test_reply_goes_back_over_the_connection_when_the_return_route_has_no_tcp_hop() -> None:
    """A peer's return route names only its own local worker: the reply still reaches it."""
    b, tb = await make_node("b", "127.0.0.1:0")
    await b.add_worker("echo", Echo())
    got: asyncio.Queue[bytes] = asyncio.Queue()
    assert tb.address is not None
    conn = await Connection.connect(*parse_host_port(tb.address), on_message=got.put_nowait)
    try:
        request = TransportMessage(Route(["echo"]), Route(["client"]), b"hello")
        await conn.send_message(request.encode())
        async with asyncio.timeout(10):
            reply = TransportMessage.decode(await got.get())
        assert reply.payload == b"hello"
        assert reply.onward_route == Route(["client"])
        assert reply.return_route == Route(["echo"])
        assert b.counters["unknown_worker"] == 0
    finally:
        await conn.close()
        await b.stop()


async def test_two_nodes_reply_over_the_connection_the_request_came_in_on() -> None:
    """A listens, yet its request carries no TCP hop: B answers over A's connection, dials nobody."""
    a, ta = await make_node("a", "127.0.0.1:0")
    b, tb = await make_node("b", "127.0.0.1:0")
    collector = Collector()
    await a.add_worker("collector", collector)
    await b.add_worker("echo", Echo())
    try:
        assert tb.address is not None
        await a.deliver(
            TransportMessage(Route([tcp(tb.address), "echo"]), Route(["collector"]), b"1")
        )
        async with asyncio.timeout(10):
            await collector.arrived.wait()
        assert collector.got[0].payload == b"1"
        assert collector.got[0].return_route == Route([tcp(tb.address), "echo"])
        assert tb.statistics()["opened"] == 0 and ta.statistics()["incoming"] == 0
        assert b.counters["transport_errors"] == 0 and b.counters["dropped"] == 0
    finally:
        await a.stop()
        await b.stop()


async def test_silent_connections_do_not_lock_out_a_real_peer() -> None:
    """256 idle sockets fill the transport; a real node still gets its reply (evictions)."""
    b, tb = await make_node("b", "127.0.0.1:0", first_frame_timeout=60.0)
    await b.add_worker("echo", Echo())
    a, _ = await make_node("a", None)
    collector = Collector()
    await a.add_worker("collector", collector)
    assert tb.address is not None
    host, port = parse_host_port(tb.address)
    idle: list[asyncio.StreamWriter] = []
    try:
        for _ in range(256):
            _, writer = await asyncio.open_connection(host, port)
            idle.append(writer)
        async with asyncio.timeout(10):
            while tb.statistics()["incoming"] < 256:  # noqa: ASYNC110 - accept has no event
                await asyncio.sleep(0.01)
        await a.deliver(
            TransportMessage(Route([tcp(tb.address), "echo"]), Route(["collector"]), b"real")
        )
        async with asyncio.timeout(10):
            await collector.arrived.wait()
        assert collector.got[0].payload == b"real"
        assert tb.statistics()["evicted"] >= 1
        assert tb.statistics()["incoming"] <= tb.max_connections
    finally:
        for writer in idle:
            writer.close()
        await a.stop()
        await b.stop()


async def test_a_connection_without_a_first_frame_is_closed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    b, tb = await make_node("b", "127.0.0.1:0", first_frame_timeout=0.5)
    try:
        assert tb.address is not None
        reader, writer = await asyncio.open_connection(*parse_host_port(tb.address))
        with caplog.at_level(logging.WARNING, logger="pipeline.dialogue.reader"):
            writer.write(b"\x08\x00")  # half a header, then nothing
            await eof_within(reader, 5)
        # closed by the first-frame deadline, not for another reason before it
        said = [r.getMessage() for r in caplog.records]
        assert any(m.endswith("no first frame in time, dropping the connection") for m in said), (
            said
        )
        writer.close()
        async with asyncio.timeout(5):
            while tb.statistics()["incoming"]:  # noqa: ASYNC110 - no event for the cleanup
                await asyncio.sleep(0.01)
    finally:
        await b.stop()


async def test_a_trickled_frame_is_cut_by_the_frame_deadline() -> None:
    """A valid first frame, then a header announcing 1 MiB whose bytes arrive one by one."""
    b, tb = await make_node("b", "127.0.0.1:0", frame_timeout=0.5, first_frame_timeout=5.0)
    await b.add_worker("echo", Echo())
    try:
        assert tb.address is not None
        reader, writer = await asyncio.open_connection(*parse_host_port(tb.address))
        first = TransportMessage(Route(["echo"]), Route(["x"]), b"hi").encode()
        writer.write(struct.pack(">BII", PacketType.MESSAGE | HAS_DATA, 0, len(first)) + first)
        writer.write(struct.pack(">BII", PacketType.MESSAGE | HAS_DATA, 0, (1 << 20) - 100))
        await writer.drain()

        async def trickle() -> None:
            while True:
                writer.write(b"\x00")
                await writer.drain()
                await asyncio.sleep(0.05)

        dribbler = asyncio.create_task(trickle())
        try:
            # the trickle never ends the frame: only the node's deadline closes the
            # connection (the limit here bounds a hang, not the deadline's speed)
            await eof_within(reader, 60)
        finally:
            dribbler.cancel()
            await asyncio.gather(dribbler, return_exceptions=True)
        writer.close()
    finally:
        await b.stop()


async def test_an_idle_connection_is_closed() -> None:
    b, tb = await make_node("b", "127.0.0.1:0", idle_timeout=0.5)
    tb.close_timeout = 0.5
    await b.add_worker("echo", Echo())
    try:
        assert tb.address is not None
        conn = await Connection.connect(*parse_host_port(tb.address), on_message=lambda d: None)
        request = TransportMessage(Route(["echo"]), Route(["client"]), b"x")
        await conn.send_message(request.encode())
        async with asyncio.timeout(5):
            await conn.wait_closed()  # the server signalled the close, our client finished it
            while tb.statistics()["incoming"]:  # noqa: ASYNC110 - no event for the cleanup
                await asyncio.sleep(0.01)
        await conn.close()
    finally:
        await b.stop()
