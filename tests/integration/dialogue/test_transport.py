"""The TCP transport between nodes: in-process nodes, failures, and two `sluice node` processes."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.dialogue.connection import Connection
from pipeline.dialogue.transport import TcpTransport, parse_host_port
from pipeline.errors import ConfigError
from pipeline.routing.message import Address, AddressType, Route, TransportMessage
from pipeline.routing.node import Context, Node, Worker
from pipeline.routing.workers import Echo
from pipeline.runtime.ports import free_port
from pipeline.settings import Settings
from tests.support.poll import until

ROOT = Path(__file__).resolve().parents[3]


class Collector(Worker):
    def __init__(self) -> None:
        self.got: list[TransportMessage] = []

    async def handle(self, ctx: Context) -> None:
        self.got.append(ctx.message)


def tcp(address: str) -> Address:
    return Address(AddressType.TCP, address.encode())


async def make_node(name: str, listen: str | None) -> tuple[Node, TcpTransport]:
    node = Node(name)
    transport = TcpTransport(listen, Settings())
    node.register_transport(transport)
    await node.start()
    return node, transport


async def test_two_nodes_request_and_reply_over_tcp() -> None:
    a, ta = await make_node("a", "127.0.0.1:0")
    b, tb = await make_node("b", "127.0.0.1:0")
    collector = Collector()
    await a.add_worker("collector", collector)
    await b.add_worker("echo", Echo())
    try:
        assert tb.address is not None and ta.address is not None
        for i in range(50):
            await a.deliver(
                TransportMessage(Route([tcp(tb.address), "echo"]), Route(["collector"]), b"%d" % i)
            )
        await until(lambda: len(collector.got) >= 50)
        assert [m.payload for m in collector.got] == [b"%d" % i for i in range(50)]
        # The reply retraced the path: it arrived with B's address on its return route.
        assert collector.got[0].return_route[0] == tcp(tb.address)
        # B answered over the connection A opened (it learned A's address from it).
        assert tb.statistics()["opened"] == 0 and tb.statistics()["learned"] == 1
        assert b.counters["tcp_transport.received"] == 50
    finally:
        await a.stop()
        await b.stop()


async def test_reply_to_a_node_that_does_not_listen() -> None:
    a, ta = await make_node("a", None)
    b, tb = await make_node("b", "127.0.0.1:0")
    collector = Collector()
    await a.add_worker("collector", collector)
    await b.add_worker("echo", Echo())
    try:
        assert tb.address is not None
        await a.deliver(
            TransportMessage(Route([tcp(tb.address), "echo"]), Route(["collector"]), b"x")
        )
        await until(lambda: len(collector.got) >= 1)
        assert collector.got[0].payload == b"x"
    finally:
        await a.stop()
        await b.stop()


async def test_unreachable_peer_is_counted_not_fatal() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    a, _ = await make_node("a", None)
    try:
        msg = TransportMessage(Route([tcp(f"127.0.0.1:{port}"), "echo"]), Route(["x"]), b"x")
        await a.deliver(msg)
        assert a.counters["transport_errors"] == 1
    finally:
        await a.stop()


async def test_peer_restart_reconnects() -> None:
    a, _ = await make_node("a", None)
    b, tb = await make_node("b", "127.0.0.1:0")
    collector = Collector()
    await b.add_worker("collector", collector)
    address = tb.address
    assert address is not None
    try:
        msg = TransportMessage(Route([tcp(address), "collector"]), Route(["nobody"]), b"1")
        await a.deliver(msg)
        await until(lambda: len(collector.got) >= 1)
        await b.stop()
        b2, _ = await make_node("b2", address)
        collector2 = Collector()
        await b2.add_worker("collector", collector2)
        try:
            for _ in range(3):  # the first send may still find the dead connection
                await a.deliver(msg)
                if collector2.got:
                    break
                await asyncio.sleep(0.2)
            await until(lambda: len(collector2.got) >= 1)
        finally:
            await b2.stop()
    finally:
        await a.stop()


async def test_malformed_routed_message_is_dropped_and_counted() -> None:
    b, tb = await make_node("b", "127.0.0.1:0")
    try:
        assert tb.address is not None
        host, port = parse_host_port(tb.address)
        conn = await Connection.connect(host, port)
        await conn.send_message(b"\xc1 not msgpack")
        await conn.close()
        await until(lambda: b.counters["tcp_transport.bad_messages"])
    finally:
        await b.stop()


def test_bad_listen_address() -> None:
    with pytest.raises(ConfigError):
        TcpTransport("no-port")
    assert parse_host_port("[::1]:80") == ("::1", 80)
    made = TcpTransport.from_settings(Settings().replace(node_listen="127.0.0.1:0"))
    assert made.listen == "127.0.0.1:0"


def test_two_sluice_node_processes_talk_over_tcp(redis_url: str, tmp_path: Path) -> None:
    port, port_a = free_port(), free_port()
    env = {**os.environ, "SLUICE_REDIS_URL": redis_url, "PYTHONPATH": str(ROOT)}
    env.pop("PYTHONASYNCIODEBUG", None)
    cmd = [sys.executable, "-m", "pipeline.cli", "node"]
    record = tmp_path / "replies.txt"
    b = subprocess.Popen(
        [*cmd, "--name", "b", "--workers", "echo", "--listen", f"127.0.0.1:{port}"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    a = None
    try:
        deadline = 30.0
        import time

        start = time.monotonic()
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert b.poll() is None, b.communicate()[1].decode()
                assert time.monotonic() - start < deadline, "node b never listened"
                time.sleep(0.1)
        a = subprocess.Popen(
            [
                *cmd,
                "--name",
                "a",
                "--workers",
                "requester",
                "--listen",
                f"127.0.0.1:{port_a}",
                "--request-route",
                f"tcp:127.0.0.1:{port},echo",
                "--request-count",
                "5",
                "--record",
                str(record),
            ],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        start = time.monotonic()
        while not (record.exists() and len(record.read_bytes().splitlines()) >= 5):
            assert a.poll() is None, a.communicate()[1].decode()
            assert time.monotonic() - start < deadline, "no replies"
            time.sleep(0.1)
        assert record.read_bytes().splitlines() == [b"req-%d" % i for i in range(5)]
    finally:
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in (a, b):
            if proc is not None:
                try:
                    proc.communicate(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.communicate()
