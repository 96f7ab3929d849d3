"""Poison entries and frames against a real ``sluice node`` process: set aside, never a crash loop.

Every poison entry lands in the stream's dead-letter stream with its reason,
the consumer moves past it, good messages still flow, and the process stays
up through a kill -9 and a restart with the poison still in the stream.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path

import msgpack
import redis as sync_redis

from pipeline import keys
from pipeline.routing.message import Address, Route, StreamAddress, TransportMessage
from pipeline.runtime.ports import free_port
from tests.support.poll import until_sync

from .test_cli import Proc, env, procs  # noqa: F401 - fixtures

FIELD = b"data"


def poison() -> list[bytes]:
    """Entries that must never take a node down (each is dead-lettered)."""
    nested = b"\x91" * 100_000 + b"\xc0"
    return [
        b"\xc1",  # the one byte msgpack never uses
        nested,  # 100k-deep nesting
        b"\x94\x01" + nested,
        msgpack.packb([1, "not a route", [], b"x"]),
        msgpack.packb([1, [[0, "str, not bytes"]], [], b"x"]),
        msgpack.packb([2**63, [], [], b"x"]),
        b"\x94\xcf" + b"\xff" * 8 + b"\x90\x90\xc4\x01x",  # version 2**64 - 1
        msgpack.packb([1, [[0, b"x"]] * 33, [], b"x"]),  # one hop over the limit
        msgpack.packb([1, [], [], b"x"]),  # empty onward route
        TransportMessage(Route(["nobody"]), Route(), b"x").encode(),  # unknown worker
        msgpack.packb({"a": 1}),
        b"",
    ]


def good(tag: bytes) -> bytes:
    """An echo request whose reply goes into stream ``replies`` (checked directly in Redis)."""
    back = StreamAddress("replies", "stream_p").to_address()
    return TransportMessage(Route(["echo"]), Route([back, Address.local("sink")]), tag).encode()


def reply_payloads(client: sync_redis.Redis) -> list[bytes]:
    out = []
    for _, fields in client.xrange(keys.stream("replies")):
        out.append(TransportMessage.decode(fields[FIELD]).payload)
    return out


def wait_until(check: Callable[[], object], limit_s: float, what: str, proc: Proc) -> None:
    def alive_and_done() -> object:
        assert proc.proc.poll() is None, f"node died:\n{proc.text()}"
        return check()

    until_sync(
        alive_and_done, what, within_s=limit_s, every_s=0.05, detail=lambda: proc.text()[-3000:]
    )


def tcp_abuse(port: int) -> None:
    """Garbage and bombs over the node's TCP transport (each connection is simply closed)."""
    frames = [
        b"\xff" * 64,  # unknown type byte
        struct.pack(">BII", 0x08, 0, 0xFFFFFFFF),  # a 4 GiB frame announced
        struct.pack(">BII", 0x00, 0, 5),  # no data flag but a length
    ]
    bomb = b"\x94\x01" + b"\x91" * 100_000 + b"\xc0"
    frames.append(struct.pack(">BII", 0x08, 0, len(bomb)) + bomb)
    for frame in frames:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(frame)
            sock.settimeout(5)
            try:
                while sock.recv(4096):
                    pass
            except OSError:
                pass


def test_poison_is_set_aside_and_the_node_stays_up(
    env: dict[str, str],  # noqa: F811
    tmp_path: Path,
    procs: list[Proc],  # noqa: F811
    redis_client: sync_redis.Redis,
) -> None:
    port = free_port()
    args = ["--name", "P", "--workers", "echo", "--consume", "stream_p"]
    args += ["--listen", f"127.0.0.1:{port}"]
    node = Proc(args, env, tmp_path / "p.log")
    procs.append(node)
    node.wait_for("node P ready")
    stream, dead = keys.stream("stream_p"), keys.dead_letter("stream_p")
    bad = poison()
    oversized = b"\x00" * ((1 << 20) + 100_000)
    for entry in [*bad, oversized]:
        redis_client.xadd(stream, {FIELD: entry})
    redis_client.xadd(stream, {b"other": b"no data field"})
    redis_client.xadd(stream, {FIELD: good(b"after-poison")})
    tcp_abuse(port)
    wait_until(lambda: b"after-poison" in reply_payloads(redis_client), 30, "the good reply", node)
    wait_until(lambda: redis_client.xlen(dead) >= len(bad) + 2, 30, "dead letters", node)
    reasons = [fields[b"reason"] for _, fields in redis_client.xrange(dead)]
    assert all(reasons), reasons

    # A crash (kill -9) with poison still queued behind: the restarted node skips it, stays up.
    for entry in bad:
        redis_client.xadd(stream, {FIELD: entry})
    node.kill()
    again = Proc(args, env, tmp_path / "p2.log")
    procs.append(again)
    again.wait_for("node P ready")
    redis_client.xadd(stream, {FIELD: good(b"after-restart")})
    wait_until(lambda: b"after-restart" in reply_payloads(redis_client), 30, "reply", again)
    total = 2 * len(bad) + 2  # at least: the kill may make the node set one aside twice
    wait_until(lambda: redis_client.xlen(dead) >= total, 30, "dead letters", again)
    tcp_abuse(port)
    time.sleep(0.5)  # the node must still be up after the TCP abuse, not merely answer once
    redis_client.xadd(stream, {FIELD: good(b"still-up")})
    wait_until(lambda: b"still-up" in reply_payloads(redis_client), 30, "reply", again)
    assert again.terminate() == 0
    assert "Traceback" not in again.text(), again.text()
