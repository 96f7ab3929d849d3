"""The live tailer reads the chain stream through a script that leaves oversized
entries in Redis: a 20 MB hostile entry is refused (counted) without ever being sent
to ``sluice serve``, whose event loop would otherwise spend seconds reading it while
catch-ups run (``make bench B=abuse``, phase ``hostile+catchup``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import msgpack
import redis
import redis.asyncio as aioredis

from pipeline import keys
from pipeline.blockcodec import ENTRY_FIELD, MAX_ENTRY_BYTES, encode_block
from pipeline.chain.metrics import Metrics
from pipeline.chain.produce.generator import SyntheticChain
from pipeline.chain.produce.producer import WebsocketHub
from pipeline.chain.serve.relay import RedisTailer
from pipeline.chain.serve.tailwake import TailWake
from tests.support.poll import until

STREAM = "relay-filter"


@contextlib.asynccontextmanager
async def _tailing(
    client: aioredis.Redis, hub: WebsocketHub, metrics: Metrics, **kwargs: float
) -> AsyncIterator[RedisTailer]:
    """A running live tailer of ``STREAM`` on ``client``; stopped, and ``client``
    closed, on leaving."""
    tailer = RedisTailer(client, STREAM, hub, metrics, **kwargs)
    task = asyncio.create_task(tailer.run())
    try:
        yield tailer
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await client.aclose()


async def test_the_live_tailer_never_fetches_an_oversized_entry(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    sync = redis.Redis.from_url(redis_url)
    key = keys.stream(STREAM)
    hub, metrics = WebsocketHub(), Metrics()
    try:
        async with _tailing(client, hub, metrics) as tailer:
            await until(lambda: tailer.up, "the tailer started")
            blocks = SyntheticChain(seed=9).take(3)
            hostile = msgpack.packb(
                {"num": 1, "hash": b"\xee" * 32, "parent": blocks[0].hash,
                 "updates": {"k": b"\x00" * (20 << 20)}},
                use_bin_type=True,
            )  # fmt: skip
            assert len(hostile) > MAX_ENTRY_BYTES
            sent_before = int(sync.info("stats")["total_net_output_bytes"])
            sync.xadd(key, {ENTRY_FIELD: encode_block(blocks[0])})
            sync.xadd(key, {ENTRY_FIELD: hostile})
            for block in blocks[1:]:
                sync.xadd(key, {ENTRY_FIELD: encode_block(block)})
            await until(lambda: hub.published >= 3, "the three good blocks published")
            assert hub.published == 3 and hub.last is not None and hub.last.num == blocks[-1].num
            assert metrics.values["sluice_serve_entries_refused_total"] == 1
            sent = int(sync.info("stats")["total_net_output_bytes"]) - sent_before
            assert sent < 1 << 20, f"{sent} bytes sent by redis: the hostile entry left it"
    finally:
        sync.close()


async def _idle_rate(sync: redis.Redis, seconds: float) -> float:
    """Commands per second Redis processed over about ``seconds`` (its own count)."""
    t0, c0 = time.monotonic(), int(sync.info("stats")["total_commands_processed"])
    await asyncio.sleep(seconds)  # (a measured window, not a wait for something)
    c1 = int(sync.info("stats")["total_commands_processed"])
    return (c1 - c0 - 1) / (time.monotonic() - t0)


async def test_an_idle_tailer_waits_for_redis_to_say_the_stream_was_written(
    redis_url: str,
) -> None:
    # idle_s=60: only Redis's invalidation message can wake it in time for the block
    client = aioredis.Redis.from_url(redis_url)
    sync = redis.Redis.from_url(redis_url)
    hub, metrics = WebsocketHub(), Metrics()
    try:
        async with _tailing(client, hub, metrics, idle_s=60) as tailer:
            await until(lambda: tailer.up and tailer.wake.tracking, "the tailer is woken by redis")
            # idle: a poll every 10 ms was 100 commands a second, whatever happened
            assert await _idle_rate(sync, 1.0) < 5
            blocks = SyntheticChain(seed=10).take(2)
            for block in blocks:
                sync.xadd(keys.stream(STREAM), {ENTRY_FIELD: encode_block(block)})
                await until(lambda n=block.num: hub.last is not None and hub.last.num == n)
            sync.xadd("sluice:{other}:stream", {"x": b"y"})  # another key: not a wake-up
            assert hub.published == 2 and metrics.total("sluice_serve_redis_errors_total") == 0
    finally:
        sync.close()


async def test_where_redis_refuses_tracking_the_tailer_polls_and_says_so(
    redis_url: str, caplog
) -> None:
    sync = redis.Redis.from_url(redis_url)
    sync.acl_setuser("notrack", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"],
                     commands=["+@all", "-client"])  # fmt: skip
    client = aioredis.Redis.from_url(redis_url, username="notrack", password="pw")
    hub, metrics = WebsocketHub(), Metrics()
    try:
        async with _tailing(client, hub, metrics, idle_s=60) as tailer:
            await until(lambda: tailer.up, "the tailer started")
            block = SyntheticChain(seed=11).take(1)[0]
            sync.xadd(keys.stream(STREAM), {ENTRY_FIELD: encode_block(block)})
            await until(lambda: hub.published == 1, "published by polling")
            assert not tailer.wake.tracking
            assert metrics.labelled["sluice_serve_redis_errors_total"]['kind="auth"'] >= 1
            assert "no wake-up from redis" in caplog.text
    finally:
        sync.acl_deluser("notrack")
        sync.close()


async def test_the_wake_up_connection_is_renewed_without_leaking_one(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    sync = redis.Redis.from_url(redis_url)
    wake = TailWake(client, keys.stream(STREAM), idle_s=0.02, renew_s=0.05)
    try:
        while wake.opened < 5:
            await wake.wait()
        assert wake.tracking
        subscribers = sync.client_list(_type="pubsub")
        assert len(subscribers) == 1, subscribers  # each old one closed
    finally:
        await wake.close()
        await client.aclose()
    assert sync.client_list(_type="pubsub") == []
    sync.close()
