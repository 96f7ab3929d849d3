"""``sluice serve`` resumes from a lake on a real S3 server (versitygw), and says when it cannot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis

from pipeline import keys
from pipeline.chain.produce.generator import SyntheticChain, write_blocks
from pipeline.lake.archive import archive_interval
from pipeline.lake.canonical import mark_canonical
from pipeline.lake.trim import safe_trim
from pipeline.local.s3 import LocalStore
from pipeline.settings import Settings
from tests.support.poll import until

from .conftest import STREAM

pytestmark = pytest.mark.spark


async def _health(base: str) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session, session.get(base + "/healthz") as resp:
        body: dict[str, Any] = await resp.json()
        return resp.status, body


async def _lake_health(base: str, lake: str) -> tuple[int, dict[str, Any]]:
    """``/healthz`` once it says the lake is ``lake``."""
    got: tuple[int, dict[str, Any]] = await until(
        lambda: _health(base), f"healthz says the lake is {lake}",
        accept=lambda got: got[1]["lake"] == lake, within_s=60,
    )  # fmt: skip
    return got


async def test_catch_up_from_block_0_through_reorgs_from_an_s3_lake(
    spark: Any, serve: Any, connect: Any, redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """Lake (archived with the Arrow writer, marked, Redis trimmed), tail, live: no gap."""
    store = LocalStore(tmp_path / "s3").start()
    try:
        store.create_bucket("lake")
        settings = Settings.load(
            env={},
            redis_url=redis_url,
            lake_uri="s3://lake/serve",
            **store.lake_settings(),  # type: ignore[arg-type]
            serve_stream=STREAM,
            streams=(STREAM,),
            chain_streams=(STREAM,),
            reorg_threshold=8,
            hot_retention_s=0,
            archive_partitions=2,
            archive_range_entries=1,
        )
        chain = SyntheticChain(seed=11, reorg_every=25, reorg_depth=3)
        write_blocks(redis_client, STREAM, chain.take(300))
        seconds, micros = redis_client.time()
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        archived = archive_interval(spark, settings, STREAM, 1, now_ms + 1)
        assert archived.blocks == len(chain.emitted) and chain.reorgs > 0
        mark_canonical(spark, settings, STREAM)
        trimmed = safe_trim(settings, STREAM, now_ms=now_ms + 10**6)
        assert trimmed.trimmed > 200  # history now comes from the lake
        lake_part = len(chain.canonical)
        write_blocks(redis_client, STREAM, chain.take(40))  # the Redis tail

        async with serve(settings) as (base, _app):
            status, body = await until(
                lambda: _health(base), "healthz says ok", accept=lambda got: got[0] == 200
            )
            assert body["lake"] == "up", body
            async with connect(base) as client:
                await client.subscribe(0, chain.canonical[0].hash)
                got = await client.blocks(len(chain.canonical))
                assert got == chain.canonical and len(got) > lake_part
                before = len(chain.emitted)
                write_blocks(redis_client, STREAM, chain.take(10))  # live: every block, as sent
                live = await client.blocks(len(chain.emitted) - before)
                assert live == chain.emitted[before:]

            # The store goes away: the server says the lake is down, then up again.
            store.stop()
            status, body = await _lake_health(base, "down")
            assert status == 503 and body["status"] == "degraded"
            assert "refused the connection" in body["lake_error"]
            store.start()
            status, body = await _lake_health(base, "up")
            assert status == 200 and body["status"] == "ok"
        assert redis_client.xlen(keys.stream(STREAM)) < len(chain.emitted)
    finally:
        store.stop()
