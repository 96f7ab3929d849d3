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
from typing import Any

import aiohttp
import pytest
import redis

from pipeline.chain.produce.generator import SyntheticChain, write_blocks
from pipeline.runtime.ports import free_port
from tests.integration.chain.conftest import STREAM, write_lake
from tests.integration.chain.test_cardinal_go import _listening
from tests.support.poll import until

#: make soak only (~40 s quiet, and RSS under a loaded machine's scheduling is noise):
#: ``make bench B=abuse`` reports the same before / peak / after figures
pytestmark = pytest.mark.soak

#: How far above the warmed baseline the resident memory may stay once everyone left.
MARGIN = 1.5
#: Seconds between the releaser's looks in these tests (``SLUICE_SERVE_RELEASE_EVERY_S``;
#: 10 s by default): the waits below end at its next look instead of up to 10 s later.
RELEASE_EVERY_S = 2
#: The deadline of a wait for the releaser: it bounds a hang only, so it is longer than
#: the releaser's longest wait between two checks (after fruitless releases, made while
#: subscribers still held their memory, it waits up to 16 times its period;
#: ``memory.Releaser``), even at the default period of 10 s.
RELEASE_WITHIN_S = 16 * 10 + 60
log = logging.getLogger(__name__)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def rss_back(pid: int, baseline: float, margin: float, peak: float, within_s: float) -> float:
    """The resident size once it is back within ``margin`` times ``baseline`` (polled)."""
    return await until(
        lambda: rss_mb(pid),
        f"resident memory back within {margin}x of the warmed {baseline:.0f} MB",
        within_s=within_s,
        every_s=1,
        accept=lambda mb: mb <= baseline * margin,
        detail=lambda: f"peak {peak:.0f} MB",
    )


async def catch_up(url: str, num: int, block_hash: str, patterns: list[str] | None = None) -> int:
    """Subscribe from (num, hash) in the cardinal dialect; read until ``ready``; leave."""
    params: list[object] = ["streams", hex(num), block_hash]
    if patterns is not None:
        params.append(patterns)
    call = {"jsonrpc": "2.0", "id": 1, "method": "cardinal_subscribe", "params": params}
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


async def _serve(settings: Any, port: int, **env: str) -> asyncio.subprocess.Process:
    """A ``sluice serve`` process on ``port`` with the test's settings and ``env``."""
    base = {
        "SLUICE_REDIS_URL": settings.redis.url,
        "SLUICE_LAKE_URI": settings.lake.uri,
        "SLUICE_SERVE_STREAM": STREAM,
        "SLUICE_CHAIN_STREAMS": STREAM,
        "SLUICE_LOG_LEVEL": "WARNING",
        "SLUICE_SERVE_RELEASE_EVERY_S": str(RELEASE_EVERY_S),
    }
    full = {k: v for k, v in os.environ.items() if k != "SLUICE_SERVE_HISTORY_CACHE_MB"}
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pipeline.cli", "serve", "--port", str(port),
        env={**full, **base, **env},
    )  # fmt: skip


async def test_serve_gives_memory_back_after_subscribers_leave(
    settings, redis_client: redis.Redis
) -> None:
    gen = SyntheticChain(seed=81, prefixes=("s/", "t/"))
    write_lake(settings.lake.uri, gen.take(8_000))
    write_blocks(redis_client, STREAM, gen.take(1_000))
    port = free_port()
    proc = await _serve(settings, port, SLUICE_SERVE_HISTORY_CACHE_MB="0")
    try:
        await _listening(port, 60)
        started = rss_mb(proc.pid)
        url = f"ws://127.0.0.1:{port}/cardinal"
        releases = "sluice_serve_memory_releases_total"

        assert await catch_up(url, 0, "0x" + "00" * 32) > 8_500
        await until(
            lambda: _metric(port, releases),
            "a release after the warm-up",
            within_s=RELEASE_WITHIN_S,
        )
        warmed = await _metric(port, releases)
        baseline = rss_mb(proc.pid)

        rng = random.Random(82)
        heights = [rng.randrange(0, 8_500) for _ in range(50)]
        starts = [(h, "0x" + gen.canonical[h].hash.hex()) for h in heights]
        counts = await asyncio.gather(*(catch_up(url, h, bh) for h, bh in starts))
        assert all(c > 0 for c in counts)
        peak = rss_mb(proc.pid)

        # the releaser looks every RELEASE_EVERY_S (backing off after fruitless releases, made while
        # the 50 still held their memory); a hang, not a speed, is what the deadline bounds
        after = await rss_back(proc.pid, baseline, MARGIN, peak, within_s=RELEASE_WITHIN_S)
        log.warning(
            "serve RSS: started %.0f MB, warmed %.0f MB, with 50 subscribers %.0f MB, "
            "after they left %.0f MB",
            started, baseline, peak, after,
        )  # fmt: skip

        # it was given back by the releaser, not never taken: glibc may hand part of it
        # back on its own before the releaser's next look (538 -> 373 MB with the count
        # still at the warm-up's 1 in one CI run), so wait for the release while the
        # resident size stays past the releaser's growth bar (32 MB over its floor)
        async def released_or_near_floor() -> bool:
            if await _metric(port, releases) > warmed:
                return True
            return rss_mb(proc.pid) < baseline + 16

        await until(
            released_or_near_floor,
            "a release once the 50 left",
            within_s=RELEASE_WITHIN_S,
            every_s=1,
            detail=lambda: f"resident {rss_mb(proc.pid):.0f} MB, warmed {baseline:.0f} MB",
        )
        assert await _metric(port, "sluice_serve_resident_bytes") > 0
    finally:
        proc.terminate()
        await proc.wait()


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


#: Lake files of the cache test, and blocks in each (about 8 KB of payload per block).
FILES, PER_FILE = 8, 1_500
#: How far above the warmed baseline resident memory and descriptors may stay once idle.
IDLE_MARGIN = 1.2


async def test_serve_gives_its_history_cache_back_once_idle(
    settings, redis_client: redis.Redis
) -> None:
    """With the history cache on (its default size), catch-ups fill it with every lake
    file; once nobody used them for ``SLUICE_SERVE_CACHE_IDLE_S`` they are dropped and
    the memory given back: resident memory and descriptors return within 20% of the
    baseline measured after a warm-up. Before, the cache kept them for good (the serve
    attack soak: 180 -> 308 MB)."""
    gen = SyntheticChain(seed=83, prefixes=("s/", "t/"), value_size=2000)
    for _ in range(FILES):  # one file each
        write_lake(settings.lake.uri, gen.take(PER_FILE))
    lake_end = FILES * PER_FILE
    write_blocks(redis_client, STREAM, gen.take(500))
    port = free_port()
    proc = await _serve(settings, port, SLUICE_SERVE_CACHE_IDLE_S="2")
    try:
        await _listening(port, 60)
        url = f"ws://127.0.0.1:{port}/cardinal"
        dropped = "sluice_serve_history_cache_dropped_total"
        none = ["^nothing/"]  # the lake is read and cached whole; little goes on the wire

        def start(h: int) -> tuple[int, str]:
            return h, "0x" + gen.canonical[h].hash.hex()

        # Warm-up: the lake reader, Arrow and one file of the lake (cached).
        assert await catch_up(url, *start(lake_end - 100), none) > 100
        baseline = rss_mb(proc.pid)
        baseline_fds = fds(proc.pid)

        rng = random.Random(84)
        for _ in range(3):  # every file read, several times
            heights = [rng.randrange(0, lake_end) for _ in range(6)]
            counts = await asyncio.gather(*(catch_up(url, *start(h), none) for h in heights))
            assert all(c > 0 for c in counts)
        assert await catch_up(url, *start(0), none) > lake_end
        peak = rss_mb(proc.pid)
        log.warning("serve RSS with the history cache full: %.0f MB", peak)

        after = await rss_back(proc.pid, baseline, IDLE_MARGIN, peak, within_s=RELEASE_WITHIN_S)
        after_fds = await until(
            lambda: fds(proc.pid),
            f"descriptors back within {IDLE_MARGIN}x of {baseline_fds}",
            within_s=60,
            accept=lambda n: n <= baseline_fds * IDLE_MARGIN,
        )
        log.warning(
            "serve RSS with the history cache: warmed %.0f MB (%d fds), full %.0f MB, "
            "idle %.0f MB (%d fds); %d cached files dropped",
            baseline, baseline_fds, peak, after, after_fds, await _metric(port, dropped),
        )  # fmt: skip
        assert await _metric(port, dropped) > 1
    finally:
        proc.terminate()
        await proc.wait()
