"""The websocket writer (aiohttp's public send_frame) serves lake, tail and live blocks in order."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from aiohttp import web

from pipeline.blockcodec import Block
from pipeline.chain.history import fromlake
from pipeline.chain.outbox import Outbox
from pipeline.chain.produce.generator import SyntheticChain, write_blocks
from pipeline.chain.produce.producer import MuxProducer, RedisStreamProducer, WebsocketHub
from pipeline.chain.serve.appkeys import CONNECTIONS, METRICS
from pipeline.chain.serve.wsconn import Connection

from .conftest import STREAM, write_lake


@pytest.fixture
async def producer(
    redis_url: str,
) -> AsyncIterator[Callable[[WebsocketHub], Awaitable[MuxProducer]]]:
    """A block producer into Redis and a hub, closed when the test ends, failed or not
    (a leaked client's sockets surfaced as ResourceWarnings in a later test's collection)."""
    made: list[MuxProducer] = []

    async def make(hub: WebsocketHub) -> MuxProducer:
        client = aioredis.Redis.from_url(redis_url)
        made.append(
            MuxProducer([("redis", RedisStreamProducer(client, STREAM)), ("websocket", hub)])
        )
        return made[-1]

    yield make
    for mux in made:
        await mux.close()


async def test_lake_tail_and_live_in_order_through_the_public_writer(
    settings, serve, connect, redis_client: redis.Redis
) -> None:
    chain = SyntheticChain(seed=7)
    write_lake(settings.lake.uri, chain.take(600))
    write_blocks(redis_client, STREAM, chain.take(100))
    async with serve(settings) as (base, _app), connect(base) as client:
        await client.subscribe(0, chain.canonical[0].hash)
        got = await client.blocks(700)
        write_blocks(redis_client, STREAM, chain.take(50))
        got += await client.blocks(50)
    assert got == chain.canonical[:750]


async def test_live_blocks_to_a_peer_that_stops_reading_arrive_whole_and_in_order(
    settings, serve, connect, producer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Live frames meet aiohttp's flow control: nothing lost, nothing reordered.

    The peer stops reading, so the server's transport pauses and the writer's
    ``send_frame`` waits; later blocks queue behind it in the bounded outbox
    (the deepest queue is recorded); once the peer reads again every block
    arrives once, in order.
    """
    deepest = 0
    real_offer = Outbox.offer

    def recording_offer(self: Outbox, texts: Sequence[bytes], wire: bytes | None = None) -> bool:
        nonlocal deepest
        taken = real_offer(self, texts, wire)
        deepest = max(deepest, len(self))
        return taken

    monkeypatch.setattr(Outbox, "offer", recording_offer)
    blocks, parent = [], bytes(32)
    for num in range(400):
        block_hash = hashlib.blake2b(num.to_bytes(8, "big"), digest_size=32).digest()
        blocks.append(
            Block(
                num=num,
                hash=block_hash,
                parent=parent,
                updates={"big": os.urandom(24_000)},
                weight=num + 1,  # what the subscriber (weight opted in) is told
            )
        )
        parent = block_hash
    hub = WebsocketHub()
    mux = await producer(hub)
    await mux.send(blocks[0])
    async with (
        serve(settings.replace(serve_send_buffer=4096), relay=False, hub=hub) as (base, _app),
        connect(base, max_msg_size=1 << 20) as sub,
    ):
        await sub.subscribe(0, blocks[0].hash)
        got = await sub.blocks(1)
        for block in blocks[1:]:  # the peer reads nothing meanwhile
            await mux.send(block)
        assert deepest > 50, "frames never queued behind a paused transport: nothing tested"
        got += await sub.blocks(len(blocks) - 1, wait_s=60)
    assert [b.num for b in got] == list(range(len(blocks))) and got == blocks


async def test_lake_pages_encoded_in_slices_arrive_whole_and_in_order(
    settings, serve, connect, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lake page longer than ENCODE_ROWS is encoded slice by slice: no block lost or repeated."""
    monkeypatch.setattr(fromlake, "ENCODE_ROWS", 100)  # pages of the server are 8,192 rows
    chain = SyntheticChain(seed=8)
    write_lake(settings.lake.uri, chain.take(1100))
    async with serve(settings) as (base, _app), connect(base) as client:
        await client.subscribe(0, chain.canonical[0].hash)
        got = await client.blocks(1100)
    assert got == chain.canonical[:1100]


async def test_catch_up_goes_out_in_bursts_whole_and_in_order(
    settings, serve, connect, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Catch-up frames are written in bursts (pipeline.chain.burst), not one send_frame each;
    a frame longer than a burst goes through send_frame alone, in its place."""
    calls = 0
    real_send = web.WebSocketResponse.send_frame

    async def send_frame(self: web.WebSocketResponse, *args: Any, **kwargs: Any) -> None:
        nonlocal calls
        calls += 1
        await real_send(self, *args, **kwargs)

    monkeypatch.setattr(web.WebSocketResponse, "send_frame", send_frame)
    chain = SyntheticChain(seed=11)
    big = {100, 101, 350}  # frames of about 300 kB: over BURST_BYTES
    blocks = [
        dataclasses.replace(b, updates={"big": os.urandom(150_000)}) if b.num in big else b
        for b in chain.take(600)
    ]
    write_lake(settings.lake.uri, blocks)
    async with serve(settings) as (base, _app), connect(base, max_msg_size=1 << 20) as client:
        await client.subscribe(0, blocks[0].hash)
        got = await client.blocks(len(blocks), wait_s=60)
    assert got == blocks
    assert calls < len(blocks) // 4, calls


async def test_live_frames_go_out_from_the_fan_out_and_a_stalled_peer_never_holds_it(
    settings, serve, connect, producer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reading peer's live frames are written by the hub's own task, each block's frames
    at once as one write of the shared wire bytes (no send_frame, no writer wake-up); a
    peer that stopped reading gets its frames through its writer once it reads again, in
    order after those written directly, and the fan-out to the reading peer goes on."""
    senders: list[str] = []
    direct: list[str] = []
    real_send = web.WebSocketResponse.send_frame
    real_direct = Connection._write_direct

    async def send_frame(self: web.WebSocketResponse, *args: Any, **kwargs: Any) -> None:
        task = asyncio.current_task()
        senders.append(task.get_name() if task is not None else "")
        await real_send(self, *args, **kwargs)

    def write_direct(self: Connection, wire: bytes, count: int) -> bool:
        written = real_direct(self, wire, count)
        if written:
            task = asyncio.current_task()
            direct.append(task.get_name() if task is not None else "")
        return written

    monkeypatch.setattr(web.WebSocketResponse, "send_frame", send_frame)
    monkeypatch.setattr(Connection, "_write_direct", write_direct)
    chain = SyntheticChain(seed=9)
    hub = WebsocketHub()
    mux = await producer(hub)
    await mux.send(chain.take(1)[0])
    big = [
        Block(
            num=b.num,
            hash=b.hash,
            parent=b.parent,
            weight=b.weight,
            updates={"big": os.urandom(24_000)},
        )
        for b in chain.take(200)
    ]
    async with (
        serve(settings.replace(serve_send_buffer=4096), relay=False, hub=hub) as (base, _app),
        connect(base, max_msg_size=1 << 20) as reading,
        connect(base, max_msg_size=1 << 20) as stalled,
    ):
        await reading.subscribe(0, chain.canonical[0].hash)
        await stalled.subscribe(0, chain.canonical[0].hash)
        await reading.blocks(1)
        await stalled.blocks(1)
        senders.clear()
        direct.clear()
        got = []
        for block in big:  # the stalled peer reads nothing meanwhile
            await mux.send(block)
            got += await reading.blocks(1)
        assert got == big  # the fan-out to the reading peer went on
        hub_task = asyncio.current_task().get_name()  # type: ignore[union-attr]
        # every block to the reading peer, at least, written directly by the fan-out
        assert direct.count(hub_task) >= len(big) and set(direct) == {hub_task}, direct[:20]
        assert "ws-writer" in senders  # the stalled peer's queued frames: its writer
        assert await stalled.blocks(len(big), wait_s=60) == big


@pytest.mark.parametrize("sender", ["send_frame", "writer", "transport"])
async def test_a_connection_whose_live_send_fails_ends_alone(
    settings, serve, connect, producer: Any, monkeypatch: pytest.MonkeyPatch, sender: str
) -> None:
    """An unexpected error in one connection's live send (inline or direct write) closes
    that connection (1011, counted) and never the fan-out: the other subscriber gets every
    block."""
    chain = SyntheticChain(seed=10)
    hub = WebsocketHub()
    mux = await producer(hub)
    await mux.send(chain.take(1)[0])
    async with (
        serve(settings, relay=False, hub=hub) as (base, app),
        connect(base) as one,
        connect(base) as two,
    ):
        for sub in (one, two):
            await sub.subscribe(0, chain.canonical[0].hash)
            await sub.blocks(1)
        victim = next(iter(app[CONNECTIONS]))

        async def broken(*args: Any, **kwargs: Any) -> None:
            raise RuntimeError("boom")

        real_write = victim._transport.write

        def broken_write(data: bytes) -> None:
            if data[:1] == b"\x81":  # text frames: the close frame still goes out
                raise RuntimeError("boom")
            real_write(data)

        if sender == "send_frame":  # the inline send of queued frames
            monkeypatch.setattr(victim.outbox, "_direct", None)
            monkeypatch.setattr(victim.ws, "send_frame", broken)
        elif sender == "writer":  # the connection's writer task (it sends what is queued)
            monkeypatch.setattr(victim.outbox, "_direct", None)
            monkeypatch.setattr(victim.outbox, "_inline", None)
            monkeypatch.setattr(victim._transport, "write", broken_write)
        else:  # the direct write of live frames
            monkeypatch.setattr(victim._transport, "write", broken_write)
        blocks = chain.take(20)
        for block in blocks:
            await mux.send(block)
        outcomes: list[Any] = []
        for sub in (one, two):
            try:
                outcomes.append(await sub.blocks(len(blocks), wait_s=10))
            except ConnectionError as exc:
                outcomes.append(exc)
        closed = [o for o in outcomes if isinstance(o, ConnectionError)]
        assert len(closed) == 1 and "1011" in str(closed[0]), outcomes
        assert [o for o in outcomes if not isinstance(o, ConnectionError)] == [blocks]
        assert app[METRICS].values["sluice_serve_internal_errors_total"] == 1
