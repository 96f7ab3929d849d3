"""The status page of ``sluice serve`` against a running system, in headless Chromium.

A real redis-server, a real ``sluice produce`` writing blocks with reorgs, a
real ``sluice serve`` child process, ``archive_log`` written with delta-rs
(two archived intervals with a gap), one websocket subscriber; the page is
loaded in Debian's Chromium, must update live (the head changes in the DOM)
and show the stream, its subscriber, its reorgs and its coverage. The
screenshot goes to ``bench-results/status-page.png``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import pyarrow as pa
import pytest

from pipeline.lake.storage.tables import ARCHIVE_LOG, ARCHIVE_LOG_ARROW
from pipeline.runtime.ports import free_port

from .cdp import chromium, chromium_path

ROOT = Path(__file__).resolve().parents[3]
STREAM = "chain:status"
SHOT = ROOT / "bench-results" / "status-page.png"


def write_archive_log(lake_uri: str, stream: str, spans: list[tuple[int, int, int]]) -> None:
    """Append ``(start_ms, end_ms, blocks)`` rows to ``archive_log`` with delta-rs."""
    from deltalake import write_deltalake

    now = datetime.now(UTC)
    table = pa.table(
        {
            "stream": [stream] * len(spans),
            "start_ms": [s for s, _, _ in spans],
            "end_ms": [e for _, e, _ in spans],
            "entries": [b for _, _, b in spans],
            "blocks": [b for _, _, b in spans],
            "invalid": [0] * len(spans),
            "first_id": [f"{s}-0" for s, _, _ in spans],
            "last_id": [f"{e - 1}-0" for _, e, _ in spans],
            "run_id": [f"test-{i}" for i in range(len(spans))],
            "archived_at": [now] * len(spans),
        },
        schema=ARCHIVE_LOG_ARROW,
    )
    write_deltalake(f"{lake_uri}/{ARCHIVE_LOG}", table, mode="append")


@pytest.fixture
def system(
    redis_url: str, lake_uri: str, tmp_path: Path
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A producer with reorgs and ``sluice serve`` as child processes; yields the server's URL
    and process."""
    now_ms = int(time.time() * 1000)
    write_archive_log(
        lake_uri,
        STREAM,
        [(now_ms - 600_000, now_ms - 420_000, 900), (now_ms - 300_000, now_ms - 120_000, 900)],
    )
    env = {
        **os.environ,
        "SLUICE_REDIS_URL": redis_url,
        "SLUICE_LAKE_URI": lake_uri,
        "SLUICE_SERVE_STREAM": STREAM,
        "SLUICE_CHAIN_STREAMS": STREAM,
        "SLUICE_LOG_LEVEL": "WARNING",
        "SLUICE_CONFIG": os.devnull,  # no config file
    }
    sluice = [sys.executable, "-m", "pipeline.cli"]
    port = free_port()
    procs = [
        subprocess.Popen(
            [*sluice, "produce", "--rate", "8", "--count", "0", "--reorg-every", "6", "--reorg-depth", "2"],
            env=env, stdout=subprocess.DEVNULL,
        ),
        subprocess.Popen([*sluice, "serve", "--port", str(port)], env=env),
    ]  # fmt: skip
    try:
        yield f"http://127.0.0.1:{port}", procs[1]
    finally:
        for proc in procs:
            if proc.poll() is None:  # a second SIGTERM during exit would kill it uncleanly
                proc.terminate()
        codes = [proc.wait(20) for proc in procs]
        assert codes[1] == 0, "sluice serve did not stop cleanly"


def _children(pid: int) -> list[str]:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [Path(f"/proc/{c}/comm").read_text().strip() for c in children]


async def _until_up(url: str, session: aiohttp.ClientSession) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            async with session.get(f"{url}/healthz") as reply:
                if reply.status == 200:
                    return
        except aiohttp.ClientConnectionError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("sluice serve did not come up")
        await asyncio.sleep(0.1)


def _q(field: str) -> str:
    return f'document.querySelector(\'[data-stream="{STREAM}"] [data-field="{field}"]\')'


def _text(field: str) -> str:
    return f"({_q(field)} || {{}}).textContent"


@pytest.mark.skipif(chromium_path() is None, reason="chromium not installed (make install)")
async def test_status_page_live_in_chromium(
    system: tuple[str, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    url, server = system
    async with aiohttp.ClientSession() as session:
        await _until_up(url, session)
        async with session.ws_connect(f"{url}/ws") as ws:
            await ws.send_str(json.dumps({
                "jsonrpc": "2.0", "id": 1, "method": "cardinal_subscribe",
                "params": ["streams", "0x0", "0x" + "00" * 32, []],
            }))  # fmt: skip
            async with chromium(tmp_path / "profile", log=tmp_path / "chromium.log") as page:
                await page.goto(f"{url}/")
                await page.wait_for(f"{_q('head')} && /^[0-9,]+$/.test({_text('head')})")
                first = await page.evaluate(_text("head"))
                # live: the head in the DOM moves on without a reload
                await page.wait_for(f"{_text('head')} !== {json.dumps(first)}")
                assert (
                    await page.evaluate("document.getElementById('live').dataset.state") == "live"
                )
                assert await page.evaluate(_text("name")) == STREAM
                await page.wait_for(f"{_text('subscribers')} === '1'")
                await page.wait_for(f"Number({_text('reorgs')}) >= 1")
                assert await page.evaluate(_text("archived")) == "2 contiguous stretches, 1 gap"
                assert "1,800 blocks" in await page.evaluate(_text("archived-span"))
                assert (
                    await page.evaluate(f"{_q('lake-bar')}.querySelectorAll('.seg.run').length")
                    == 2
                )
                assert (
                    await page.evaluate(f"{_q('lake-bar')}.querySelectorAll('.seg.gap').length")
                    == 1
                )
                assert (
                    await page.evaluate(f"{_q('redis-bar')}.querySelectorAll('.seg.hot').length")
                    == 1
                )
                assert "entries" in await page.evaluate(_text("hot-length"))
                rows = await page.evaluate(f"{_q('recent')}.querySelectorAll('tr').length")
                assert rows >= 5
                await page.wait_for(f"{_q('recent')}.querySelectorAll('tr.reorged').length >= 1")
                # the head on the page is the server's: compare with status.json
                async with session.get(f"{url}/status.json") as reply:
                    data = await reply.json()
                served = data["streams"][0]
                assert served["name"] == STREAM and served["subscribers"] == 1
                assert served["coverage"]["gap_count"] == 1
                await page.screenshot(SHOT)
                # the page read the lake (archive_log) with delta-rs: no JVM was started for it
                assert "java" not in _children(server.pid)
                # the server goes away: the page says so instead of showing stale data as live
                server.terminate()
                await page.wait_for("document.getElementById('live').dataset.state === 'down'")
                assert await asyncio.to_thread(server.wait, 20) == 0, (
                    "sluice serve did not stop cleanly"
                )
    assert SHOT.stat().st_size > 10_000
