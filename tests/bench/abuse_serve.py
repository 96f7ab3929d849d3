"""Abuse mix against a real ``sluice serve`` process, next to a witness subscriber.

For ``duration_s`` seconds, while blocks are produced at ``RATE`` per second:

- overflow: getBlock and subscribe with block numbers 2^63 .. 2^256;
- bombs: nesting 10,000 deep, frames over the size limit, binary frames, junk;
- churn: waves of connections that subscribe near the head and leave;
- floods: one connection sending 2,000 getBlock calls at once, then reading.

The witness subscribes at the head before the abuse starts and must receive
every block produced, in order. Reported: the witness's delay from XADD to
receipt (p50/p99), the server's RSS high-water mark, and its RSS and open file
descriptors at baseline and after the abuse. ``run(duration_s)`` gives the
figures as benchmark rows (tests/bench/common.py format); ``soak(...)`` the
raw :class:`SoakResult` for tests/integration/chain/test_server_abuse.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import aiohttp  # noqa: E402
import redis  # noqa: E402
from common import percentile  # noqa: E402

from pipeline import keys  # noqa: E402
from pipeline.blockcodec import ENTRY_FIELD, encode_block  # noqa: E402
from pipeline.chain.produce.generator import SyntheticChain  # noqa: E402
from pipeline.local.redisserver import LocalRedis  # noqa: E402
from pipeline.redisio.conn import BOUNDS, Role  # noqa: E402
from pipeline.runtime.ports import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
STREAM = "chain:abuse"
RATE = 20.0
SEED_BLOCKS = 5000
#: Open descriptors may stay above baseline by the Redis pools (kept open for
#: reuse, bounded) plus a few in closing.
FD_MARGIN = BOUNDS[Role.SERVE].max_connections + BOUNDS[Role.TAIL].max_connections + 16
#: RSS after the abuse may stay above baseline by this factor plus this many KiB
#: (allocator arenas are not all handed back).
RSS_FACTOR, RSS_SLACK_KB = 1.5, 50_000


@dataclass
class SoakResult:
    duration_s: float
    witness_blocks: int = 0
    witness_missing: int = 0
    witness_p50_ms: float = float("nan")
    witness_p99_ms: float = float("nan")
    rss_base_kb: int = 0
    rss_high_kb: int = 0
    rss_after_kb: int = 0
    fds_base: int = 0
    fds_after: int = 0
    abuse_calls: int = 0
    abuse_errors_answered: int = 0
    abuse_closed: int = 0
    churn_connections: int = 0
    server_alive: bool = False
    notes: list[str] = field(default_factory=list)


def _proc_status(pid: int) -> tuple[int, int]:
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


async def _wait_http(base: str, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(base + "/healthz") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("sluice serve did not start")
            await asyncio.sleep(0.1)


def _frame(method: str, params: Any, req_id: int = 1) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": req_id, "method": method, "params": params})


class _Abuse:
    def __init__(self, base: str, chain: SyntheticChain, result: SoakResult) -> None:
        self.base = base
        self.chain = chain
        self.result = result
        self.stop = asyncio.Event()

    async def _exchange(self, ws: aiohttp.ClientWebSocketResponse, frames: list[str]) -> None:
        """Send frames, then read until each got its reply (or the server closed)."""
        for frame in frames:
            await ws.send_str(frame)
        self.result.abuse_calls += len(frames)
        replies = 0
        while replies < len(frames):
            msg = await ws.receive(timeout=30)
            if msg.type != aiohttp.WSMsgType.TEXT:
                self.result.abuse_closed += 1
                return
            obj = json.loads(msg.data)
            if "id" in obj:
                replies += 1
                if "error" in obj:
                    self.result.abuse_errors_answered += 1

    async def overflow(self, session: aiohttp.ClientSession) -> None:
        h = "0x" + self.chain.canonical[0].hash.hex()
        numbers = ["0x8000000000000000", "0xffffffffffffffff", "0x" + "f" * 64, "0x" + "1" * 17]
        while not self.stop.is_set():
            async with session.ws_connect(self.base + "/ws") as ws:
                frames = [_frame("cardinal_getBlock", [n], i) for i, n in enumerate(numbers)]
                frames += [
                    _frame("cardinal_subscribe", ["streams", n, h, []], 100 + i)
                    for i, n in enumerate(numbers)
                ]
                await self._exchange(ws, frames)
            await asyncio.sleep(0.05)

    async def bombs(self, session: aiohttp.ClientSession) -> None:
        deep = 10_000
        texts = [
            "[" * deep + "]" * deep,
            '{"a":' * deep + "1" + "}" * deep,
            "[" * 60_000,
            '"' + '\\"' * 30_000,
            "\x00\xff junk {",
            '{"jsonrpc":"2.0","id":1e999999,"method":"cardinal_getBlock","params":["0x1"]}',
        ]
        while not self.stop.is_set():
            async with session.ws_connect(self.base + "/ws") as ws:
                await self._exchange(ws, texts)
                await ws.send_bytes(b"\x00" * 100)  # binary: answered with a parse error
                self.result.abuse_calls += 1
                await ws.send_str("[" * 70_000)  # over the 64 KiB frame limit: closed with 1009
                self.result.abuse_calls += 1
                with contextlib.suppress(TimeoutError):
                    while (await ws.receive(timeout=5)).type == aiohttp.WSMsgType.TEXT:
                        pass
                self.result.abuse_closed += 1
            await asyncio.sleep(0.05)

    async def churn(self, session: aiohttp.ClientSession) -> None:
        async def one(i: int) -> None:
            self.result.churn_connections += 1
            async with session.ws_connect(self.base + "/ws") as ws:
                back = self.chain.canonical[-1 - (i % 50)]
                await self._exchange(
                    ws,
                    [
                        _frame(
                            "cardinal_subscribe",
                            ["streams", hex(back.num), "0x" + back.hash.hex(), []],
                        )
                    ],
                )

        while not self.stop.is_set():
            await asyncio.gather(*(one(i) for i in range(100)), return_exceptions=True)

    async def flood(self, session: aiohttp.ClientSession) -> None:
        rng = random.Random(3)
        while not self.stop.is_set():
            async with session.ws_connect(self.base + "/ws", max_msg_size=1 << 22) as ws:
                head = self.chain.canonical[-1].num
                frames = [
                    _frame("cardinal_getBlock", [hex(rng.randrange(head))], i) for i in range(2000)
                ]
                await self._exchange(ws, frames)

    async def run(self, duration_s: float) -> None:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            parts = [self.overflow, self.bombs, self.churn, self.flood]
            tasks = [asyncio.create_task(p(session)) for p in parts]
            await asyncio.sleep(duration_s)
            self.stop.set()
            done = await asyncio.gather(*tasks, return_exceptions=True)
            for part, outcome in zip(parts, done, strict=True):
                if isinstance(outcome, BaseException):
                    self.result.notes.append(f"{part.__name__}: {outcome!r}")


async def soak(
    duration_s: float, *, redis_url: str | None = None, lake_uri: str | None = None
) -> SoakResult:
    """Run the abuse mix for ``duration_s`` against a fresh ``sluice serve`` child process."""
    result = SoakResult(duration_s=duration_s)
    with tempfile.TemporaryDirectory() as tmp:
        local = None
        if redis_url is None:
            local = LocalRedis(Path(tmp) / "redis").start()
            redis_url = local.url
        lake_uri = lake_uri or f"{tmp}/lake"
        client = redis.Redis.from_url(redis_url)
        key = keys.stream(STREAM)
        client.delete(key)
        chain = SyntheticChain(seed=11)
        pipe = client.pipeline(transaction=False)
        for block in chain.take(SEED_BLOCKS):
            pipe.xadd(key, {ENTRY_FIELD: encode_block(block)})
        pipe.execute()
        port = free_port()
        env = {
            **os.environ,
            "SLUICE_REDIS_URL": redis_url,
            "SLUICE_LAKE_URI": lake_uri,
            "SLUICE_SERVE_STREAM": STREAM,
            "SLUICE_CHAIN_STREAMS": STREAM,
            # pings every 6 s, a pong due within 3 s: short enough to run many
            # times, long enough for a starved 2-core test machine
            "SLUICE_SERVE_HEARTBEAT_S": "6",
            "SLUICE_LOG_LEVEL": "WARNING",
        }
        server = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "pipeline.cli",
            "serve",
            "--port",
            str(port),
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            await _wait_http(base)
            await _soak(base, server.pid, client, key, chain, duration_s, result)
            result.server_alive = server.returncode is None
        finally:
            if server.returncode is None:
                server.terminate()
            try:
                async with asyncio.timeout(15):
                    await server.wait()
            except TimeoutError:
                server.kill()
                await server.wait()
            client.delete(key)
            client.close()
            if local is not None:
                local.stop()
    return result


async def _soak(
    base: str,
    pid: int,
    client: redis.Redis,
    key: str,
    chain: SyntheticChain,
    duration_s: float,
    result: SoakResult,
) -> None:
    produced: dict[int, float] = {}
    received: dict[int, float] = {}
    stop = asyncio.Event()

    async def produce() -> None:
        t0 = time.perf_counter()
        i = 0
        while not stop.is_set():
            for block in chain.step():
                produced[block.num] = time.perf_counter()
                client.xadd(key, {ENTRY_FIELD: encode_block(block)})
            i += 1
            await asyncio.sleep(max(0.0, t0 + i / RATE - time.perf_counter()))

    async def sample() -> None:
        while not stop.is_set():
            rss, _fds = _proc_status(pid)
            result.rss_high_kb = max(result.rss_high_kb, rss)
            await asyncio.sleep(0.1)

    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(base + "/ws", max_msg_size=1 << 22) as ws,
    ):
        head = chain.canonical[-1]
        await ws.send_str(
            _frame("cardinal_subscribe", ["streams", hex(head.num), "0x" + head.hash.hex(), []])
        )

        async def witness() -> None:
            async for msg in ws:
                if msg.type != aiohttp.WSMsgType.TEXT:
                    result.notes.append(f"witness: {msg.type.name} {msg.data!r} {msg.extra!r}")
                    break
                obj = json.loads(msg.data)
                res = obj.get("params", {}).get("result")
                if isinstance(res, dict) and res.get("type") == "batch":
                    received.setdefault(int(res["num"], 16), time.perf_counter())

        reader = asyncio.create_task(witness())
        await asyncio.sleep(1.0)  # warm: the first call indexes the tail
        result.rss_base_kb, result.fds_base = _proc_status(pid)
        result.rss_high_kb = result.rss_base_kb
        tasks = [asyncio.create_task(produce()), asyncio.create_task(sample())]
        first = chain.canonical[-1].num + 1
        await _abuse_in_child(base, duration_s, result)
        stop.set()
        await asyncio.gather(*tasks)
        last = chain.canonical[-1].num
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not all(  # noqa: ASYNC110 (polls a dict)
            n in received for n in range(first, last + 1)
        ):
            await asyncio.sleep(0.1)
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
    wanted = range(first, last + 1)
    result.witness_blocks = sum(1 for n in wanted if n in received)
    result.witness_missing = len(wanted) - result.witness_blocks
    delays = [(received[n] - produced[n]) * 1000 for n in wanted if n in received and n in produced]
    result.witness_p50_ms = percentile(delays, 50)
    result.witness_p99_ms = percentile(delays, 99)
    # memory and descriptors settle back: poll for a few seconds
    deadline = time.monotonic() + 10
    while True:
        result.rss_after_kb, result.fds_after = _proc_status(pid)
        settled = (
            result.fds_after <= result.fds_base + FD_MARGIN
            and result.rss_after_kb < result.rss_base_kb * RSS_FACTOR + RSS_SLACK_KB
        )
        if settled or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)


def run(duration_s: float) -> list[dict[str, Any]]:
    """The abuse mix against ``sluice serve`` as benchmark rows (see tests/bench/common.py)."""
    r = asyncio.run(soak(duration_s))
    extra = {"target": "serve", "duration_s": duration_s}
    rows = [
        {"metric": "serve_witness_p50_ms", "value": r.witness_p50_ms},
        {"metric": "serve_witness_p99_ms", "value": r.witness_p99_ms},
        {"metric": "serve_witness_missing", "value": r.witness_missing, "blocks": r.witness_blocks},
        {
            "metric": "serve_rss_high_mb",
            "value": r.rss_high_kb / 1024,
            "baseline": r.rss_base_kb / 1024,
        },
        {
            "metric": "serve_rss_after_mb",
            "value": r.rss_after_kb / 1024,
            "baseline": r.rss_base_kb / 1024,
        },
        {"metric": "serve_fds_after", "value": r.fds_after, "baseline": r.fds_base},
        {
            "metric": "serve_abuse_calls",
            "value": r.abuse_calls,
            "answered_errors": r.abuse_errors_answered,
            "churn_connections": r.churn_connections,
            "closed": r.abuse_closed,
        },
    ]
    out = []
    for row in rows:
        value = float(row.pop("value"))
        full: dict[str, Any] = {
            "bench": "abuse",
            "metric": row.pop("metric"),
            "value": round(value, 3),
        }
        if "baseline" in row:
            base = float(row.pop("baseline"))
            full["baseline"] = round(base, 3)
            full["ratio"] = round(value / base, 3) if base else None
        full.update(row, **extra)
        out.append(full)
    if r.notes:
        out.append(
            {"bench": "abuse", "metric": "serve_notes", "value": len(r.notes), "notes": r.notes}
        )
    return out


_COUNTERS = ("abuse_calls", "abuse_errors_answered", "abuse_closed", "churn_connections", "notes")


async def _abuse_in_child(base: str, duration_s: float, result: SoakResult) -> None:
    """Run the abusers in a child process, so the witness's event loop measures only the server."""
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "abuse",
        base,
        str(duration_s),
        cwd=ROOT,
        stdout=subprocess.PIPE,
    )
    out, _ = await child.communicate()
    try:
        counters = json.loads(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        result.notes.append(f"abuse child failed with exit code {child.returncode}")
        return
    for name in _COUNTERS:
        setattr(result, name, counters[name])


async def _abuse_child(base: str, duration_s: float) -> dict[str, Any]:
    chain = SyntheticChain(seed=11)  # the same blocks as the parent wrote (same seed)
    chain.take(SEED_BLOCKS)
    result = SoakResult(duration_s=duration_s)
    await _Abuse(base, chain, result).run(duration_s)
    return {name: getattr(result, name) for name in _COUNTERS}


if __name__ == "__main__":
    if sys.argv[1:2] == ["abuse"]:
        print(json.dumps(asyncio.run(_abuse_child(sys.argv[2], float(sys.argv[3])))))
    else:
        result = asyncio.run(soak(float(sys.argv[1]) if len(sys.argv) > 1 else 10.0))
        print(json.dumps(asdict(result), indent=2))
