"""One Dialogue connection holds at most its budget queued, whatever it opens (issue 32, 1).

A client opens 16 feed duplexes (a connection's most, as a websocket's
subscriptions) from block 0 on one connection and reads none of them. Before, each duplex had its own 4,096-message send buffer and
nothing bounded the connection's total (RSS 338 -> 1,542 MB in the issue's
runs; ``/metrics`` showed nothing of it). Now what its duplexes hold queued
together stays within the Limits table's 8 MiB (and ``send_buffer``
messages), ``/metrics`` shows the feed's connections, duplexes and queued
bytes, the stalled duplexes are ended as too slow, and when the peer leaves
every duplex it had is let go.

Ending a stalled duplex waited for its connection's writing, which never comes
back while the peer reads nothing: whether it waited depended on where the
connection's writer was when the stall came, and then no duplex ever ended (one
of two fresh-clone runs, 2 of 10 beside a busy loop). Now an end waits at most
the feed's ``linger_s``, then the connection is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os

import aiohttp
import pytest

from pipeline.chain.produce.generator import SyntheticChain, write_blocks
from pipeline.chain.serve.dialogue_feed import CONNECTION_BYTES, end_duplex
from pipeline.chain.serve.server import FEED
from pipeline.chain.serve.wsconn import MAX_SUBSCRIPTIONS
from pipeline.dialogue.channel import DRAIN_ABOVE
from pipeline.dialogue.connection import Connection
from pipeline.dialogue.duplex import Duplex
from pipeline.dialogue.server import DialogueServer
from pipeline.errors import DuplexError
from pipeline.runtime.ports import free_port
from tests.support.poll import until

from .conftest import STREAM

DUPLEXES = MAX_SUBSCRIPTIONS
#: Each block's update: 32 KiB (64 KiB of hex in each result): 256 results (the test's
#: send buffer) of one duplex alone would be twice the connection's budget.
VALUE = 32 << 10


async def _metrics(base: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as http, http.get(base + "/metrics") as resp:
        text = await resp.text()
    return {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line.startswith("sluice_serve_dialogue_")
    }


async def test_one_connection_holds_at_most_its_budget_and_leaves_all_at_once(
    settings, serve, redis_client
) -> None:
    gen = SyntheticChain(seed=61)
    blocks = [dataclasses.replace(b, updates={"v": os.urandom(VALUE)}) for b in gen.take(200)]
    write_blocks(redis_client, STREAM, blocks)
    port = free_port()
    settings = settings.replace(serve_dialogue_port=port, serve_stall_s=2.0)
    async with serve(settings) as (base, app):
        feed = app[FEED]
        feed.linger_s = 1.0  # an end the peer does not take drops its connection sooner
        conn = await Connection.connect("127.0.0.1", port)
        try:
            params = json.dumps(["streams", "0x0", "0x" + blocks[0].hash.hex(), []]).encode()
            opened = [conn.duplex(params) for _ in range(DUPLEXES)]  # never read
            extra = conn.duplex(params)  # one more: refused at once
            with pytest.raises(DuplexError) as refused:
                await extra.receive()
            assert b"at most 16 subscriptions per connection" in refused.value.data
            seen = await until(
                lambda: _metrics(base),
                "the feed's figures with its duplexes",
                accept=lambda m: m.get("sluice_serve_dialogue_duplexes_open", 0) > 0,
                within_s=30,
            )
            assert seen["sluice_serve_dialogue_connections_open"] == 1
            # the stalled catch-ups end as too slow, within the budget (or, when their ends
            # are not taken either, with the connection dropped)
            await until(
                lambda: feed.figures()["sluice_serve_dialogue_duplexes_open"] < DUPLEXES,
                "stalled duplexes ended",
                within_s=60,
            )
            assert CONNECTION_BYTES // 2 < feed.peak_bytes <= CONNECTION_BYTES, feed.peak_bytes
            assert len(opened) == DUPLEXES
        finally:
            await conn.close(timeout=1.0)  # (it reads nothing: no orderly close to wait for)
        # the peer left: every duplex it had is let go
        await until(
            lambda: feed.figures()["sluice_serve_dialogue_duplexes_open"] == 0,
            "every duplex of the connection let go",
            within_s=30,
        )
        assert feed.figures()["sluice_serve_dialogue_queued_bytes"] == 0
        await until(
            lambda: feed.figures()["sluice_serve_dialogue_connections_open"] == 0,
            "the connection gone",
            within_s=30,
        )


async def test_an_end_the_peer_does_not_take_drops_its_connection() -> None:
    """The peer reads nothing and the server's writing of the connection is stuck with more
    than ``write_high`` queued behind it: ending a duplex (as too slow) waited for that
    writing forever, so the stalled duplexes were never let go. Now the end waits
    ``linger_s``, then the connection is dropped."""
    chunk = bytes(1 << 20)
    loop = asyncio.get_running_loop()
    outcome: asyncio.Future[bool] = loop.create_future()
    clients: list[Connection] = []

    async def pump(duplex: Duplex) -> None:
        while True:
            await duplex.send(chunk)

    async def on_duplex(duplex: Duplex) -> None:
        conn = duplex.host
        assert isinstance(conn, Connection)
        transport = conn.channel.writer.transport  # type: ignore[attr-defined]

        def stuck() -> bool:
            # The peer stopped reading (its duplex's queue is full) and the connection's
            # writer waits for a drain: nothing written for a while, the transport holding
            # more than a drain's worth. Nothing will be written again.
            return (
                not clients[0].reading
                and transport.get_write_buffer_size() > DRAIN_ABOVE
                and loop.time() - conn.last_activity > 0.5
            )

        senders = [asyncio.create_task(pump(duplex))]
        try:
            await until(stuck, "the server's writing stuck", within_s=30)
            senders.append(asyncio.create_task(duplex.send(chunk)))  # stays queued
            await asyncio.sleep(0)
            assert conn.protocol.bytes_to_send > conn.limits.write_high
            drops: list[None] = []
            await end_duplex(
                duplex, b"subscriber too slow", linger_s=0.5, on_drop=lambda: drops.append(None)
            )
            outcome.set_result(conn.closed and len(drops) == 1)  # dropped, and counted
        finally:
            for task in senders:
                task.cancel()
            await asyncio.gather(*senders, return_exceptions=True)

    async with DialogueServer("127.0.0.1", 0, on_duplex=on_duplex, close_timeout=1.0) as server:
        clients.append(await Connection.connect("127.0.0.1", server.port))
        try:
            clients[0].duplex(b"{}")  # never read
            # (the bound only ends the old hang: the end gives up after 0.5 s)
            assert await asyncio.wait_for(outcome, 30), "the connection dropped"
            await until(lambda: not server.connections, "the server let the connection go")
        finally:
            await clients[0].close(timeout=1.0)


async def test_a_flood_of_duplexes_is_refused_and_let_go_when_the_peer_leaves(
    settings, serve, redis_client
) -> None:
    """616 duplexes: 16 served, the rest refused at once (a connection's most, as a
    websocket's subscriptions), the server's sending backed up, and the server no longer
    reading the connection. Before, every duplex was served, and when the peer left they
    went on being served (RSS rising for minutes, the socket in CLOSE-WAIT)."""
    gen = SyntheticChain(seed=62)
    blocks = [dataclasses.replace(b, updates={"v": os.urandom(VALUE)}) for b in gen.take(40)]
    write_blocks(redis_client, STREAM, blocks)
    port = free_port()
    async with serve(settings.replace(serve_dialogue_port=port)) as (_base, app):
        feed = app[FEED]
        conn = await Connection.connect("127.0.0.1", port)
        params = json.dumps(["streams", "0x0", "0x" + blocks[0].hash.hex(), []]).encode()
        opened = [conn.duplex(params) for _ in range(MAX_SUBSCRIPTIONS)]
        await until(
            lambda: feed.figures()["sluice_serve_dialogue_queued_messages"] > 0,
            "the server's sending to it backed up",
        )
        opened += [conn.duplex(params) for _ in range(600)]  # refused; their ends wait
        # Whether the server's reading of the connection pauses depends on the kernel's
        # socket buffers (it did on a loaded machine, not on a quiet one): waited for, not
        # required; the peer leaving must let everything go either way.
        with contextlib.suppress(AssertionError):
            await until(
                lambda: (
                    feed.server is not None and all(not c.reading for c in feed.server.connections)
                ),
                "the server no longer reading the connection",
                within_s=3,
            )
        await conn.close(timeout=0.5)
        await until(
            lambda: feed.figures()["sluice_serve_dialogue_duplexes_open"] == 0,
            "every duplex of the connection let go",
        )
        await until(lambda: feed.figures()["sluice_serve_dialogue_connections_open"] == 0)
        assert len(opened) == MAX_SUBSCRIPTIONS + 600
