"""Attacks on a real ``sluice serve`` process, one phase each, next to a witness subscriber.

Phases of ``phase_s`` seconds each, while blocks are produced at ``RATE`` per second:

- ``quiet``: nothing (the raw baseline of the witness's delay, in the same run);
- ``hostile``: 15 hostile entries written into the chain stream (a 20 MB value,
  a million keys, 100,000-deep msgpack, wrong types) between the good blocks;
- ``slowloris``: 200 connections held open that never finish their upgrade
  request (100 send an unfinished head, 100 send one byte every 10 s), reopened
  when the server closes them;
- ``catchup``: 64 subscriptions catching up from block 0 (3 connections x 16
  that never read their socket, and 1 x 16 that reads, resubscribing once it
  reaches the head);
- ``all``: slow-loris and catch-up together (the soak of issue 21);
- ``hostile+catchup``: hostile entries while the catch-ups run (a known weak
  spot: the live tailer reads 55 MB of hostile entries 256 KiB per loop
  iteration, and catch-ups make iterations long).

``BENCH_ATTACK_PHASES`` picks phases (names joined by ``+`` combine attacks).
Catch-ups whose send buffer stays full ``STALL_S`` are closed with 1008.

The witness subscribes at the head before the first phase and must receive
every block produced, in order. Reported per phase: the witness's delay from
XADD to receipt (p50/p99); and the server's RSS and open descriptors at
baseline and after the attacks, its counters (refused entries, header
timeouts, slow disconnects). The attackers run in a child process, so the
witness's loop measures only the server. ``soak(phase_s)`` gives the raw
:class:`AttackResult` (tests/integration/chain/test_serve_attacks.py);
``run(duration_s)`` the benchmark rows (``make bench B=abuse``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import aiohttp  # noqa: E402
import msgpack  # noqa: E402
import redis  # noqa: E402
from abuse_serve import _proc_status, _wait_http  # noqa: E402
from common import percentile  # noqa: E402

from pipeline import keys  # noqa: E402
from pipeline.blockcodec import ENTRY_FIELD, encode_block  # noqa: E402
from pipeline.chain.produce.generator import SyntheticChain  # noqa: E402
from pipeline.local.redisserver import LocalRedis  # noqa: E402
from pipeline.runtime.ports import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
STREAM = "chain:attacks"
RATE = 20.0
SEED_BLOCKS = 5000
PHASES = tuple(
    os.environ.get(
        "BENCH_ATTACK_PHASES", "quiet,hostile,slowloris,catchup,all,hostile+catchup"
    ).split(",")
)
#: What each phase runs in the attacking child.
ATTACKS = {
    "quiet": (),
    "hostile": (),
    "slowloris": ("slowloris",),
    "catchup": ("catchup",),
    "stuck": ("stuck",),
    "reading": ("reading",),
    "all": ("slowloris", "catchup"),
}
HOSTILE_IN = ("hostile",)
#: A catch-up whose send buffer stays full this long is closed (1008): shorter than a phase.
STALL_S = "5"
#: The server's websocket heartbeat: a ping every so many seconds, the connection closed
#: if its pong is not back within half as long (aiohttp); well past STALL_S.
HEARTBEAT_S = "20"
SLOWLORIS = 200
#: How long past its phase an attacker waits for the server to close what it holds.
LINGER_S = 30.0
#: The warm-up catch-up before the baseline is taken, in seconds.
WARM_S = 5.0
UPGRADE = (
    b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
)
_COUNTERS = (
    "sluice_serve_entries_refused_total",
    "sluice_serve_header_timeouts_total",
    "sluice_serve_connections_refused_total",
    "sluice_serve_slow_disconnects_total",
    "sluice_serve_blocks_live_total",
    "sluice_serve_redis_errors_total",
    "sluice_serve_internal_errors_total",
    "sluice_serve_memory_releases_total",
    "sluice_serve_memory_released_bytes_total",
    "sluice_serve_history_cache_dropped_total",
)


@dataclass
class PhaseResult:
    name: str
    blocks: int = 0
    missing: int = 0
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    max_ms: float = float("nan")


@dataclass
class AttackResult:
    phase_s: float
    phases: list[PhaseResult] = field(default_factory=list)
    rss_base_kb: int = 0
    rss_high_kb: int = 0
    rss_after_kb: int = 0
    fds_base: int = 0
    fds_high: int = 0
    fds_after: int = 0
    counters: dict[str, float] = field(default_factory=dict)
    attacker: dict[str, int] = field(default_factory=dict)
    server_alive: bool = False
    notes: list[str] = field(default_factory=list)

    def phase(self, name: str) -> PhaseResult:
        return next(p for p in self.phases if p.name == name)

    def settled(self) -> bool:
        """Resident memory and descriptors back within 20% of the baseline (the
        descriptors with 2 to spare: a Redis pool may keep a connection more)."""
        return (
            self.rss_after_kb <= self.rss_base_kb * 1.2
            and self.fds_after <= self.fds_base * 1.2 + 2
        )


def hostile_entries(num: int, parent: bytes) -> list[bytes]:
    """15 entries posing as block ``num`` on top of ``parent`` (see the module doc)."""

    def block(i: int, **fields: Any) -> bytes:
        body = {"num": num, "hash": bytes([0xEE, i]) * 16, "parent": parent, **fields}
        out: bytes = msgpack.packb(body, use_bin_type=True)
        return out

    many = msgpack.packb({f"k{i}": b"" for i in range(1_000_000)}, use_bin_type=True)
    deep = b"\x91" * 100_000 + b"\xc0"
    return [
        block(0, updates={"k": b"\x00" * (20 << 20)}),
        block(1, updates={f"k{i}": b"\x00" * 1000 for i in range(20_000)}),
        b"\x84" + block(2)[1:] + msgpack.packb("updates") + many,
        b"\x84" + block(3)[1:] + msgpack.packb("updates") + many,
        deep,
        b"\x84" + block(4)[1:] + msgpack.packb("updates") + deep,
        block(5, updates={"k": "a str"}),
        block(6, updates=[b"x"]),
        block(7, deletes={"k": 1}),
        block(8, subbatches=[{"id": 5}]),
        block(9, subbatches=["x"]),
        block(10, batches={"p": 1}),
        block(11, weight="heavy"),
        msgpack.packb({"num": "1", "hash": parent, "parent": parent}),
        b"\xc1 not msgpack",
    ]


async def _counters(http: aiohttp.ClientSession, base: str) -> dict[str, float]:
    out: dict[str, float] = {}
    async with http.get(base + "/metrics") as resp:
        for line in (await resp.text()).splitlines():
            sample, _, value = line.partition(" ")
            name = sample.partition("{")[0]  # a labelled counter (redis errors by kind): summed
            if name in _COUNTERS:
                out[name] = out.get(name, 0.0) + float(value)
    return out


#: How the server's resident memory and descriptors are watched once the attackers left:
#: called with the server's pid and the result; sets ``rss_after_kb`` and ``fds_after``.
Settle = Callable[[int, "AttackResult"], Awaitable[None]]


async def settle_for(pid: int, result: AttackResult) -> None:
    """The benchmark's wait: until both are within 20% of the baseline or BENCH_SETTLE_S passed."""
    deadline = time.monotonic() + float(os.environ.get("BENCH_SETTLE_S", "20"))
    while True:
        result.rss_after_kb, result.fds_after = _proc_status(pid)
        if result.settled() or time.monotonic() > deadline:
            return
        await asyncio.sleep(0.5)


async def soak(
    phase_s: float,
    *,
    phases: tuple[str, ...] = PHASES,
    redis_url: str | None = None,
    lake_uri: str | None = None,
    settle: Settle = settle_for,
    quiet_s: float | None = None,
) -> AttackResult:
    """Run ``phases`` against a fresh ``sluice serve`` child process (the ``quiet`` phase
    lasts ``quiet_s`` if given, every other ``phase_s``)."""
    result = AttackResult(phase_s=phase_s)
    with tempfile.TemporaryDirectory() as tmp:
        local = None
        if redis_url is None:
            local = LocalRedis(Path(tmp) / "redis").start()
            redis_url = local.url
        client = redis.Redis.from_url(redis_url)
        key = keys.stream(STREAM)
        client.delete(key)
        chain = SyntheticChain(seed=12)
        pipe = client.pipeline(transaction=False)
        for block in chain.take(SEED_BLOCKS):
            pipe.xadd(key, {ENTRY_FIELD: encode_block(block)})
        pipe.execute()
        port = free_port()
        env = {
            **os.environ,
            "SLUICE_REDIS_URL": redis_url,
            "SLUICE_LAKE_URI": lake_uri or f"{tmp}/lake",
            "SLUICE_SERVE_STREAM": STREAM,
            "SLUICE_CHAIN_STREAMS": STREAM,
            # longer than a stuck catch-up takes to fill its buffers and stall (STALL_S):
            # with 6 s, a loaded server's catch-ups had not filled them when the heartbeat's
            # unanswered ping closed the never-reading connections, and no 1008 came
            # (slow disconnects 0 with the stall at 8 s and the heartbeat at 6 s, 3 at 20 s)
            "SLUICE_SERVE_HEARTBEAT_S": HEARTBEAT_S,
            "SLUICE_SERVE_STALL_S": STALL_S,
            "SLUICE_LOG_LEVEL": "WARNING",
        }
        server = await asyncio.create_subprocess_exec(
            sys.executable,
            # BENCH_SERVE_PROFILE: a file for the server's cProfile statistics
            *(
                ("-m", "cProfile", "-o", os.environ["BENCH_SERVE_PROFILE"])
                if os.environ.get("BENCH_SERVE_PROFILE")
                else ()
            ),
            "-m",
            "pipeline.cli",
            "serve",
            "--port",
            str(port),
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            # BENCH_SERVE_LOG: a file for the server's log (to look into a phase)
            stderr=open(os.environ["BENCH_SERVE_LOG"], "w")  # noqa: SIM115, ASYNC230
            if os.environ.get("BENCH_SERVE_LOG")
            else subprocess.DEVNULL,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            await _wait_http(base)
            lengths = [
                (name, quiet_s if name == "quiet" and quiet_s is not None else phase_s)
                for name in phases
            ]
            await _phases(base, server.pid, client, key, chain, lengths, result, settle)
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


async def _phases(
    base: str,
    pid: int,
    client: redis.Redis,
    key: str,
    chain: SyntheticChain,
    lengths: list[tuple[str, float]],
    result: AttackResult,
    settle: Settle,
) -> None:
    produced: dict[int, float] = {}
    received: dict[int, float] = {}
    stop = asyncio.Event()
    hostile_now = asyncio.Event()

    async def produce() -> None:
        t0 = time.perf_counter()
        i = 0
        while not stop.is_set():
            if hostile_now.is_set():
                hostile_now.clear()
                head = chain.canonical[-1]
                # built in a thread: packing a million keys on this loop kept the witness
                # from answering the server's ping (closed 1006 under load, the run lost)
                bad = await asyncio.to_thread(hostile_entries, head.num + 1, head.hash)
                for data in bad:
                    await asyncio.to_thread(client.xadd, key, {ENTRY_FIELD: data})
            for block in chain.step():
                produced[block.num] = time.perf_counter()
                client.xadd(key, {ENTRY_FIELD: encode_block(block)})
            i += 1
            await asyncio.sleep(max(0.0, t0 + i / RATE - time.perf_counter()))

    async def sample() -> None:
        while not stop.is_set():
            rss, fds = _proc_status(pid)
            result.rss_high_kb = max(result.rss_high_kb, rss)
            result.fds_high = max(result.fds_high, fds)
            await asyncio.sleep(0.2)

    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(base + "/ws", max_msg_size=1 << 22) as ws,
    ):
        head = chain.canonical[-1]
        await ws.send_str(
            json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "cardinal_subscribe",
                    "params": ["streams", hex(head.num), "0x" + head.hash.hex(), []],
                }
            )
        )

        async def witness() -> None:
            async for msg in ws:
                if msg.type != aiohttp.WSMsgType.TEXT:
                    result.notes.append(f"witness: {msg.type.name} {msg.data!r}")
                    break
                body = json.loads(msg.data)
                if "error" in body or "error" in body.get("params", {}):
                    result.notes.append(f"witness: {msg.data[:300]}")  # its subscription ended
                res = body.get("params", {}).get("result")
                if isinstance(res, dict) and res.get("type") == "batch":
                    received.setdefault(int(res["num"], 16), time.perf_counter())
            else:
                result.notes.append(f"witness: connection closed ({ws.close_code})")

        reader = asyncio.create_task(witness())
        await asyncio.sleep(1.0)  # the tail is indexed, the lake opened
        # one catch-up from block 0 first: the baseline then holds what serving any
        # catch-up loads once (modules, code paths: +10% of an idle server's RSS), so
        # what stays above it is what the attacks left
        await _attack_in_child(base, ATTACKS["reading"], WARM_S, result)
        await asyncio.sleep(1.0)
        result.rss_base_kb, result.fds_base = _proc_status(pid)
        result.rss_high_kb, result.fds_high = result.rss_base_kb, result.fds_base
        tasks = [asyncio.create_task(produce()), asyncio.create_task(sample())]
        windows: list[tuple[str, int, int]] = []
        for name, phase_s in lengths:
            first = chain.canonical[-1].num + 1
            parts = name.split("+")  # e.g. BENCH_ATTACK_PHASES=quiet,hostile+catchup
            if name in HOSTILE_IN or "hostile" in parts:
                hostile_now.set()
            kinds = ATTACKS.get(name) or tuple(p for p in parts if p != "hostile")
            counts = await _attack_in_child(base, kinds, phase_s, result)
            for k, v in counts.items():
                result.attacker[k] = result.attacker.get(k, 0) + v
            windows.append((name, first, chain.canonical[-1].num))
        stop.set()
        await asyncio.gather(*tasks)
        last = chain.canonical[-1].num
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(  # noqa: ASYNC110 (polls a dict)
            n in received for n in range(windows[0][1], last + 1)
        ):
            await asyncio.sleep(0.1)
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        for name, lo, hi in windows:
            wanted = range(lo, hi + 1)
            phase = PhaseResult(name)
            phase.blocks = sum(1 for n in wanted if n in received)
            phase.missing = len(wanted) - phase.blocks
            delays = [(received[n] - produced[n]) * 1000 for n in wanted if n in received]
            phase.p50_ms = percentile(delays, 50)
            phase.p99_ms = percentile(delays, 99)
            phase.max_ms = max(delays, default=float("nan"))
            result.phases.append(phase)
        await settle(pid, result)  # descriptors and memory settle back once the attackers left
        result.counters = await _counters(http, base)
        async with http.get(base + "/healthz") as resp:
            if resp.status != 200:
                result.notes.append(f"healthz {resp.status}: {await resp.text()}")


async def _attack_in_child(
    base: str, kinds: tuple[str, ...], seconds: float, result: AttackResult
) -> dict[str, int]:
    if not kinds:
        await asyncio.sleep(seconds)
        return {}
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "attack",
        base,
        ",".join(kinds),
        str(seconds),
        cwd=ROOT,
        stdout=subprocess.PIPE,
    )
    out, _ = await child.communicate()
    try:
        counts: dict[str, int] = json.loads(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        result.notes.append(f"attacker {kinds} failed with exit code {child.returncode}")
        return {}
    return counts


# --- the attacking child ---------------------------------------------------------


class _Attacker:
    def __init__(self, base: str, seconds: float) -> None:
        self.base = base
        self.host, port = base.removeprefix("http://").rsplit(":", 1)
        self.port = int(port)
        self.deadline = time.monotonic() + seconds
        self.counts: dict[str, int] = {
            "slowloris_opened": 0,
            "slowloris_closed_by_server": 0,
            "catchup_connections": 0,
            "catchup_closed_by_server": 0,
        }

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def linger(self) -> float:
        """What is left of the phase plus :data:`LINGER_S`: how long a connection already
        open waits for the server to close it (a loaded server's timers fire late, and an
        attacker that left at the phase's end tested nothing)."""
        return self.left() + LINGER_S

    async def _loris(self, trickle: bool) -> None:
        """One slow-loris slot: a connection that never finishes its head, reopened when closed."""
        while self.left() > 0:
            try:
                reader, writer = await asyncio.open_connection(self.host, self.port)
            except OSError:
                await asyncio.sleep(0.5)
                continue
            self.counts["slowloris_opened"] += 1
            try:
                if not trickle:
                    writer.write(UPGRADE)
                    await writer.drain()
                    async with asyncio.timeout(max(0.0, self.linger())):
                        await reader.read()
                else:
                    for byte in UPGRADE * 10:
                        writer.write(bytes([byte]))
                        await writer.drain()
                        async with asyncio.timeout(min(10.0, max(0.0, self.linger()))):
                            if await reader.read(1024) == b"" or reader.at_eof():
                                break
                    else:
                        continue
                self.counts["slowloris_closed_by_server"] += 1
            except TimeoutError:
                if self.linger() > 0:
                    continue  # trickle: no answer in 10 s, send the next byte
            except ConnectionError:
                self.counts["slowloris_closed_by_server"] += 1
            finally:
                writer.close()

    async def _stuck_catchup(self, session: aiohttp.ClientSession, zero: str) -> None:
        """16 subscriptions from block 0 on a connection whose socket is never read."""
        while self.left() > 0:
            self.counts["catchup_connections"] += 1
            try:
                async with session.ws_connect(self.base + "/ws", max_msg_size=1 << 22) as ws:
                    for i in range(16):
                        await ws.send_str(_subscribe(i, zero))
                    await asyncio.sleep(max(0.0, self.left()))  # never read: buffers fill
                    await self._until_a_slow_disconnect(session)
                    # read now to learn whether the server closed it meanwhile (1008)
                    with contextlib.suppress(TimeoutError):
                        while (await ws.receive(timeout=1.0)).type == aiohttp.WSMsgType.TEXT:
                            pass
                    if ws.close_code == 1008:
                        self.counts["catchup_closed_by_server"] += 1
                    return
            except (aiohttp.ClientError, ConnectionError):
                self.counts["catchup_closed_by_server"] += 1
                await asyncio.sleep(0.2)

    async def _until_a_slow_disconnect(self, session: aiohttp.ClientSession) -> None:
        """Past the phase, hold the unread connection until the server counted a slow
        reader's 1008, for :meth:`linger` at most: on a loaded machine the catch-ups may
        not fill the buffers within the phase."""
        name = "sluice_serve_slow_disconnects_total"
        while self.linger() > 0:
            with contextlib.suppress(aiohttp.ClientError, ConnectionError):
                async with session.get(self.base + "/metrics") as resp:
                    for line in (await resp.text()).splitlines():
                        if line.startswith(name + " ") and float(line.split()[-1]) >= 1:
                            return
            await asyncio.sleep(0.5)

    async def _reading_catchup(self, session: aiohttp.ClientSession, zero: str) -> None:
        """16 subscriptions from block 0 that read, resubscribing whenever they reach the head."""
        while self.left() > 0:
            self.counts["catchup_connections"] += 1
            with contextlib.suppress(aiohttp.ClientError, ConnectionError, TimeoutError):
                async with session.ws_connect(self.base + "/ws", max_msg_size=1 << 22) as ws:
                    for i in range(16):
                        await ws.send_str(_subscribe(i, zero))
                    seen = 0
                    while self.left() > 0 and seen < 16 * SEED_BLOCKS:
                        msg = await ws.receive(timeout=max(0.1, self.left()))
                        if msg.type != aiohttp.WSMsgType.TEXT:
                            break
                        if b'"batch"' in msg.data.encode()[:200]:
                            seen += 1

    async def run(self, kinds: list[str]) -> dict[str, int]:
        tasks: list[asyncio.Task[None]] = []
        stuck = aiohttp.TCPConnector(limit=0, socket_factory=_small_receive_buffer)
        async with (
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session,
            aiohttp.ClientSession(connector=stuck) as stuck_session,
        ):
            if "slowloris" in kinds:
                tasks += [
                    asyncio.create_task(self._loris(trickle=i % 2 == 1)) for i in range(SLOWLORIS)
                ]
            zero = "0x" + SyntheticChain(seed=12).take(1)[0].hash.hex()
            if "catchup" in kinds or "stuck" in kinds:
                tasks += [
                    asyncio.create_task(self._stuck_catchup(stuck_session, zero)) for _ in range(3)
                ]
            if "catchup" in kinds or "reading" in kinds:
                tasks.append(asyncio.create_task(self._reading_catchup(session, zero)))
            await asyncio.sleep(max(0.0, self.left()))
            if tasks:  # the stuck ones drain their socket to learn how they were closed
                await asyncio.wait(tasks, timeout=LINGER_S + 15)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return self.counts


def _small_receive_buffer(addr: Any) -> socket.socket:
    """A client socket with a small receive buffer: a reader that never reads fills the
    server's send buffer after a few hundred kB, not after the kernel's megabytes (on a
    loaded machine the catch-ups did not get that far within a phase: no 1008 came)."""
    family, type_, proto, _, _ = addr
    sock = socket.socket(family, type_, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 14)
    return sock


def _subscribe(i: int, zero: str) -> str:
    return json.dumps(
        {
            "jsonrpc": "2.0",
            "id": i,
            "method": "cardinal_subscribe",
            "params": ["streams", "0x0", zero, []],
        }
    )


def run(duration_s: float) -> list[dict[str, Any]]:
    """The phases as benchmark rows: each phase's witness delay against the quiet phase's."""
    phase_s = max(10.0, duration_s / len(PHASES))
    r = asyncio.run(soak(phase_s))
    quiet = r.phase("quiet")
    rows: list[dict[str, Any]] = []
    for phase in r.phases:
        for q, value, base in (
            ("p50", phase.p50_ms, quiet.p50_ms),
            ("p99", phase.p99_ms, quiet.p99_ms),
        ):
            rows.append(
                {
                    "bench": "abuse",
                    "metric": f"serve_attack_{phase.name}_witness_{q}_ms",
                    "value": round(value, 3),
                    "baseline": round(base, 3),
                    "ratio": round(value / base, 3) if base else None,
                    "missing": phase.missing,
                    "phase_s": phase_s,
                }
            )
    rows += [
        {
            "bench": "abuse",
            "metric": "serve_attack_rss_after_mb",
            "value": round(r.rss_after_kb / 1024, 1),
            "baseline": round(r.rss_base_kb / 1024, 1),
            "ratio": round(r.rss_after_kb / r.rss_base_kb, 3) if r.rss_base_kb else None,
            "high_mb": round(r.rss_high_kb / 1024, 1),
        },
        {
            "bench": "abuse",
            "metric": "serve_attack_fds_after",
            "value": r.fds_after,
            "baseline": r.fds_base,
            "ratio": round(r.fds_after / r.fds_base, 3) if r.fds_base else None,
            "high": r.fds_high,
        },
        {"bench": "abuse", "metric": "serve_attack_counters", "value": 0, **r.counters},
        {"bench": "abuse", "metric": "serve_attack_attacker", "value": 0, **r.attacker},
    ]
    if r.notes:
        rows.append({"bench": "abuse", "metric": "serve_attack_notes", "value": len(r.notes)})
        rows[-1]["notes"] = r.notes
    return rows


if __name__ == "__main__":
    if sys.argv[1:2] == ["attack"]:
        counts = asyncio.run(_Attacker(sys.argv[2], float(sys.argv[4])).run(sys.argv[3].split(",")))
        print(json.dumps(counts))
    else:
        outcome = asyncio.run(soak(float(sys.argv[1]) if len(sys.argv) > 1 else 15.0))
        print(json.dumps(asdict(outcome), indent=2))
