"""``sluice serve`` gives memory back after many subscribers catch up and leave (issue 20).

A serve process is warmed by one catch-up from block 0 (its first release of
native memory done); then 50 subscribers catch up at once from random heights
through the lake and the Redis tail, and leave. Its resident memory must come
back within a margin of the warmed baseline. The history cache is off: what it
keeps is bounded by its own setting, and would hide the native memory this
test is about. Before (12,000 blocks in the lake): 91 MB at start, 344 MB
warmed, 1,090 MB with the 50 and still 1,090 MB after they left (the Arrow
pool's mimalloc held 658 MB of it). After: 195 MB warmed, 256 MB after.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import sys
from pathlib import Path

import aiohttp
import redis

from pipeline.chain.generator import SyntheticChain, write_blocks
from pipeline.ports import free_port
from tests.integration.chain.conftest import STREAM, write_lake
from tests.integration.chain.test_cardinal_go import _listening
from tests.support.poll import until

#: How far above the warmed baseline the resident memory may stay once everyone left.
MARGIN = 1.5
log = logging.getLogger(__name__)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def catch_up(url: str, num: int, block_hash: str) -> int:
    """Subscribe from (num, hash) in the cardinal dialect; read until ``ready``; leave."""
    call = {"jsonrpc": "2.0", "id": 1, "method": "cardinal_subscribe",
            "params": ["streams", hex(num), block_hash]}  # fmt: skip
    count = 0
    async with aiohttp.ClientSession() as session, session.ws_connect(url, max_msg_size=0) as ws:
        await ws.send_str(json.dumps(call))
        async for msg in ws:
            data = json.loads(msg.data)
            result = data.get("params", {}).get("result", {})
            if result.get("type") == "ready":
                return count
            count += 1
    raise AssertionError("closed before ready")


async def _metric(port: int, name: str) -> float:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/metrics") as resp,
    ):
        text = await resp.text()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


async def test_serve_gives_memory_back_after_subscribers_leave(
    settings, redis_client: redis.Redis
) -> None:
    gen = SyntheticChain(seed=81, prefixes=("s/", "t/"))
    write_lake(settings.lake.uri, gen.take(8_000))
    write_blocks(redis_client, STREAM, gen.take(1_000))
    port = free_port()
    env = {
        **os.environ,
        "SLUICE_REDIS_URL": settings.redis.url,
        "SLUICE_LAKE_URI": settings.lake.uri,
        "SLUICE_SERVE_STREAM": STREAM,
        "SLUICE_LOG_LEVEL": "WARNING",
        "SLUICE_SERVE_HISTORY_CACHE_MB": "0",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pipeline.cli", "serve", "--port", str(port), env=env
    )
    try:
        await _listening(port, 60)
        started = rss_mb(proc.pid)
        url = f"ws://127.0.0.1:{port}/cardinal"
        releases = "sluice_serve_memory_releases_total"

        assert await catch_up(url, 0, "0x" + "00" * 32) > 8_500
        await until(lambda: _metric(port, releases), "a release after the warm-up", within_s=60)
        warmed = await _metric(port, releases)
        baseline = rss_mb(proc.pid)

        rng = random.Random(82)
        heights = [rng.randrange(0, 8_500) for _ in range(50)]
        starts = [(h, "0x" + gen.canonical[h].hash.hex()) for h in heights]
        counts = await asyncio.gather(*(catch_up(url, h, bh) for h, bh in starts))
        assert all(c > 0 for c in counts)
        peak = rss_mb(proc.pid)

        # the releaser looks every 10 s; a hang, not a speed, is what the deadline bounds
        after = await until(
            lambda: rss_mb(proc.pid),
            f"resident memory back within {MARGIN}x of the warmed {baseline:.0f} MB",
            within_s=60,
            every_s=1,
            accept=lambda mb: mb <= baseline * MARGIN,
            detail=lambda: f"peak {peak:.0f} MB",
        )
        log.warning(
            "serve RSS: started %.0f MB, warmed %.0f MB, with 50 subscribers %.0f MB, "
            "after they left %.0f MB",
            started, baseline, peak, after,
        )  # fmt: skip
        assert await _metric(port, releases) > warmed  # it was given back, not never taken
        assert await _metric(port, "sluice_serve_resident_bytes") > 0
    finally:
        proc.terminate()
        await proc.wait()
