"""``/status.json`` in process: shared snapshots, a throttled lake read, faults reported not raised."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest
import redis
from aiohttp.test_utils import TestServer

from pipeline import keys
from pipeline.blockcodec import ENTRY_FIELD, Block, encode_block
from pipeline.chain.serve import statusboard
from pipeline.chain.serve.server import create_app
from pipeline.chain.serve.status import BOARD
from pipeline.chain.serve.statusboard import SNAPSHOT_TTL_S
from pipeline.runtime import snapshot
from pipeline.settings import Settings
from tests.support.clock import HandClock

from .test_status_page import write_archive_log

STREAM = "chain:json"


def _settings(redis_url: str, lake_uri: str) -> Settings:
    return Settings.load(
        env={}, config_path="/nonexistent", redis_url=redis_url, lake_uri=lake_uri,
        serve_stream=STREAM, chain_streams=(STREAM, "chain:other"),
    )  # fmt: skip


def _add_blocks(client: redis.Redis, stream: str, nums: range) -> None:
    for num in nums:
        block = Block(
            num=num, hash=num.to_bytes(32, "big"), parent=max(num - 1, 0).to_bytes(32, "big"),
            updates={}, deletes=(), batches={}, subbatches=(),
        )  # fmt: skip
        client.xadd(keys.stream(stream), {ENTRY_FIELD: encode_block(block)})


async def _get(session: aiohttp.ClientSession, url: str) -> dict:  # type: ignore[type-arg]
    async with session.get(url) as reply:
        assert reply.status == 200
        return await reply.json()  # type: ignore[no-any-return]


async def test_many_viewers_share_snapshots_and_lake_reads(
    redis_url: str, lake_uri: str, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    now_ms = int(time.time() * 1000)
    write_archive_log(lake_uri, STREAM, [(now_ms - 9000, now_ms - 5000, 40)])
    _add_blocks(redis_client, STREAM, range(30))
    app = create_app(_settings(redis_url, lake_uri))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        url = f"http://127.0.0.1:{server.port}/status.json"
        async with aiohttp.ClientSession() as session:
            deadline = time.monotonic() + 10
            while (await _get(session, url))["streams"][0]["head"] is None:
                assert time.monotonic() < deadline, "the tail never saw the blocks"
                await asyncio.sleep(0.1)
            board = app[BOARD]
            # The clock the board and its snapshot read stands still from here: the
            # sharing is a condition on that clock, not a bound on how long this took.
            clock = HandClock()
            monkeypatch.setattr(snapshot, "time", clock)
            monkeypatch.setattr(statusboard, "time", clock)
            builds, reads = board.builds, board.lake_reads
            # 100 viewers polling three times while the clock stands still: one snapshot
            for _ in range(3):
                pages = await asyncio.gather(*(_get(session, url) for _ in range(100)))
            assert board.builds - builds <= 1
            assert board.lake_reads - reads <= 1
            # one snapshot TTL later: exactly one more build for all of them
            builds = board.builds
            clock.now += SNAPSHOT_TTL_S
            pages = await asyncio.gather(*(_get(session, url) for _ in range(100)))
            assert board.builds - builds == 1
            assert all(p["streams"][0]["head"]["num"] == 29 for p in pages)
            data = pages[-1]
            names = [s["name"] for s in data["streams"]]
            assert names == [STREAM, "chain:other"]
            served, other = data["streams"]
            assert served["coverage"]["run_count"] == 1 and served["coverage"]["blocks"] == 40
            assert served["redis"]["length"] == 30 and served["subscribers"] == 0
            assert other["head"] is None and other["redis"]["length"] == 0
            assert other["subscribers"] is None
            # the page and its files are served
            for path, kind in [("/", "text/html"), ("/static/status.js", "application/javascript")]:
                async with session.get(f"http://127.0.0.1:{server.port}{path}") as reply:
                    assert reply.status == 200 and reply.content_type == kind
    finally:
        await server.close()


async def test_unreadable_lake_and_redis_down_are_reported(redis_factory, tmp_path: Path) -> None:
    local = redis_factory()
    lake = tmp_path / "lake"
    (lake / "archive_log" / "_delta_log").mkdir(parents=True)
    (lake / "archive_log" / "_delta_log" / "00000000000000000000.json").write_text("not json\n")
    app = create_app(_settings(local.url, str(lake)))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        url = f"http://127.0.0.1:{server.port}/status.json"
        async with aiohttp.ClientSession() as session:
            data = await _get(session, url)
            assert data["lake"]["error"] and "archive_log" in data["lake"]["error"]
            assert data["streams"][0]["coverage"]["runs"] == []
            local.kill()
            deadline = time.monotonic() + 15
            while (data := await _get(session, url))["redis"]["up"]:
                assert time.monotonic() < deadline, "redis down never shown"
                await asyncio.sleep(0.3)
            assert data["streams"][0]["redis"] is None
    finally:
        await server.close()
