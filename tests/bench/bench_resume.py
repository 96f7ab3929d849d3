"""Benchmark of the resumption server (``make bench B=resume``).

- ``catchup_blocks_per_s``: 1,000,000 canonical blocks in Delta, one subscriber
  from block 0 to the head over the websocket of a fresh ``sluice serve`` process;
  baseline: a raw aiohttp websocket server process sending the same
  pre-encoded notifications. ``BENCH_RESUME_CATCHUPS`` (3) catch-ups of each, in
  turns: the figures are the medians, each pair's ratio beside them.
- ``first_block_p50_ms`` / ``first_block_p99_ms``: subscribe at random depths,
  time to the first block; baseline: the raw delta-rs read of that first page.
- ``fanout_p50_ms`` / ``fanout_p99_ms``: 500 subscribers, 100 blocks/s
  produced, latency from XADD to each client; baseline: a raw aiohttp server
  that XREADs the stream and sends each entry to every socket. The clients are
  aiohttp websockets in the bench process, beside the producer: their CPU
  (~20 us per message, about one core) competes with the server's on a small
  machine, so the figure holds the clients' own queueing too.
- ``fanout_go_p50_ms`` / ``fanout_go_p99_ms``: the same fan-out (a fresh server,
  a fresh raw server) with the subscribers in the Go load client
  ``tests/bench/fanout_go`` (a child process, a few us per message; the bench
  process then only produces). Built with ``go build`` once per source digest
  into ``~/.cache/sluice-go-bench/<digest>/fanout``; without ``go`` on PATH
  these figures are left out (one line on stderr says so).
- ``catchup_blocks_per_s_s3``: the same catch-up with the lake on a local S3
  server (versitygw, :mod:`pipeline.local.s3`); baseline: the local-disk
  lake's ``catchup_blocks_per_s`` of the same run.
- ``catchup_cpu_us_per_block`` / ``fanout_cpu_us_per_message`` /
  ``fanout_go_cpu_us_per_message``: CPU time (user + system) of the server
  process per block sent in catch-up and per notification received in fan-out
  (Python clients, Go client), against the raw servers' own: on a loaded
  machine these move much less than the wall-clock figures (Linux: read from
  ``/proc``; left out elsewhere).
- ``fanout_publish_cpu_us_per_message`` / ``fanout_go_publish_cpu_us_per_message``:
  the same CPU, counted only from the
  first block produced until every subscriber received every block (the
  per-message cost of fan-out itself); ``fanout_cpu_us_per_message`` also
  counts the 500 subscribes before it, which ``subscribe_cpu_ms`` (Python
  clients) and ``fanout_go_subscribe_cpu_ms`` (the Go client's, all at once) give
  per subscriber (the raw server's subscribe is a handshake and one reply, sent
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
import gc
import hashlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import aiohttp  # noqa: E402
import pyarrow as pa  # noqa: E402
import redis  # noqa: E402
from common import Report, percentile  # noqa: E402
from ordered_drain import run as ordered_drain  # noqa: E402

from pipeline import keys  # noqa: E402
from pipeline.blockcodec import ENTRY_FIELD, Block, encode_block  # noqa: E402
from pipeline.lake.storage.tables import BLOCKS  # noqa: E402
from pipeline.local.redisserver import LocalRedis  # noqa: E402
from pipeline.runtime.ports import free_port  # noqa: E402

STREAM = "chain:bench"
N = int(os.environ.get("BENCH_RESUME_BLOCKS", "1000000"))
FANOUT_SUBS = int(os.environ.get("BENCH_RESUME_SUBS", "500"))
FANOUT_RATE = 100
FANOUT_SECONDS = 5
FANOUT_BLOCKS = FANOUT_RATE * FANOUT_SECONDS
#: Blocks per data file of the lake (the archive writes one or more files per interval).
FILE_BLOCKS = int(os.environ.get("BENCH_RESUME_FILE_BLOCKS", "250000"))
#: Catch-ups of each server, in turns (their medians are the figures).
CATCHUPS = int(os.environ.get("BENCH_RESUME_CATCHUPS", "3"))
#: Parts to run (comma-separated): catchup, first, fanout, s3 (which needs catchup).
PARTS = set(os.environ.get("BENCH_RESUME_PARTS", "catchup,first,fanout,s3").split(","))
ROOT = Path(__file__).resolve().parents[2]
#: The Go load client's module, and where its builds are kept (one folder per source digest).
FANOUT_GO = Path(__file__).resolve().parent / "fanout_go"
GO_CACHE = Path.home() / ".cache" / "sluice-go-bench"


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

    from pipeline.lake.storage.tables import LAYOUT, TABLE_PROPERTIES

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
from pipeline.lake.storage.reader import LakeReader

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
    """Blocks per second of one catch-up from block 0 to ``expected`` blocks.

    The client is this process: its garbage is collected first, so that each run starts
    with the same heap (the collector's full passes over the lake's write had fallen in
    the second run only, 4 more of 24 ms each). On stderr: when the first block came,
    and how long the client waited for the server (wall time less its CPU time)."""
    gc.collect()
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(f"http://127.0.0.1:{port}/ws", max_msg_size=1 << 22) as ws,
    ):
        start, cpu = time.perf_counter(), time.process_time()
        await ws.send_str(subscribe_frame(0, block_hash(0)))
        await ws.receive()  # the subscription id
        count = 0
        first = 0.0
        while count < expected:
            msg = await ws.receive(timeout=60)
            if msg.type != aiohttp.WSMsgType.TEXT:
                raise RuntimeError(f"stream ended after {count}: {msg}")
            if not count:
                first = time.perf_counter() - start
            count += 1
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu
        print(f"# catch-up on :{port}: first block after {first * 1e3:.1f} ms; the client "
              f"used {cpu / expected * 1e6:.2f} us of CPU a block and waited "
              f"{max(0.0, elapsed - cpu):.2f} s of {elapsed:.2f} s", file=sys.stderr)  # fmt: skip
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
    from pipeline.lake.storage.reader import LakeReader

    rng = random.Random(7)
    out = []
    for _ in range(samples):
        num = rng.randrange(N)
        start = time.perf_counter()
        reader = LakeReader(lake_uri)
        next(reader.iter_canonical_arrow(STREAM, num, batch_rows=8192))
        out.append((time.perf_counter() - start) * 1000)
    return out


@contextlib.contextmanager
def live_stream(redis_url: str) -> Iterator[tuple[redis.Redis, str]]:
    """The chain stream of one fan-out run, empty at its start and deleted after.

    The subscribers resume at the lake's last block (``N - 1``), so the run's blocks
    ``N, N + 1, ...`` are all they get live; each run starts from ``N`` again, on a server
    that has not seen the previous run's stream (one fresh server a run, but for the first).
    """
    client = redis.Redis.from_url(redis_url)
    key = keys.stream(STREAM)
    try:
        if client.exists(key):
            raise RuntimeError(f"{key} holds {client.xlen(key)} entries before a fan-out run")
        yield client, key
    finally:
        client.delete(key)
        client.close()


async def produce(client: redis.Redis, key: str) -> None:
    """The live blocks ``N, N + 1, ...``, FANOUT_RATE a second for FANOUT_SECONDS, each with
    its XADD time (ns) in its ``t`` update: the clients' latency is now - t."""
    t0 = time.perf_counter()
    for i in range(FANOUT_BLOCKS):
        block = Block(
            num=N + i,
            hash=block_hash(N + i),
            parent=block_hash(N + i - 1),
            updates={"t": time.time_ns().to_bytes(8, "big"), "acct/1": b"\x02" * 8},
        )
        client.xadd(key, {ENTRY_FIELD: encode_block(block)})
        await asyncio.sleep(max(0.0, t0 + (i + 1) / FANOUT_RATE - time.perf_counter()))


class Clients(Protocol):
    """The fan-out's subscribers: ``subscribed(port)`` holds them open (each got the reply
    to its subscribe), ``all_in`` waits until each got every block (at most ``wait_s``)."""

    #: ms from XADD to each subscriber, of every frame with the ``"t":"0x`` marker
    latencies: list[float]
    #: such frames received so far
    received: int
    #: what went wrong, by kind (a refused connection, a dropped socket), if anything did
    errors: dict[str, int]

    def subscribed(self, port: int) -> contextlib.AbstractAsyncContextManager[None]: ...

    async def all_in(self, wait_s: float) -> None: ...


class PythonClients:
    """aiohttp websockets in the bench process itself, beside the producer."""

    def __init__(self, subs: int) -> None:
        self.subs = subs
        self.latencies: list[float] = []
        self.received = 0
        self.errors: dict[str, int] = {}  # a reader's error ends that reader, uncounted
        self._done, self._all_in = asyncio.Event(), asyncio.Event()

    @contextlib.asynccontextmanager
    async def subscribed(self, port: int) -> AsyncIterator[None]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            sockets = []
            for _ in range(self.subs):
                ws = await session.ws_connect(f"http://127.0.0.1:{port}/ws", max_msg_size=1 << 22)
                await ws.send_str(subscribe_frame(N - 1, block_hash(N - 1)))
                await ws.receive(timeout=30)
                sockets.append(ws)
            expected = len(sockets) * FANOUT_BLOCKS
            readers = [asyncio.create_task(self._read(ws, expected)) for ws in sockets]
            try:
                yield
            finally:
                self._done.set()
                await asyncio.gather(*readers)
                for ws in sockets:
                    await ws.close()

    async def _read(self, ws: aiohttp.ClientWebSocketResponse, expected: int) -> None:
        while not self._done.is_set():
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
                self.latencies.append((time.time_ns() - sent) / 1e6)
                self.received += 1
                if self.received >= expected:
                    self._all_in.set()

    async def all_in(self, wait_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._all_in.wait(), wait_s)


class GoClients:
    """The Go load client ``tests/bench/fanout_go`` in a child process: ``ready`` on its
    stdout once subscribed, one JSON line (the latencies, errors) once every subscriber got
    every block or it read ``stop``; it closes its sockets after that line."""

    def __init__(self, binary: str, subs: int) -> None:
        self.binary = binary
        self.subs = subs
        self.latencies: list[float] = []
        self.received = 0
        self.errors: dict[str, int] = {}
        self._report: asyncio.Task[bytes] | None = None
        self._reported = False
        self._proc: asyncio.subprocess.Process | None = None

    @contextlib.asynccontextmanager
    async def subscribed(self, port: int) -> AsyncIterator[None]:
        proc = self._proc = await asyncio.create_subprocess_exec(
            self.binary,
            *("-url", f"ws://127.0.0.1:{port}/ws", "-n", str(self.subs), "-latencies"),
            *("-frame", subscribe_frame(N - 1, block_hash(N - 1))),
            *("-count", str(FANOUT_BLOCKS)),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=1 << 26,  # the report is one line of every latency
        )
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), 300)
            if line.strip() != b"ready":
                raise RuntimeError(f"the Go fan-out client did not start: {line[:500]!r}")
            self._report = asyncio.create_task(proc.stdout.readline())
            yield
            if not self._reported:
                await self.all_in(0)
            if await proc.wait():
                raise RuntimeError(f"the Go fan-out client exited {proc.returncode}")
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()

    async def all_in(self, wait_s: float) -> None:
        """Until the report came (every subscriber got every block), at most ``wait_s``;
        then the client is told to stop and report what it has."""
        assert self._report is not None and self._proc is not None
        if not (await asyncio.wait({self._report}, timeout=wait_s))[0]:
            assert self._proc.stdin is not None
            self._proc.stdin.write(b"stop\n")
            await self._proc.stdin.drain()
        line = await self._report
        self._reported = True
        if not line:
            code = await self._proc.wait()
            raise RuntimeError(f"the Go fan-out client exited {code} without a report")
        report = json.loads(line)
        self.latencies = report["latencies_ms"] or []
        self.received = report["received"]
        self.errors = {kind: n for kind, n in report["errors"].items() if n}
        if self.errors or self.received < report["expected"]:
            print(f"# Go fan-out client: {self.received} of {report['expected']} messages, "
                  f"errors {self.errors}, first: {report['error_samples']}", file=sys.stderr)  # fmt: skip


def used(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else after - before


@dataclass
class FanoutRun:
    """One fan-out run's latencies (ms) and the server's CPU seconds: ``cpu`` the whole run
    (the subscribes to the sockets' close), ``subscribe`` the subscribes, ``publish`` from
    the first block until each subscriber got every block (bounded by a minute), in which
    ``published`` messages came."""

    latencies: list[float]
    cpu: float | None
    subscribe: float | None
    publish: float | None
    published: int
    errors: dict[str, int] = field(default_factory=dict)

    def cpu_us_per_message(self) -> float | None:
        if self.cpu is None or not self.latencies:
            return None
        return self.cpu / len(self.latencies) * 1e6


async def fanout(clients: Clients, port: int, redis_url: str, pid: int) -> FanoutRun:
    """FANOUT_BLOCKS live blocks from this process to the subscribers of ``clients`` on the
    server at ``port``, whose process ``pid`` has its CPU counted."""
    with live_stream(redis_url) as (client, key):
        cpu0 = cpu_s(pid)
        async with clients.subscribed(port):
            cpu1 = cpu_s(pid)
            await asyncio.sleep(1.0)  # subscribers reach the live head
            cpu2 = cpu_s(pid)
            await produce(client, key)
            await clients.all_in(60)
            cpu3 = cpu_s(pid)
            published = clients.received
        cpu4 = cpu_s(pid)
    return FanoutRun(clients.latencies, used(cpu0, cpu4), used(cpu0, cpu1), used(cpu2, cpu3),
                     published, clients.errors)  # fmt: skip


async def s3_catchup(report: Report, tmp: str, env: dict[str, str], local: float) -> None:
    """The catch-up figure again with the lake on a local S3 server, against ``local``."""
    from pipeline.local.s3 import LocalStore
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


async def catchups(
    report: Report, lake_uri: str, env: dict[str, str], procs: list[subprocess.Popen[str]]
) -> tuple[subprocess.Popen[str], int]:
    """CATCHUPS catch-ups of the raw server and of a fresh serve (its file cache cold), in
    turns, each alone on the machine; the medians are the figures (one run moves by 15-25%
    here), each pair's ratio beside them. Returns the last serve, kept for the next parts."""
    base_port = free_port()
    raw = spawn(["-c", BASELINE_SERVER, lake_uri, STREAM, str(base_port)], ready="READY")
    procs.append(raw)
    await wait_port(base_port)
    rates: dict[str, list[float]] = {"raw": [], "serve": []}
    cpus: dict[str, list[float]] = {"raw": [], "serve": []}
    server: subprocess.Popen[str] | None = None
    port = 0
    for _ in range(CATCHUPS):
        if server is not None:
            stop(server)  # the raw server runs alone, as the first time
        for name in ("raw", "serve"):
            if name == "serve":
                server, port = await start_serve(env, procs)
            proc, at = (raw, base_port) if name == "raw" else (server, port)
            assert proc is not None
            cpu0 = cpu_s(proc.pid)
            rates[name].append(await catchup(at, N))
            cpu = cpu_per(proc.pid, cpu0, N)
            if cpu is not None:
                cpus[name].append(cpu)
    stop(raw)
    assert server is not None
    pairs = [round(s / r, 3) for s, r in zip(rates["serve"], rates["raw"], strict=True)]
    report.emit("catchup_blocks_per_s", statistics.median(rates["serve"]),
                statistics.median(rates["raw"]), blocks=N, runs=CATCHUPS,
                pair_ratios=pairs)  # fmt: skip
    if len(cpus["serve"]) == len(cpus["raw"]) == CATCHUPS:
        report.emit("catchup_cpu_us_per_block", statistics.median(cpus["serve"]),
                    statistics.median(cpus["raw"]), blocks=N, runs=CATCHUPS)  # fmt: skip
    return server, port


async def main() -> None:
    report = Report("resume")
    ordered_drain(report)  # pure code, first: nothing else runs yet
    go_client = fanout_go_client() if "fanout" in PARTS else None
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
                "SLUICE_CHAIN_STREAMS": STREAM,
                "SLUICE_SERVE_SEND_BUFFER": "8192",
                "SLUICE_LOG_LEVEL": "WARNING",
            }
            if "catchup" in PARTS:
                server, port = await catchups(report, lake_uri, env, procs)
            else:
                server, port = await start_serve(env, procs)

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
                await fanouts(report, server, port, env, procs, go_client)
            stop(server)
            if "s3" in PARTS and "catchup" in PARTS:
                local = next(
                    r["value"] for r in report.rows if r["metric"] == "catchup_blocks_per_s"
                )
                await s3_catchup(report, tmp, env, local)
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
    env: dict[str, str],
    procs: list[subprocess.Popen[str]],
    go_client: str | None,
) -> None:
    """The fan-out figures: the Python clients against ``server`` (stopped after) and a raw
    fan-out server, then the Go client against a fresh server and a fresh raw server."""
    redis_url = env["SLUICE_REDIS_URL"]
    sluice = await fanout(PythonClients(FANOUT_SUBS), port, redis_url, server.pid)
    stop(server)
    raw = await raw_fanout(PythonClients(FANOUT_SUBS), redis_url, procs)
    emit_fanout(report, "fanout", sluice, raw)
    if sluice.subscribe is not None and raw.subscribe is not None:
        report.emit("subscribe_cpu_ms", sluice.subscribe / FANOUT_SUBS * 1e3,
                    raw.subscribe / FANOUT_SUBS * 1e3, subscribers=FANOUT_SUBS)  # fmt: skip
    if go_client is None:
        return
    server, port = await start_serve(env, procs)
    await warm_head(port)
    sluice = await fanout(GoClients(go_client, FANOUT_SUBS), port, redis_url, server.pid)
    stop(server)
    raw = await raw_fanout(GoClients(go_client, FANOUT_SUBS), redis_url, procs)
    emit_fanout(report, "fanout_go", sluice, raw)
    if sluice.subscribe is not None and raw.subscribe is not None:
        # (in fanout_go_cpu_us_per_message, beside the publish phase's own figure)
        report.emit("fanout_go_subscribe_cpu_ms", sluice.subscribe / FANOUT_SUBS * 1e3,
                    raw.subscribe / FANOUT_SUBS * 1e3, subscribers=FANOUT_SUBS)  # fmt: skip


async def raw_fanout(
    clients: Clients, redis_url: str, procs: list[subprocess.Popen[str]]
) -> FanoutRun:
    """A fan-out run against a fresh raw fan-out server (stopped after)."""
    port = free_port()
    proc = spawn(
        ["-c", FANOUT_BASELINE_SERVER, redis_url, keys.stream(STREAM), str(port)],
        ready="READY",
    )
    procs.append(proc)
    await wait_port(port)
    run = await fanout(clients, port, redis_url, proc.pid)
    stop(proc)
    return run


def emit_fanout(report: Report, prefix: str, sluice: FanoutRun, raw: FanoutRun) -> None:
    """``<prefix>_p50_ms``, ``<prefix>_p99_ms`` and ``<prefix>_cpu_us_per_message``."""
    errors = {}
    if sluice.errors or raw.errors:
        errors = {"errors": sluice.errors, "raw_errors": raw.errors}
    lat, raw_lat = sluice.latencies, raw.latencies
    for q in (50, 99):
        report.emit(f"{prefix}_p{q}_ms", percentile(lat, q), percentile(raw_lat, q),
                    subscribers=FANOUT_SUBS, rate=FANOUT_RATE, samples=len(lat),
                    **errors)  # fmt: skip
    cpu, raw_cpu = sluice.cpu_us_per_message(), raw.cpu_us_per_message()
    if cpu is not None and raw_cpu is not None:
        report.emit(f"{prefix}_cpu_us_per_message", cpu, raw_cpu, subscribers=FANOUT_SUBS,
                    samples=len(lat))  # fmt: skip
    if sluice.publish is not None and raw.publish is not None:
        # the publish phase alone: the subscribes, the idle second and the closes left out
        count, raw_count = sluice.published or 1, raw.published or 1
        report.emit(f"{prefix}_publish_cpu_us_per_message", sluice.publish / count * 1e6,
                    raw.publish / raw_count * 1e6, subscribers=FANOUT_SUBS,
                    samples=int(count), raw_samples=int(raw_count))  # fmt: skip


def stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    proc.wait(30)


async def start_serve(
    env: dict[str, str], procs: list[subprocess.Popen[str]]
) -> tuple[subprocess.Popen[str], int]:
    """A ``sluice serve`` process, once its ``/healthz`` answers, and its port."""
    port = free_port()
    server = spawn(["-m", "pipeline.cli", "serve", "--port", str(port)], env=env)
    procs.append(server)
    await wait_port(port)
    await wait_healthy(port)
    return server, port


def fanout_go_client() -> str | None:
    """The Go load client, built once per digest of its sources (``go build -mod=readonly``,
    into GO_CACHE/<digest>/fanout, renamed into place whole); None without ``go`` on PATH."""
    go = shutil.which("go")
    if go is None:
        print("# fanout_go_*: left out: no 'go' on PATH to build tests/bench/fanout_go",
              file=sys.stderr)  # fmt: skip
        return None
    digest = hashlib.sha256()
    for path in sorted(FANOUT_GO.iterdir()):
        if path.suffix == ".go" or path.name in ("go.mod", "go.sum"):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    out = GO_CACHE / digest.hexdigest()[:16]
    if not (out / "fanout").is_file():
        GO_CACHE.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix="build-", dir=GO_CACHE))  # same filesystem
        try:
            built = subprocess.run(
                [go, "build", "-mod=readonly", "-o", str(tmp / "fanout"), "."],
                cwd=FANOUT_GO, capture_output=True, text=True, timeout=900, check=False,
            )  # fmt: skip
            if built.returncode != 0:
                raise RuntimeError(f"go build of {FANOUT_GO} failed:\n{built.stderr[-4000:]}")
            with contextlib.suppress(OSError):
                tmp.rename(out)  # a concurrent build of the same sources may have won
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return str(out / "fanout")


if __name__ == "__main__":
    asyncio.run(main())
