"""Subscribers that stop reading are closed as the docs say (issue 32, 5).

Two websocket subscribers with small socket buffers stop reading while live
blocks keep coming. Each is closed with 1008 and the reason (read after what
was already sent, once it reads again), ``sluice_serve_slow_disconnects_total``
counts both, and one line is logged for the condition. With a long heartbeat
it is the full send buffer that finds them; with a short one the heartbeat's
unanswered ping, which before cut them with a bare EOF: no reason, no line,
nothing counted (186 of 200 slow readers in the issue's run). A peer that
answers no ping while nothing sent to it waits is not a slow subscriber: it is
closed with 1011 ``keepalive ping timeout``, counted apart.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import socket
import struct
from typing import Any

import pytest

from pipeline.chain.produce.generator import SyntheticChain, write_blocks
from pipeline.chain.serve import wswrite
from pipeline.chain.serve.appkeys import METRICS
from tests.support.poll import until

from .conftest import STREAM
from .test_admission import UPGRADE, guarded

#: A live block's update: 32 KiB (64 KiB of hex in each notification).
BIG = 32 << 10
CLOSE, PING, TEXT = 0x8, 0x9, 0x1


class RawSubscriber:
    """A websocket client on a raw socket with a small receive buffer, reading only when told."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> RawSubscriber:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        # a 1 KiB limit: the stream stops reading the socket with 2 KiB unread
        reader, writer = await asyncio.open_connection(sock=sock, limit=1024)
        writer.write(UPGRADE + b"\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101"), head
        return cls(reader, writer)

    def send(self, opcode: int, payload: bytes) -> None:
        mask = os.urandom(4)
        if len(payload) < 126:
            head = bytes([0x80 | opcode, 0x80 | len(payload)])
        else:
            head = bytes([0x80 | opcode, 0x80 | 126]) + struct.pack("!H", len(payload))
        self.writer.write(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    async def frame(self, *, pong: bool = True) -> tuple[int, bytes]:
        """The next frame (pings answered on the way unless ``pong`` is false)."""
        while True:
            b0, b1 = await self.reader.readexactly(2)
            n = b1 & 0x7F
            if n == 126:
                (n,) = struct.unpack("!H", await self.reader.readexactly(2))
            elif n == 127:
                (n,) = struct.unpack("!Q", await self.reader.readexactly(8))
            payload = await self.reader.readexactly(n)
            if b0 & 0x0F != PING:
                return b0 & 0x0F, payload
            if pong:
                self.send(0xA, payload)

    async def subscribe(self, num: int, hash: bytes) -> None:
        params = ["streams", hex(num), "0x" + hash.hex(), []]
        self.send(
            TEXT,
            json.dumps(
                {"jsonrpc": "2.0", "id": 1, "method": "cardinal_subscribe", "params": params}
            ).encode(),
        )
        while True:
            opcode, payload = await self.frame()
            assert opcode == TEXT, (opcode, payload)
            if json.loads(payload).get("id") == 1:
                return

    async def close_frame(self) -> tuple[int, str]:
        """Read on to the close frame: its code and reason.

        A ping read on the way is not answered: past the server's time to read, its
        socket is closed, and a pong written to it then draws a reset that drops what
        this side had not read yet, the close frame with it (one suite run at load 4:
        ``ConnectionResetError`` where the 1008 was).
        """
        while True:
            opcode, payload = await self.frame(pong=False)
            if opcode == CLOSE:
                return struct.unpack("!H", payload[:2])[0], payload[2:].decode()


def _big(gen: SyntheticChain, n: int) -> list[Any]:
    return [dataclasses.replace(b, updates={"big": os.urandom(BIG)}) for b in gen.take(n)]


@pytest.mark.parametrize(
    ("heartbeat_s", "send_buffer", "behind", "reason"),
    [
        # live blocks fill the send buffer; the heartbeat is out of the way
        (120.0, 8, 0, "subscriber too slow: send buffer of 8 messages full"),
        # a catch-up of big blocks (6 MB) follows the subscription's reply at once, so what
        # was sent is not taken when the heartbeat's verdict comes; the buffer never fills
        (1.0, 4096, 96, "subscriber too slow: not reading (no pong within 0.5s)"),
    ],
    ids=["send-buffer-full", "heartbeat"],
)
async def test_subscribers_that_stop_reading_are_closed_with_1008(
    settings,
    redis_client,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    heartbeat_s: float,
    send_buffer: int,
    behind: int,
    reason: str,
) -> None:
    gen = SyntheticChain(seed=52)
    write_blocks(redis_client, STREAM, gen.take(3))
    head = gen.canonical[-1]
    write_blocks(redis_client, STREAM, _big(gen, behind))
    settings = settings.replace(serve_heartbeat_s=heartbeat_s, serve_send_buffer=send_buffer)
    caplog.set_level(logging.INFO)
    # The first one closed waits for the second before it reads: on a loaded machine the
    # default 10 s to read could run out first (its connection dropped, its 1008 unread).
    monkeypatch.setattr(wswrite, "SLOW_CLOSE_S", 120.0)
    async with guarded(settings) as (_base, port, app):
        slow = [await RawSubscriber.open(port) for _ in range(2)]
        await asyncio.gather(*(sub.subscribe(head.num, head.hash) for sub in slow))
        # from here on neither reads: big live blocks until the server lets both go
        metrics = app[METRICS].values
        written = 0
        while metrics["sluice_serve_slow_disconnects_total"] < 2 and written < 2000:
            written += write_blocks(redis_client, STREAM, _big(gen, 1))
            await asyncio.sleep(0.01)
        assert metrics["sluice_serve_slow_disconnects_total"] == 2, written
        # reading again: what was sent before, then the close with its code and reason
        closes = await asyncio.gather(*(sub.close_frame() for sub in slow))
        assert closes == [(1008, reason)] * 2
        for sub in slow:
            sub.writer.close()
        await until(lambda: not app[METRICS].values["sluice_serve_subscriptions_open"])
    lines = [
        r.getMessage() for r in caplog.records if "closing a subscriber with 1008" in r.getMessage()
    ]
    assert len(lines) == 1 and reason in lines[0], lines
    assert metrics["sluice_serve_heartbeat_timeouts_total"] == 0


async def test_a_peer_that_answers_no_ping_with_nothing_pending_is_closed_1011(
    settings, redis_client
) -> None:
    """Nothing sent to it waits: not a slow subscriber but a peer gone (or mute)."""
    settings = settings.replace(serve_heartbeat_s=0.5)
    async with guarded(settings) as (_base, port, app):
        mute = await RawSubscriber.open(port)
        metrics = app[METRICS].values
        await until(lambda: metrics["sluice_serve_heartbeat_timeouts_total"] == 1, "timed out")
        head = await mute.reader.readexactly(2)  # the ping, unanswered
        assert head[0] & 0x0F == PING
        await mute.reader.readexactly(head[1] & 0x7F)
        assert await mute.close_frame() == (1011, "keepalive ping timeout")
        mute.writer.close()
        assert metrics["sluice_serve_slow_disconnects_total"] == 0
