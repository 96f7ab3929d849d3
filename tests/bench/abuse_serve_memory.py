"""Memory of a real ``sluice serve`` process before, during and after each attack (issue 32).

One ``sluice serve`` child process (websocket and Dialogue feed) over a Redis chain
stream of ``BLOCKS`` blocks of ``VALUE`` bytes each. It is warmed first (one
websocket and one Dialogue catch-up from block 0, read to the end), then each
attack runs for ``ATTACK_S`` seconds, its peers leave, and the server's resident
memory is watched for ``BENCH_MEMORY_AFTER_S`` seconds (120 by default, the issue's
two minutes) with nobody connected:

- ``dialogue_flood``: one Dialogue connection opening as many duplexes from block 0
  and sending as many requests as the protocol lets a connection hold (1,024 and
  4,096), reading nothing;
- ``slow_readers``: ``SLOW`` websocket subscribers from block 0, each reading one
  frame a second;
- ``storm``: ``STORM`` websocket upgrades at once (the cap refuses some with 503),
  each subscribing at the head, held a few seconds.

Rows (``make bench B=abuse``): ``serve_memory_<attack>_after_mb`` against the warmed
RSS (the issue's goal: within 1.3x), with the RSS before the attack, its peak, and
how long it took to come back within 1.3x (``back_within_s``, None: not within the
watch); plus what each attacker saw (opened, refused, failed).
``BENCH_MEMORY_ATTACKS`` picks attacks (comma-separated); ``BENCH_SERVE_LOG`` (a
file) and ``BENCH_SERVE_LOG_LEVEL`` keep the server's log.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import aiohttp  # noqa: E402
import redis  # noqa: E402
from abuse_serve import _proc_status, _wait_http  # noqa: E402

from pipeline import keys  # noqa: E402
from pipeline.blockcodec import ENTRY_FIELD, encode_block  # noqa: E402
from pipeline.chain.produce.generator import SyntheticChain  # noqa: E402
from pipeline.chain.serve.dialogue_feed import subscribe_dialogue  # noqa: E402
from pipeline.dialogue.connection import Connection  # noqa: E402
from pipeline.dialogue.protocol import (  # noqa: E402
    DEFAULT_MAX_DUPLEXES,
    DEFAULT_MAX_INCOMING_REQUESTS,
)
from pipeline.local.redisserver import LocalRedis  # noqa: E402
from pipeline.runtime.ports import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
STREAM = "chain:memory"
BLOCKS = 3000
VALUE = 2048
ATTACK_S = 20.0
#: A Dialogue connection's most: duplexes and requests in flight (the protocol's caps; one
#: more is a protocol error that closes the connection at once, which frees everything).
FLOOD_DUPLEXES = DEFAULT_MAX_DUPLEXES
FLOOD_REQUESTS = DEFAULT_MAX_INCOMING_REQUESTS
SLOW = 200
STORM = 2000
#: The issue's goal: an idle server back within this factor of its warmed RSS.
GOAL = 1.3


def _subscribe(num: int, block_hash: bytes) -> str:
    params = ["streams", hex(num), "0x" + block_hash.hex(), []]
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": "cardinal_subscribe", "params": params})


async def _ws_catch_up(http: aiohttp.ClientSession, base: str, first: bytes, head: int) -> None:
    async with http.ws_connect(base + "/ws", max_msg_size=1 << 22) as ws:
        await ws.send_str(_subscribe(0, first))
        async for msg in ws:
            res = json.loads(msg.data).get("params", {}).get("result")
            if isinstance(res, dict) and res.get("type") == "batch" and int(res["num"], 16) >= head:
                return


async def _dialogue_catch_up(port: int, first: bytes, head: int) -> None:
    updates = subscribe_dialogue("127.0.0.1", port, 0, first)
    try:
        async for res in updates:
            if res.get("type") == "batch" and int(res["num"], 16) >= head:
                return
    finally:
        await updates.aclose()  # type: ignore[attr-defined]


async def dialogue_flood(base: str, dport: int, first: bytes, head: Any) -> dict[str, int]:
    conn = await Connection.connect("127.0.0.1", dport)
    conn.pause_reading("bench")  # reads nothing: everything the server sends backs up
    params = json.dumps(["streams", "0x0", "0x" + first.hex(), []]).encode()
    duplexes = [conn.duplex(params) for _ in range(FLOOD_DUPLEXES)]
    requests = [asyncio.create_task(conn.request(b"x" * 256)) for _ in range(FLOOD_REQUESTS)]
    await asyncio.sleep(ATTACK_S)
    await conn.close(timeout=1.0)
    for task in requests:
        task.cancel()
    await asyncio.gather(*requests, return_exceptions=True)
    return {"duplexes": len(duplexes), "requests": len(requests)}


async def slow_readers(base: str, dport: int, first: bytes, head: Any) -> dict[str, int]:
    counts = {"opened": 0, "closed_by_server": 0, "failed": 0}

    async def one(http: aiohttp.ClientSession) -> None:
        try:
            async with http.ws_connect(base + "/ws", max_msg_size=1 << 22) as ws:
                counts["opened"] += 1
                await ws.send_str(_subscribe(0, first))
                deadline = time.monotonic() + ATTACK_S
                while time.monotonic() < deadline:
                    msg = await ws.receive()
                    if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED):
                        counts["closed_by_server"] += 1
                        return
                    await asyncio.sleep(1.0)
        except (aiohttp.ClientError, OSError):
            counts["failed"] += 1

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        await asyncio.gather(*(one(http) for _ in range(SLOW)))
    return counts


async def storm(base: str, dport: int, first: bytes, head: Any) -> dict[str, int]:
    counts = {"opened": 0, "refused_503": 0, "failed": 0}
    go = asyncio.Event()

    async def one(http: aiohttp.ClientSession) -> None:
        await go.wait()
        try:
            async with http.ws_connect(base + "/ws", max_msg_size=1 << 22) as ws:
                counts["opened"] += 1
                await ws.send_str(_subscribe(head.num, head.hash))
                await asyncio.sleep(5.0)
        except aiohttp.WSServerHandshakeError as exc:
            counts["refused_503" if exc.status == 503 else "failed"] += 1
        except (aiohttp.ClientError, OSError):
            counts["failed"] += 1

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        tasks = [asyncio.create_task(one(http)) for _ in range(STORM)]
        await asyncio.sleep(0.5)
        go.set()
        await asyncio.gather(*tasks)
    return counts


ATTACKS = {"dialogue_flood": dialogue_flood, "slow_readers": slow_readers, "storm": storm}


async def _watch(pid: int, stop: asyncio.Event, peak: list[int]) -> None:
    while not stop.is_set():
        peak[0] = max(peak[0], _proc_status(pid)[0])
        await asyncio.sleep(0.2)


async def _after(pid: int, warm_kb: int, watch_s: float) -> tuple[int, float | None]:
    """RSS (KiB) at the end of the watch, and when it first came within GOAL of warm."""
    t0 = time.monotonic()
    back: float | None = None
    while True:
        rss = _proc_status(pid)[0]
        if back is None and rss <= warm_kb * GOAL:
            back = time.monotonic() - t0
        if time.monotonic() - t0 >= watch_s:
            return rss, back
        await asyncio.sleep(1.0)


async def measure(watch_s: float) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        local = LocalRedis(Path(tmp) / "redis").start()
        client = redis.Redis.from_url(local.url)
        chain = SyntheticChain(seed=5)
        blocks = chain.take(BLOCKS)
        pipe = client.pipeline(transaction=False)
        for block in blocks:
            block = dataclasses.replace(block, updates={"v": os.urandom(VALUE)})
            pipe.xadd(keys.stream(STREAM), {ENTRY_FIELD: encode_block(block)})
        pipe.execute()
        first, head = blocks[0], blocks[-1]
        port, dport = free_port(), free_port()
        env = {
            **os.environ,
            "SLUICE_REDIS_URL": local.url,
            "SLUICE_LAKE_URI": f"{tmp}/lake",
            "SLUICE_SERVE_STREAM": STREAM,
            "SLUICE_CHAIN_STREAMS": STREAM,
            "SLUICE_SERVE_DIALOGUE_PORT": str(dport),
            "SLUICE_LOG_LEVEL": os.environ.get("BENCH_SERVE_LOG_LEVEL", "WARNING"),
        }
        log_to = os.environ.get("BENCH_SERVE_LOG")  # a file for the server's log
        server = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "pipeline.cli", "serve", "--port", str(port),
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
            stderr=open(log_to, "w") if log_to else subprocess.DEVNULL,  # noqa: SIM115, ASYNC230
        )  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        try:
            await _wait_http(base)
            async with aiohttp.ClientSession() as http:
                await _ws_catch_up(http, base, first.hash, head.num)
            await _dialogue_catch_up(dport, first.hash, head.num)
            await asyncio.sleep(15.0)  # the releaser's first looks
            warm = _proc_status(server.pid)[0]
            chosen = os.environ.get("BENCH_MEMORY_ATTACKS", ",".join(ATTACKS)).split(",")
            for name in chosen:
                attack = ATTACKS[name]
                before = _proc_status(server.pid)[0]
                stop, peak = asyncio.Event(), [before]
                watcher = asyncio.create_task(_watch(server.pid, stop, peak))
                counts = await attack(base, dport, first.hash, head)
                stop.set()
                await watcher
                after, back = await _after(server.pid, warm, watch_s)
                rows.append({
                    "metric": f"serve_memory_{name}_after_mb",
                    "value": round(after / 1024, 1),
                    "baseline": round(warm / 1024, 1),
                    "ratio": round(after / warm, 3),
                    "before_mb": round(before / 1024, 1),
                    "peak_mb": round(peak[0] / 1024, 1),
                    "back_within_s": None if back is None else round(back, 1),
                    "watch_s": watch_s,
                    **counts,
                })  # fmt: skip
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        finally:
            if server.returncode is None:
                server.terminate()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait(), 15)
            if server.returncode is None:
                server.kill()
                await server.wait()
            client.close()
            local.stop()
    return rows


def run(duration_s: float) -> list[dict[str, Any]]:
    """The rows; ``duration_s`` (BENCH_ABUSE_S) does not apply: each attack is ATTACK_S."""
    return asyncio.run(measure(float(os.environ.get("BENCH_MEMORY_AFTER_S", "120"))))


if __name__ == "__main__":
    for row in run(0.0):
        print(json.dumps(row))
