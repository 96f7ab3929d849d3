"""A bounded abuse mix against a real ``sluice node --listen`` next to a witness peer.

``run(duration_s)`` starts a private redis-server (or uses ``redis_url``) and a
``sluice node`` process (echo worker, a consumed stream, TCP listening with
short timeouts), then a witness node in this process that sends one echo
request every ``WITNESS_INTERVAL_S`` over TCP and times each reply. After a
quiet warm-up (the baseline), the abuse mix runs for ``duration_s``:

- silent sockets: ``SILENT`` connections that never send a byte, reopened as
  the node drops them (first-frame timeout, eviction at its connection bound);
- trickles: a valid first frame, then a header announcing about 1 MiB whose
  bytes come one at a time (the per-frame deadline cuts them);
- garbage: unknown type bytes, 4 GiB frame headers, length without data flag,
  random bytes, one connection each;
- routed bombs: valid Dialogue frames carrying 100k-deep msgpack, wrong
  types, unknown workers, on one long-lived connection;
- big echoes: 512 KiB requests answered over the abuser's connection;
- stream poison: undecodable entries pushed into the consumed stream.

Then the abuse stops and the node gets ``SETTLE_S`` to give back what it took.
The figures (``tests/bench/common.py`` format): witness latency p50 / p99 /
max, requests lost, RSS and open file descriptors of the node at baseline,
high-water and after, and the node's own counters of what it refused.
``python tests/bench/abuse_node.py [seconds]`` prints them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from common import Report, percentile  # noqa: E402

from pipeline import keys  # noqa: E402
from pipeline.dialogue.connection import Connection  # noqa: E402
from pipeline.dialogue.transport import TcpTransport  # noqa: E402
from pipeline.local.redisserver import LocalRedis  # noqa: E402
from pipeline.redisio.conn import UNAVAILABLE, Role, connect  # noqa: E402
from pipeline.routing.message import Address, AddressType, Route, TransportMessage  # noqa: E402
from pipeline.routing.node import Context, Node, Worker  # noqa: E402
from pipeline.runtime.ports import free_port  # noqa: E402
from pipeline.settings import Settings  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
WITNESS_INTERVAL_S = 0.02
WARMUP_S = 2.0
SETTLE_S = 15.0
SILENT = 192
TRICKLES = 8
#: The node's bounds during the run (short, so the abuse meets every one of them).
NODE_ENV = {
    "SLUICE_NODE_TCP_MAX_CONNECTIONS": "128",
    "SLUICE_NODE_TCP_FIRST_FRAME_S": "2",
    "SLUICE_NODE_TCP_FRAME_S": "2",
    "SLUICE_NODE_TCP_IDLE_S": "10",
    "SLUICE_LOG_LEVEL": "ERROR",
}
HEADER = struct.Struct(">BII")
NESTED = b"\x91" * 100_000 + b"\xc0"


def _frame(data: bytes) -> bytes:
    return HEADER.pack(0x08, 0, len(data)) + data


def _echo_request(payload: bytes) -> bytes:
    return TransportMessage(Route(["echo"]), Route(["abuser"]), payload).encode()


class _Witness(Worker):
    """Sends one echo request per interval; records each reply's latency."""

    def __init__(self, target: str) -> None:
        self.route = Route([Address(AddressType.TCP, target.encode()), "echo"])
        self.sent: dict[int, float] = {}
        self.latencies_ms: list[float] = []
        self.stray = 0
        self._seq = 0

    async def send_one(self, node: Node) -> None:
        seq = self._seq
        self._seq += 1
        self.sent[seq] = time.perf_counter()
        await node.deliver(TransportMessage(self.route, Route(["witness"]), b"%d" % seq))

    async def handle(self, ctx: Context) -> None:
        started = self.sent.pop(int(ctx.payload), None)
        if started is None:
            self.stray += 1
            return
        self.latencies_ms.append((time.perf_counter() - started) * 1000)


class _Probe:
    """RSS and open file descriptors of one process, with high-water marks."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.rss_high = 0.0
        self.fds_high = 0

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def cpu_s(self) -> float:
        """User + system CPU seconds the process used so far."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def sample(self) -> tuple[float, int]:
        rss, fds = self.rss_mb(), self.fds()
        self.rss_high = max(self.rss_high, rss)
        self.fds_high = max(self.fds_high, fds)
        return rss, fds


async def _until_stopped(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep up to ``seconds``; True once ``stop`` is set."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await stop.wait()
    return stop.is_set()


async def _drain_until_eof(reader: asyncio.StreamReader, stop: asyncio.Event) -> None:
    read = asyncio.ensure_future(reader.read(1 << 16))
    halt = asyncio.ensure_future(stop.wait())
    try:
        while True:
            done, _ = await asyncio.wait({read, halt}, return_when=asyncio.FIRST_COMPLETED)
            if halt in done or not read.result():
                return
            read = asyncio.ensure_future(reader.read(1 << 16))
    except OSError:
        return
    finally:
        for task in (read, halt):
            task.cancel()
        await asyncio.gather(read, halt, return_exceptions=True)


async def _silent(port: int, stop: asyncio.Event, counts: dict[str, int]) -> None:
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            counts["connect_failed"] += 1
            await _until_stopped(stop, 0.2)
            continue
        counts["silent_opened"] += 1
        await _drain_until_eof(reader, stop)
        writer.close()
        await _until_stopped(stop, 0.3 + random.random())


async def _trickle(port: int, stop: asyncio.Event, counts: dict[str, int]) -> None:
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_frame(_echo_request(b"t")) + HEADER.pack(0x08, 0, (1 << 20) - 64))
            counts["trickles"] += 1
            while not reader.at_eof() and not stop.is_set():
                writer.write(b"\x00")
                await writer.drain()
                if await _until_stopped(stop, 0.05):
                    break
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.001):
                        await reader.read(1 << 16)
            writer.close()
        except OSError:
            counts["trickle_dropped"] += 1
            await _until_stopped(stop, 0.1)


def _garbage() -> bytes:
    return random.choice(
        [
            b"\xff" * 64,
            HEADER.pack(0x08, 0, 0xFFFFFFFF),
            HEADER.pack(0x00, 0, 5),
            HEADER.pack(0x0B, 7, 1) + b"x",  # a Response for an id never issued
            random.randbytes(random.randint(1, 200)),
        ]
    )


async def _garbage_loop(port: int, stop: asyncio.Event, counts: dict[str, int]) -> None:
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_garbage())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(3):
                    await _drain_until_eof(reader, stop)
            writer.close()
            counts["garbage"] += 1
        except OSError:
            counts["garbage_dropped"] += 1
        await _until_stopped(stop, 0.02)


def _bombs() -> list[bytes]:
    return [
        NESTED,
        b"\x94\x01" + NESTED,
        b"\x94\x01\x91\x92\x00\xa3str\x90\xc4\x01x",
        b"\x94\xcf" + b"\xff" * 8 + b"\x90\x90\xc4\x01x",
        TransportMessage(Route(["nobody"]), Route(["abuser"]), b"x").encode(),
        b"\xdf\xff\xff\xff\xff",
    ]


async def _routed_bombs(port: int, stop: asyncio.Event, counts: dict[str, int]) -> None:
    bombs = _bombs()
    while not stop.is_set():
        try:
            conn = await Connection.connect("127.0.0.1", port, on_message=lambda data: None)
        except OSError:
            await _until_stopped(stop, 0.2)
            continue
        try:
            while not stop.is_set() and not conn.closed:
                await conn.send_message(random.choice(bombs))
                counts["bombs"] += 1
                await _until_stopped(stop, 0.02)
        except Exception:  # noqa: BLE001 - the node may drop us (eviction) any way: reconnect
            counts["bomb_conn_dropped"] += 1
        finally:
            await conn.close(timeout=1)


async def _big_echoes(port: int, stop: asyncio.Event, counts: dict[str, int]) -> None:
    payload = b"B" * (512 << 10)

    def got(data: bytes) -> None:
        counts["big_replies"] += 1

    while not stop.is_set():
        try:
            conn = await Connection.connect("127.0.0.1", port, on_message=got)
        except OSError:
            await _until_stopped(stop, 0.2)
            continue
        try:
            while not stop.is_set() and not conn.closed:
                await conn.send_message(_echo_request(payload))
                counts["big_sent"] += 1
                await _until_stopped(stop, 0.2)
        except Exception:  # noqa: BLE001 - the node may drop us any way: reconnect
            counts["big_conn_dropped"] += 1
        finally:
            await conn.close(timeout=1)


async def _stream_poison(url: str, stop: asyncio.Event, counts: dict[str, int]) -> None:
    client = connect(url, Role.CLI)
    poison = [*_bombs(), b"\xc1", b""]
    try:
        while not stop.is_set():
            with contextlib.suppress(*UNAVAILABLE):
                await client.xadd(keys.stream("abuse"), {b"data": random.choice(poison)})
                counts["stream_poison"] += 1
            await _until_stopped(stop, 0.05)
    finally:
        await client.aclose()


def _node_counters(log: Path) -> dict[str, int]:
    for line in reversed(_text(log).splitlines()):
        if line.startswith('{"node"'):
            counters: dict[str, int] = json.loads(line)["counters"]
            return counters
    return {}


def _run(duration_s: float, redis_url: str, workdir: Path) -> list[dict[str, Any]]:
    port = free_port()
    log = workdir / "node.log"
    env = {**os.environ, **NODE_ENV, "SLUICE_REDIS_URL": redis_url, "PYTHONPATH": str(ROOT)}
    env["SLUICE_CONFIG"] = os.devnull  # no config file
    env.pop("PYTHONASYNCIODEBUG", None)
    cmd = [sys.executable, "-m", "pipeline.cli", "node", "--name", "victim", "--workers", "echo"]
    cmd += ["--consume", "abuse", "--listen", f"127.0.0.1:{port}"]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, cwd=workdir, stdout=out, stderr=subprocess.STDOUT)
    try:
        return asyncio.run(_measure(proc, port, redis_url, duration_s, log))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _text(path: Path) -> str:
    return path.read_text(errors="replace")


async def _measure(
    proc: subprocess.Popen[bytes], port: int, redis_url: str, duration_s: float, log: Path
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 30
    while "node victim ready" not in _text(log):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"node did not start:\n{_text(log)}")
        await asyncio.sleep(0.05)
    probe = _Probe(proc.pid)
    node = Node("witness")
    node.register_transport(TcpTransport(None, Settings()))
    await node.start()
    witness = _Witness(f"127.0.0.1:{port}")
    await node.add_worker("witness", witness)
    done = asyncio.Event()

    async def pace() -> None:
        while not await _until_stopped(done, WITNESS_INTERVAL_S):
            await witness.send_one(node)
            probe.sample()

    pacer = asyncio.create_task(pace())
    try:
        await asyncio.sleep(WARMUP_S)
        rss_base, fds_base = probe.sample()
        warm = len(witness.latencies_ms)
        cpu_before = probe.cpu_s()
        # The abusers run in a process of their own: the witness measures the node,
        # not an event loop shared with two hundred abusive sockets.
        abuser = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--abuse", str(port), redis_url, str(duration_s),
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, _ = await abuser.communicate()
        counts: dict[str, int] = json.loads(out.decode().strip().splitlines()[-1])
        cpu_used = probe.cpu_s() - cpu_before
        during = witness.latencies_ms[warm:]
        settle_until = time.monotonic() + SETTLE_S
        rss_after, fds_after = probe.sample()
        while fds_after > fds_base + 4 and time.monotonic() < settle_until:
            await asyncio.sleep(0.2)
            rss_after, fds_after = probe.sample()
    finally:
        done.set()
        await pacer
    async with asyncio.timeout(10):
        while witness.sent:  # noqa: ASYNC110 - the last replies still in flight; no event
            await asyncio.sleep(0.05)
    await node.stop()
    alive = proc.poll() is None
    proc.terminate()
    proc.wait(30)
    counters = _node_counters(log)
    report = Report("abuse_node")
    quiet = witness.latencies_ms[:warm]  # the warm-up, before any abuse: the baseline
    report.emit(
        "witness_p50_ms", percentile(during, 50), percentile(quiet, 50), requests=len(during)
    )
    report.emit("witness_p99_ms", percentile(during, 99), percentile(quiet, 99))
    report.emit("witness_max_ms", max(during) if during else float("nan"))
    report.emit("witness_lost", len(witness.sent), sent=witness._seq)
    report.emit("node_alive", 1.0 if alive else 0.0)
    report.emit("node_cpu_share", cpu_used / duration_s)
    report.emit("rss_mb", rss_after, baseline=rss_base, high=round(probe.rss_high, 1))
    report.emit("rss_high_mb", probe.rss_high, baseline=rss_base)
    report.emit("open_fds", fds_after, baseline=fds_base, high=probe.fds_high)
    report.emit("abuse_actions", sum(counts.values()), **dict(counts))
    refused = {k: v for k, v in counters.items() if "tcp_transport" in k or "dead" in k}
    report.emit("node_refusals", sum(refused.values()), **refused)
    return report.rows


class _Counts(dict[str, int]):
    """Counters of the abusers (a missing key reads as 0)."""

    def __missing__(self, key: str) -> int:
        return 0


async def _abuse(port: int, redis_url: str, duration_s: float) -> dict[str, int]:
    """Run every abuser for ``duration_s``; what each did."""
    stop = asyncio.Event()
    counts = _Counts()
    kinds: dict[str, list[Callable[[], Awaitable[None]]]] = {
        "silent": [lambda: _silent(port, stop, counts)] * SILENT,
        "trickle": [lambda: _trickle(port, stop, counts)] * TRICKLES,
        "garbage": [lambda: _garbage_loop(port, stop, counts)] * 2,
        "bombs": [lambda: _routed_bombs(port, stop, counts)],
        "big": [lambda: _big_echoes(port, stop, counts)],
        "poison": [lambda: _stream_poison(redis_url, stop, counts)],
    }
    # SLUICE_ABUSE=silent,big runs only those kinds (to see which one costs what).
    chosen = (
        os.environ.get("SLUICE_ABUSE", "").split(",") if os.environ.get("SLUICE_ABUSE") else kinds
    )
    abusers = [asyncio.create_task(loop()) for kind in chosen for loop in kinds[kind]]
    await asyncio.sleep(duration_s)
    stop.set()
    await asyncio.gather(*abusers, return_exceptions=True)
    return dict(counts)


def run(duration_s: float, redis_url: str | None = None) -> list[dict[str, Any]]:
    """Run the abuse mix for ``duration_s`` and return the figures (also printed as JSON lines)."""
    with tempfile.TemporaryDirectory(prefix="sluice-abuse-") as tmp:
        workdir = Path(tmp)
        if redis_url is not None:
            return _run(duration_s, redis_url, workdir)
        with LocalRedis(workdir / "redis") as server:
            return _run(duration_s, server.url, workdir)


if __name__ == "__main__" and sys.argv[1:2] == ["--abuse"]:
    port_text, url, seconds = sys.argv[2:5]
    print(json.dumps(asyncio.run(_abuse(int(port_text), url, float(seconds)))), flush=True)
elif __name__ == "__main__":
    saved = Report("abuse_node")
    saved.rows = run(float(sys.argv[1]) if len(sys.argv) > 1 else 60.0)
    saved.save()
