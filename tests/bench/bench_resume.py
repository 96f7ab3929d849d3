"""Benchmark of the resumption server (``make bench B=resume``).

- ``catchup_blocks_per_s``: 1,000,000 canonical blocks in Delta, one subscriber
  from block 0 to the head over the websocket of a ``sluice serve`` process;
  baseline: a raw aiohttp websocket server process sending the same
  pre-encoded notifications.
- ``first_block_p50_ms`` / ``first_block_p99_ms``: subscribe at random depths,
  time to the first block; baseline: the raw delta-rs read of that first page.
- ``fanout_p50_ms`` / ``fanout_p99_ms``: 500 subscribers, 100 blocks/s
  produced, latency from XADD to each client; baseline: a raw aiohttp server
  that XREADs the stream and sends each entry to every socket.
- ``catchup_blocks_per_s_s3``: the same catch-up with the lake on a local S3
  server (versitygw, :mod:`pipeline.localstore`); baseline: the local-disk
  lake's ``catchup_blocks_per_s`` of the same run.
- ``catchup_cpu_us_per_block`` / ``fanout_cpu_us_per_message``: CPU time
  (user + system) of the server process per block sent in catch-up and per
  notification received in fan-out, against the raw servers' own: on a
  loaded machine these move much less than the wall-clock figures (Linux:
  read from ``/proc``; left out elsewhere).
- ``fanout_publish_cpu_us_per_message``: the same CPU, counted only from the
  first block produced until every subscriber received every block (the
  per-message cost of fan-out itself); ``fanout_cpu_us_per_message`` also
  counts the 500 subscribes before it, which ``subscribe_cpu_ms`` gives per
  subscriber (the raw server's subscribe is a handshake and one reply, sent
  from nowhere: lake and Redis lookups are not in its figure).

The servers run in child processes so server and clients use both cores.
The lake is written as the jobs create it (partitioned by stream), in files of
``BENCH_RESUME_FILE_BLOCKS`` blocks (250,000); ``BENCH_RESUME_PARTS`` picks the
parts to run (``catchup,first,fanout,s3``, all by default; ``s3`` needs ``catchup``:
``BENCH_RESUME_PARTS=fanout`` measures the fan-out alone).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import aiohttp  # noqa: E402
import pyarrow as pa  # noqa: E402
import redis  # noqa: E402
from common import Report, percentile  # noqa: E402
from ordered_drain import run as ordered_drain  # noqa: E402

from pipeline import keys  # noqa: E402
from pipeline.blockcodec import ENTRY_FIELD, Block, encode_block  # noqa: E402
from pipeline.lake.tables import BLOCKS  # noqa: E402
from pipeline.localredis import LocalRedis  # noqa: E402
from pipeline.ports import free_port  # noqa: E402

STREAM = "chain:bench"
N = int(os.environ.get("BENCH_RESUME_BLOCKS", "1000000"))
FANOUT_SUBS = int(os.environ.get("BENCH_RESUME_SUBS", "500"))
FANOUT_RATE = 100
FANOUT_SECONDS = 5
#: Blocks per data file of the lake (the archive writes one or more files per interval).
FILE_BLOCKS = int(os.environ.get("BENCH_RESUME_FILE_BLOCKS", "250000"))
#: Parts to run (comma-separated): catchup, first, fanout, s3 (which needs catchup).
PARTS = set(os.environ.get("BENCH_RESUME_PARTS", "catchup,first,fanout,s3").split(","))
ROOT = Path(__file__).resolve().parents[2]


def block_hash(num: int) -> bytes:
    return hashlib.blake2b(num.to_bytes(8, "big"), digest_size=32).digest()


def make_block(num: int) -> Block:
    parent = block_hash(num - 1) if num else bytes(32)
    return Block(
        num=num,
        hash=block_hash(num),
        parent=parent,
        updates={f"acct/{num % 977}": num.to_bytes(8, "big"), f"slot/{num % 131}": b"\x01" * 8},
        deletes=(f"tmp/{num % 7}",),
    )


def write_lake(lake_uri: str, options: dict[str, str] | None = None) -> None:
    """N blocks in files of FILE_BLOCKS, in the ``blocks`` table as the jobs create it
    (partitioned by stream: the chain stream's ``:`` is escaped in its directory)."""
    from deltalake import DeltaTable, write_deltalake

    from pipeline.lake.tables import LAYOUT, TABLE_PROPERTIES

    schema, partitions = LAYOUT[BLOCKS]
    DeltaTable.create(
        f"{lake_uri}/{BLOCKS}",
        schema,
        partition_by=list(partitions),
        configuration=dict(TABLE_PROPERTIES),
        storage_options=options,
    )
    chunk = FILE_BLOCKS
    for lo in range(0, N, chunk):
        blocks = [make_block(n) for n in range(lo, min(N, lo + chunk))]
        table = pa.table(
            {
                "stream": [STREAM] * len(blocks),
                "num": [b.num for b in blocks],
                "hash": [b.hash.hex() for b in blocks],
                "parent": [b.parent.hex() for b in blocks],
                "canonical": [True] * len(blocks),
                "entry_id": [f"{b.num + 1}-0" for b in blocks],
                "entry_ms": [b.num + 1 for b in blocks],
                "payload": [encode_block(b) for b in blocks],
                "archived_at": [None] * len(blocks),
                "weight": [None] * len(blocks),
            },
            schema=schema,
        )
        write_deltalake(f"{lake_uri}/{BLOCKS}", table, mode="append", storage_options=options)


BASELINE_SERVER = r"""
import asyncio, sys
from aiohttp import web
from pipeline.chain import jsonrpc
from pipeline.blockcodec import decode_raw, raw_results
from pipeline.lake.reader import LakeReader

lake, stream, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
prefix = jsonrpc.notification_prefix("cardinal_subscribe", "0x1")
messages = []
for table in LakeReader(lake).iter_canonical_arrow(stream, 0):
    for n, h, p, b in zip(*(table.column(c).to_pylist() for c in ("num", "hash", "parent", "payload"))):
        messages.extend(prefix + r + "}}" for r in raw_results(decode_raw(b), n, h, p))

async def ws(request):
    sock = web.WebSocketResponse(compress=False)
    await sock.prepare(request)
    await sock.receive()
    await sock.send_str(jsonrpc.result(1, "0x1"))
    for m in messages:
        await sock.send_str(m)
    await sock.receive()
    return sock

app = web.Application()
app.router.add_get("/ws", ws)
print("READY", len(messages), flush=True)
web.run_app(app, host="127.0.0.1", port=port, print=None)
"""

FANOUT_BASELINE_SERVER = r"""
import asyncio, sys
import redis.asyncio as aioredis
from aiohttp import web
from pipeline.chain import jsonrpc
from pipeline.blockcodec import block_results, decode_block, ENTRY_FIELD

redis_url, key, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
socks = set()
prefix = jsonrpc.notification_prefix("cardinal_subscribe", "0x1")

async def ws(request):
    sock = web.WebSocketResponse(compress=False)
    await sock.prepare(request)
    await sock.receive()
    await sock.send_str(jsonrpc.result(1, "0x1"))
    socks.add(sock)
    try:
        await sock.receive()
    finally:
        socks.discard(sock)
    return sock

async def tail(app):
    client = aioredis.Redis.from_url(redis_url)
    async def run():
        last = b"$"
        while True:
            reply = await client.xread({key: last}, block=1000)
            for _k, entries in reply or ():
                for eid, fields in entries:
                    last = eid
                    texts = [prefix + r + "}}" for r in block_results(decode_block(fields[ENTRY_FIELD]))]
                    for s in list(socks):
                        for t in texts:
                            await s.send_str(t)
    task = asyncio.create_task(run())
    yield
    task.cancel()

app = web.Application()
app.cleanup_ctx.append(tail)
app.router.add_get("/ws", ws)
print("READY", flush=True)
web.run_app(app, host="127.0.0.1", port=port, print=None)
"""


def cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) used so far by process ``pid``; None without ``/proc``."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_per(pid: int, before: float | None, count: int) -> float | None:
    """Microseconds of CPU of ``pid`` since ``before`` per unit of ``count``."""
    after = cpu_s(pid)
    if before is None or after is None or not count:
        return None
    return (after - before) / count * 1e6


def spawn(
    args: list[str], env: dict[str, str] | None = None, ready: str = ""
) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        text=True,
    )
    if ready:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if ready not in line:
            proc.kill()
            raise RuntimeError(f"child did not start: {line!r}")
    return proc


async def wait_port(port: int, limit_s: float = 60) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            _r, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            return
        except OSError:
            await asyncio.sleep(0.1)
    raise RuntimeError(f"nothing listening on {port}")


async def wait_healthy(port: int, limit_s: float = 120) -> None:
    """Until the server's ``/healthz`` answers 200: it has opened the lake (its start-up
    imports and Delta log load are not catch-up)."""
    deadline = time.monotonic() + limit_s
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(f"http://127.0.0.1:{port}/healthz") as reply:
                    if reply.status == 200:
                        return
            await asyncio.sleep(0.1)
    raise RuntimeError(f"server on {port} not healthy in {limit_s}s")


def subscribe_frame(num: int, h: bytes) -> str:
    return json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "cardinal_subscribe",
            "params": ["streams", hex(num), "0x" + h.hex(), []],
        }  # fmt: skip
    )


async def catchup(port: int, expected: int) -> float:
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(f"http://127.0.0.1:{port}/ws", max_msg_size=1 << 22) as ws,
    ):
        start = time.perf_counter()
        await ws.send_str(subscribe_frame(0, block_hash(0)))
        await ws.receive()  # the subscription id
        count = 0
        while count < expected:
            msg = await ws.receive(timeout=60)
            if msg.type != aiohttp.WSMsgType.TEXT:
                raise RuntimeError(f"stream ended after {count}: {msg}")
            count += 1
        elapsed = time.perf_counter() - start
        await ws.send_str("bye")
        return expected / elapsed


async def first_blocks(port: int, samples: int) -> list[float]:
    rng = random.Random(7)
    out = []
    async with aiohttp.ClientSession() as session:
        for _ in range(samples):
            num = rng.randrange(N)
            async with session.ws_connect(f"http://127.0.0.1:{port}/ws") as ws:
                start = time.perf_counter()
                await ws.send_str(subscribe_frame(num, block_hash(num)))
                await ws.receive(timeout=30)
                msg = await ws.receive(timeout=30)
                out.append((time.perf_counter() - start) * 1000)
                assert f'"num":"{hex(num)}"' in msg.data, msg.data[:200]
    return out


async def warm_head(port: int) -> None:
    """One subscribe at the head, closed after its first block: the lake's last file is read,
    as the catch-up would have read it (the fan-out's subscribes then find it cached)."""
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(f"http://127.0.0.1:{port}/ws") as ws,
    ):
        await ws.send_str(subscribe_frame(N - 1, block_hash(N - 1)))
        await ws.receive(timeout=60)
        await ws.receive(timeout=60)


def raw_first_page(lake_uri: str, samples: int) -> list[float]:
    from pipeline.lake.reader import LakeReader

    rng = random.Random(7)
    out = []
    for _ in range(samples):
        num = rng.randrange(N)
        start = time.perf_counter()
        reader = LakeReader(lake_uri)
        next(reader.iter_canonical_arrow(STREAM, num, batch_rows=8192))
        out.append((time.perf_counter() - start) * 1000)
    return out


async def fanout(
    port: int, redis_url: str, subs: int, pid: int | None = None
) -> tuple[list[float], dict[str, float | None]]:
    """Latencies (ms) of every live message, and the server's CPU by phase when ``pid`` is
    given: ``subscribe`` (the subscribes) and ``publish`` (from the first block until each
    subscriber got every block, bounded by a minute, or the messages that came in it)."""
    latencies: list[float] = []
    cpu: dict[str, float | None] = {}
    received = 0
    client = redis.Redis.from_url(redis_url)
    key = keys.stream(STREAM)
    head = client.xrevrange(key, count=1)
    start_num = N if not head else None
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        sockets = []
        cpu0 = cpu_s(pid) if pid else None
        for _ in range(subs):
            ws = await session.ws_connect(f"http://127.0.0.1:{port}/ws", max_msg_size=1 << 22)
            await ws.send_str(subscribe_frame(N - 1, block_hash(N - 1)))
            await ws.receive(timeout=30)
            sockets.append(ws)
        if pid:
            after = cpu_s(pid)
            cpu["subscribe"] = None if cpu0 is None or after is None else after - cpu0
        done, all_in = asyncio.Event(), asyncio.Event()
        expected = len(sockets) * FANOUT_RATE * FANOUT_SECONDS

        async def reader(ws: aiohttp.ClientWebSocketResponse) -> None:
            nonlocal received
            while not done.is_set():
                try:
                    msg = await ws.receive(timeout=0.5)
                except TimeoutError:
                    continue
                except (aiohttp.ClientError, ConnectionError):
                    return
                if msg.type != aiohttp.WSMsgType.TEXT:
                    return
                at = msg.data.find('"t":"0x')
                if at >= 0:
                    sent = int(msg.data[at + 7 : at + 23], 16)
                    latencies.append((time.time_ns() - sent) / 1e6)
                    received += 1
                    if received >= expected:
                        all_in.set()

        readers = [asyncio.create_task(reader(ws)) for ws in sockets]
        await asyncio.sleep(1.0)  # subscribers reach the live head
        latencies.clear()
        received = 0
        num = start_num or N
        cpu1 = cpu_s(pid) if pid else None
        t0 = time.perf_counter()
        for i in range(FANOUT_RATE * FANOUT_SECONDS):
            block = Block(
                num=num + i,
                hash=block_hash(num + i),
                parent=block_hash(num + i - 1),
                updates={"t": time.time_ns().to_bytes(8, "big"), "acct/1": b"\x02" * 8},
            )
            client.xadd(key, {ENTRY_FIELD: encode_block(block)})
            await asyncio.sleep(max(0.0, t0 + (i + 1) / FANOUT_RATE - time.perf_counter()))
        await asyncio.sleep(1.0)
        if pid:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(all_in.wait(), 60)
            after = cpu_s(pid)
            cpu["publish"] = None if cpu1 is None or after is None else after - cpu1
            cpu["published"] = received
        done.set()
        await asyncio.gather(*readers)
        for ws in sockets:
            await ws.close()
    client.delete(key)
    client.close()
    return latencies, cpu


async def s3_catchup(report: Report, tmp: str, env: dict[str, str], local: float) -> None:
    """The catch-up figure again with the lake on a local S3 server, against ``local``."""
    from pipeline.localstore import LocalStore
    from pipeline.settings import Settings

    with LocalStore(Path(tmp) / "s3") as store:
        store.create_bucket("bench")
        flat = {"lake_uri": "s3://bench/lake", **store.lake_settings()}
        t = time.perf_counter()
        write_lake("s3://bench/lake", Settings.load(env={}, **flat).lake.storage_options())
        print(f"# wrote {N} blocks to S3 in {time.perf_counter() - t:.1f}s", file=sys.stderr)
        s3_env = {
            **env,
            **{
                "SLUICE_" + k.upper(): str(v).lower() if isinstance(v, bool) else str(v)
                for k, v in flat.items()
            },
        }
        port = free_port()
        server = spawn(["-m", "pipeline.cli", "serve", "--port", str(port)], env=s3_env)
        try:
            await wait_port(port)
            await wait_healthy(port)
            value = await catchup(port, N)
        finally:
            server.terminate()
            server.wait(30)
    report.emit("catchup_blocks_per_s_s3", value, local, blocks=N)


async def main() -> None:
    report = Report("resume")
    ordered_drain(report)  # pure code, first: nothing else runs yet
    with tempfile.TemporaryDirectory() as tmp:
        lake_uri = f"{tmp}/lake"
        t = time.perf_counter()
        write_lake(lake_uri)
        print(f"# wrote {N} blocks to Delta in {time.perf_counter() - t:.1f}s", file=sys.stderr)
        redis_server = LocalRedis(Path(tmp) / "redis").start()
        procs: list[subprocess.Popen[str]] = []
        try:
            env = {
                "SLUICE_REDIS_URL": redis_server.url,
                "SLUICE_LAKE_URI": lake_uri,
                "SLUICE_SERVE_STREAM": STREAM,
                "SLUICE_SERVE_SEND_BUFFER": "8192",
                "SLUICE_LOG_LEVEL": "WARNING",
            }
            if "catchup" in PARTS:
                # raw baseline first, alone on the machine
                base_port = free_port()
                proc = spawn(
                    ["-c", BASELINE_SERVER, lake_uri, STREAM, str(base_port)], ready="READY"
                )
                procs.append(proc)
                await wait_port(base_port)
                cpu0 = cpu_s(proc.pid)
                baseline = await catchup(base_port, N)
                base_cpu = cpu_per(proc.pid, cpu0, N)
                proc.terminate()
                proc.wait(30)

            port = free_port()
            server = spawn(["-m", "pipeline.cli", "serve", "--port", str(port)], env=env)
            procs.append(server)
            await wait_port(port)
            await wait_healthy(port)
            if "catchup" in PARTS:
                cpu0 = cpu_s(server.pid)
                value = await catchup(port, N)
                serve_cpu = cpu_per(server.pid, cpu0, N)
                report.emit("catchup_blocks_per_s", value, baseline, blocks=N)
                if serve_cpu is not None and base_cpu is not None:
                    report.emit("catchup_cpu_us_per_block", serve_cpu, base_cpu, blocks=N)

            if "first" in PARTS:
                samples = 100
                firsts = await first_blocks(port, samples)
                raw = raw_first_page(lake_uri, samples)
                report.emit("first_block_p50_ms", percentile(firsts, 50), percentile(raw, 50),
                            samples=samples)  # fmt: skip
                report.emit("first_block_p99_ms", percentile(firsts, 99), percentile(raw, 99),
                            samples=samples)  # fmt: skip
            if "fanout" in PARTS:
                if "catchup" not in PARTS:
                    await warm_head(port)
                await fanouts(report, server, port, redis_server.url, procs)
            server.terminate()
            server.wait(30)
            if "s3" in PARTS and "catchup" in PARTS:
                await s3_catchup(report, tmp, env, value)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(10)
                    except subprocess.TimeoutExpired:
                        proc.kill()
            redis_server.stop()
    report.save()


async def fanouts(
    report: Report,
    server: subprocess.Popen[str],
    port: int,
    redis_url: str,
    procs: list[subprocess.Popen[str]],
) -> None:
    """The fan-out figures: the server's (it is stopped after), then the raw fan-out server's."""
    cpu0 = cpu_s(server.pid)
    lat, phases = await fanout(port, redis_url, FANOUT_SUBS, server.pid)
    fan_cpu = cpu_per(server.pid, cpu0, len(lat))
    server.terminate()
    server.wait(30)

    fport = free_port()
    proc = spawn(
        ["-c", FANOUT_BASELINE_SERVER, redis_url, keys.stream(STREAM), str(fport)],
        ready="READY",
    )
    procs.append(proc)
    await wait_port(fport)
    cpu0 = cpu_s(proc.pid)
    raw_lat, raw_phases = await fanout(fport, redis_url, FANOUT_SUBS, proc.pid)
    raw_fan_cpu = cpu_per(proc.pid, cpu0, len(raw_lat))
    report.emit("fanout_p50_ms", percentile(lat, 50), percentile(raw_lat, 50),
                subscribers=FANOUT_SUBS, rate=FANOUT_RATE, samples=len(lat))  # fmt: skip
    report.emit("fanout_p99_ms", percentile(lat, 99), percentile(raw_lat, 99),
                subscribers=FANOUT_SUBS, rate=FANOUT_RATE, samples=len(lat))  # fmt: skip
    if fan_cpu is not None and raw_fan_cpu is not None:
        report.emit("fanout_cpu_us_per_message", fan_cpu, raw_fan_cpu,
                    subscribers=FANOUT_SUBS, samples=len(lat))  # fmt: skip
    pub, raw_pub = phases.get("publish"), raw_phases.get("publish")
    if pub is not None and raw_pub is not None:
        count, raw_count = phases["published"] or 1, raw_phases["published"] or 1
        report.emit("fanout_publish_cpu_us_per_message", pub / count * 1e6,
                    raw_pub / raw_count * 1e6, subscribers=FANOUT_SUBS,
                    samples=int(count), raw_samples=int(raw_count))  # fmt: skip
    sub, raw_sub = phases.get("subscribe"), raw_phases.get("subscribe")
    if sub is not None and raw_sub is not None:
        report.emit("subscribe_cpu_ms", sub / FANOUT_SUBS * 1e3,
                    raw_sub / FANOUT_SUBS * 1e3, subscribers=FANOUT_SUBS)  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
