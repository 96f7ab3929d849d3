"""Abuse mix against two running ``sluice bus`` processes, next to a witness client.

Twins 1001 (A) and 1002 (B), each with its own redis-server, run as real
``sluice bus`` child processes; an SDK handler serves ``bench.echo`` on B. The
witness calls A -> B one call at a time, the seed's way, and records every
latency. First it runs alone (the baseline), then next to the abusers:

* JSON bombs and wrong types on A's ``msgbus.system.local`` (1 KiB and 100k
  deep brackets, a message just over ``max_size``, every field of the wrong
  type, numbers at 2^63 and 2^256, ``ret`` naming a hash, a reserved ``ret``,
  a ``ret`` over 256 characters, ``now`` in milliseconds);
* the same garbage on B's ``msgbus.system.reply`` (a buggy handler);
* hostile POSTs to B's HTTP port: unsigned, forged, signed with a stale time,
  signed for another twin, garbage, oversized, replays of a captured POST, a
  signed batch body of bombs;
* idle TCP connections held open on B's port, and a flood of requests to an
  unknown twin.

``run(duration_s)`` returns rows in the format of :mod:`common` (witness p50,
p99, max latency and calls lost; per bus: RSS and open fds at baseline, their
high-water mark during the abuse, and after it). ``python abuse_bus.py
[--duration S]`` prints them and saves ``bench-results/abuse_bus.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
from common import Report, percentile  # noqa: E402

from pipeline import keys  # noqa: E402
from pipeline.bus.post import BATCH_TYPE  # noqa: E402
from pipeline.bus.signing import SIGNATURE_HEADER, TIME_HEADER, TWIN_HEADER, Signer  # noqa: E402
from pipeline.local.redisserver import LocalRedis  # noqa: E402
from pipeline.redisio import conn as redisconn  # noqa: E402
from pipeline.runtime.ports import free_port  # noqa: E402

CMD = "bench.echo"
A, B = 1001, 1002
MAX_SIZE = 1 << 20
IDLE_CONNECTIONS = 64
#: Pause of each abuser between two of its moves (bounds the mix's rate).
PAUSE_S = 0.02


@dataclass
class Sample:
    """RSS (bytes) and open fds of one process, over time."""

    pid: int
    base_rss: int = 0
    base_fds: int = 0
    high_rss: int = 0
    high_fds: int = 0

    def read(self) -> tuple[int, int]:
        rss = 0
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
        return rss, len(os.listdir(f"/proc/{self.pid}/fd"))

    def baseline(self) -> None:
        self.base_rss, self.base_fds = self.read()
        self.high_rss, self.high_fds = self.base_rss, self.base_fds

    def poll(self) -> None:
        rss, fds = self.read()
        self.high_rss, self.high_fds = max(self.high_rss, rss), max(self.high_fds, fds)


@dataclass
class Witness:
    latencies_ms: list[float] = field(default_factory=list)
    lost: int = 0
    problems: list[str] = field(default_factory=list)


def _doc(to: int, data: bytes = b"w", **fields: Any) -> dict[str, Any]:
    doc = {
        "ver": 1, "uid": "", "cmd": CMD, "exp": 30, "try": 4,
        "dat": base64.b64encode(data).decode(), "src": 0, "dst": [to],
        "ret": str(uuid.uuid4()), "shm": "", "now": int(time.time()), "err": "",
    }  # fmt: skip
    doc.update(fields)
    return doc


async def witness(url: str, until: float, out: Witness) -> None:
    """One call at a time, A -> B; every call must come back with its own payload."""
    client = redisconn.connect(url, redisconn.Role.BUS_CLIENT, block_s=30)
    try:
        n = 0
        while time.monotonic() < until:
            n += 1
            payload = f"witness {n}".encode()
            doc = _doc(B, payload)
            started = time.perf_counter()
            await client.rpush(keys.BUS_LOCAL, json.dumps(doc))
            popped = await client.blpop([doc["ret"]], timeout=30)
            elapsed = (time.perf_counter() - started) * 1000
            if popped is None:
                out.lost += 1
                out.problems.append(f"call {n}: no answer in 30 s")
                continue
            answer = json.loads(popped[1])
            if answer["err"] or base64.b64decode(answer["dat"]) != payload:
                out.lost += 1
                out.problems.append(f"call {n}: {answer['err'] or 'wrong payload'}")
                continue
            out.latencies_ms.append(elapsed)
            await asyncio.sleep(0.005)
    finally:
        await client.aclose()


def _junk() -> list[bytes]:
    """Messages no queue may choke on."""
    good = _doc(B)
    junk = [
        b"[" * 1024,
        b"[" * 100_000,
        b"{" * 50_000 + b'"ret":"x"',
        json.dumps(_doc(B, dat="A" * (MAX_SIZE + 1))).encode(),
        json.dumps(_doc(B, now=2**63)).encode(),
        json.dumps(_doc(B, exp=2**256)).encode(),
        json.dumps(_doc(B, dst=[2**64])).encode(),
        json.dumps(_doc(B, ret="abuse-hash")).encode(),
        json.dumps(_doc(B, ret=keys.BUS_LOCAL)).encode(),
        json.dumps(_doc(B, ret="abuse-" + "r" * 300)).encode(),
        json.dumps(_doc(9999, ret="abuse-ms", now=int(time.time() * 1000), exp=1)).encode(),
        b"\xff\xfe\x00garbage",
        b'{"ver":1,"cmd":"a","dst":[1],"ret":"abuse-digits","now":' + b"9" * 5000 + b"}",
    ]
    for name in good:
        for wrong in (None, True, 1.5, "1", [], {}, -1, 2**64):
            junk.append(json.dumps({**_doc(B, ret=f"abuse-{name}"), name: wrong}).encode())
    return junk


#: Moves made by all abusers in the current run.
MOVES = [0]


async def _every(until: float, move: Callable[[int], Awaitable[None]]) -> None:
    n = 0
    while time.monotonic() < until:
        await move(n)
        n += 1
        MOVES[0] += 1
        await asyncio.sleep(PAUSE_S)


async def local_abuse(url: str, until: float) -> None:
    client = redisconn.connect(url, redisconn.Role.CLI)
    junk = _junk()
    await client.hset("abuse-hash", "k", "v")

    async def move(n: int) -> None:
        await client.rpush(keys.BUS_LOCAL, junk[n % len(junk)])
        if n % 50 == 0:  # answers on the abusers' own rets: keep Redis flat
            stale = [k async for k in client.scan_iter(match="abuse-*", count=1000)]
            stale = [k for k in stale if k != b"abuse-hash"]
            if stale:
                await client.delete(*stale)

    try:
        await _every(until, move)
    finally:
        await client.aclose()


async def reply_abuse(url: str, until: float) -> None:
    client = redisconn.connect(url, redisconn.Role.CLI)
    junk = _junk()

    async def move(n: int) -> None:
        await client.rpush(keys.BUS_REPLY, junk[n % len(junk)])

    try:
        await _every(until, move)
    finally:
        await client.aclose()


async def flood_unknown(url: str, until: float) -> None:
    client = redisconn.connect(url, redisconn.Role.BUS_CLIENT, block_s=10)

    async def move(n: int) -> None:
        docs = [_doc(9999) for _ in range(20)]
        await client.rpush(keys.BUS_LOCAL, *[json.dumps(d) for d in docs])
        for d in docs:
            await client.blpop([d["ret"]], timeout=10)

    try:
        await _every(until, move)
    finally:
        await client.aclose()


async def http_abuse(port: int, signer: Signer, until: float) -> None:
    url = f"http://127.0.0.1:{port}/zbus-remote"
    captured_body = json.dumps(_doc(B, uid=f"{B}.{10**12}", src=A, now=0, exp=1)).encode()
    now_ms = int(time.time() * 1000)
    captured = {
        TWIN_HEADER: str(A),
        TIME_HEADER: str(now_ms),
        SIGNATURE_HEADER: signer.sign_post(
            src=A, dst=B, path="/zbus-remote", sent_ms=now_ms, body=captured_body
        ),
    }
    forger = Signer.generate()

    def signed(
        body: bytes, *, skew_ms: int = 0, to: int = B, key: Signer = signer
    ) -> dict[str, str]:
        ms = int(time.time() * 1000) + skew_ms
        sig = key.sign_post(src=A, dst=to, path="/zbus-remote", sent_ms=ms, body=body)
        return {TWIN_HEADER: str(A), TIME_HEADER: str(ms), SIGNATURE_HEADER: sig}

    async with aiohttp.ClientSession() as session:

        async def move(n: int) -> None:
            body = json.dumps(_doc(B, uid=f"{B}.{n + 10**9}", src=A, cmd="abuse.none")).encode()
            bombs = b"\n".join([b"[" * 1000] * 300 + [body])
            attempts: list[tuple[bytes, dict[str, str]]] = [
                (captured_body, captured),  # replay of a captured POST
                (body, {TWIN_HEADER: str(A)}),  # unsigned
                (body, signed(body, key=forger)),  # forged
                (body, signed(body, skew_ms=-3_600_000)),  # stale
                (body, signed(body, to=A)),  # signed for another twin
                (b"[" * 100_000, signed(b"[" * 100_000)),  # a bomb, signed
                (b"{nope", signed(b"{nope")),
                (bombs, {**signed(bombs), "Content-Type": BATCH_TYPE}),  # a signed batch of bombs
            ]
            if n % 25 == 0:
                big = b"x" * (MAX_SIZE + 8192)
                attempts.append((big, signed(big)))
            body, headers = attempts[n % len(attempts)]
            try:
                # a file object: aiohttp warns (ResourceWarning) on a raw body over 1 MiB
                async with session.post(url, data=io.BytesIO(body), headers=headers) as resp:
                    await resp.read()
            except aiohttp.ClientError:
                pass  # the bus may cut an oversized body short

        await _every(until, move)


async def idle_connections(port: int, until: float) -> None:
    """Connections that send half a request head and then nothing."""
    writers: list[asyncio.StreamWriter] = []
    try:
        for _ in range(IDLE_CONNECTIONS):
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                continue
            writer.write(b"POST /zbus-remote HTTP/1.1\r\nHost: x\r\n")
            writers.append(writer)
        await asyncio.sleep(max(0.0, until - time.monotonic()))
    finally:
        for writer in writers:
            writer.close()


async def sample_until(samples: list[Sample], until: float) -> None:
    while time.monotonic() < until:
        for sample in samples:
            sample.poll()
        await asyncio.sleep(0.2)


async def abuse(
    a_url: str, b_url: str, b_port: int, signer: Signer, samples: list[Sample], duration_s: float
) -> tuple[Witness, Witness]:
    calm = Witness()
    await witness(a_url, time.monotonic() + min(3.0, duration_s / 5), calm)
    for sample in samples:
        sample.baseline()
    loaded = Witness()
    until = time.monotonic() + duration_s
    await asyncio.gather(
        witness(a_url, until, loaded),
        local_abuse(a_url, until),
        reply_abuse(b_url, until),
        flood_unknown(a_url, until),
        http_abuse(b_port, signer, until),
        idle_connections(b_port, until),
        sample_until(samples, until),
    )
    return calm, loaded


def _spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "SLUICE_LOG_LEVEL": "ERROR"}
    env.pop("PYTHONASYNCIODEBUG", None)
    with open(log, "ab") as err:
        return subprocess.Popen(
            [sys.executable, *args], stdout=subprocess.PIPE, stderr=err, cwd=ROOT, env=env
        )


def _wait_line(proc: subprocess.Popen[bytes], word: bytes, log: Path) -> None:
    assert proc.stdout is not None
    if word not in proc.stdout.readline():
        raise RuntimeError(f"child did not start: {log.read_text()[-2000:]}")


async def _settle(samples: list[Sample], seconds: float) -> list[tuple[int, int]]:
    """RSS and fds after the abuse, once they stop falling (at most ``seconds``)."""
    deadline = time.monotonic() + seconds
    last = [s.read() for s in samples]
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        now = [s.read() for s in samples]
        if all(n[1] <= s.base_fds for n, s in zip(now, samples, strict=True)):
            return now
        last = now
    return last


def run(duration_s: float) -> list[dict[str, Any]]:
    """Run the abuse mix for ``duration_s`` seconds; the figures as :class:`common.Report` rows."""
    report = Report("abuse_bus")
    MOVES[0] = 0
    with tempfile.TemporaryDirectory(prefix="abuse-bus-") as tmp:
        work = Path(tmp)
        redises = [LocalRedis(work / f"redis-{n}").start() for n in ("a", "b")]
        procs: list[subprocess.Popen[bytes]] = []
        try:
            ports = {A: free_port(), B: free_port()}
            signers = {A: Signer.generate(), B: Signer.generate()}
            directory = work / "twins.json"
            directory.write_text(
                json.dumps(
                    {
                        str(t): {
                            "url": f"http://127.0.0.1:{ports[t]}",
                            "key": signers[t].public_key,
                        }
                        for t in (A, B)
                    }
                )
            )
            for twin, server in zip((A, B), redises, strict=True):
                key = work / f"{twin}.key"
                signers[twin].write(key)
                log = work / f"bus-{twin}.log"
                proc = _spawn(
                    [
                        "-m",
                        "pipeline.cli",
                        "bus",
                        "--twin",
                        str(twin),
                        "--listen",
                        f"127.0.0.1:{ports[twin]}",
                        "--directory",
                        str(directory),
                        "--key",
                        str(key),
                        "--redis",
                        server.url,
                    ],  # fmt: skip
                    log,
                )
                procs.append(proc)
                _wait_line(proc, b"listening", log)
            log = work / "handler.log"
            handler = _spawn([str(HERE / "bench_bus.py"), "--handler", redises[1].url], log)
            procs.append(handler)
            _wait_line(handler, b"ready", log)
            samples = [Sample(procs[0].pid), Sample(procs[1].pid)]
            calm, loaded = asyncio.run(
                abuse(redises[0].url, redises[1].url, ports[B], signers[A], samples, duration_s)
            )
            after = asyncio.run(_settle(samples, 10.0))
            alive = [p.poll() is None for p in procs[:2]]
            dead_letters = []
            for server in redises:
                client = redisconn.connect_sync(server.url, redisconn.Role.CLI)
                dead_letters.append(int(client.llen(keys.bus_dead())))  # type: ignore[arg-type]
                client.close()
            tracebacks = sum((work / f"bus-{t}.log").read_text().count("Traceback") for t in (A, B))
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
                if proc.stdout is not None:
                    proc.stdout.close()
            for server in redises:
                server.stop()
    extra = {"duration_s": duration_s, "calls": len(loaded.latencies_ms), "abuse": MOVES[0]}
    report.emit("witness_p50_ms", percentile(loaded.latencies_ms, 50),
                percentile(calm.latencies_ms, 50), **extra)  # fmt: skip
    report.emit("witness_p99_ms", percentile(loaded.latencies_ms, 99),
                percentile(calm.latencies_ms, 99), **extra)  # fmt: skip
    report.emit("witness_max_ms", max(loaded.latencies_ms, default=float("nan")),
                max(calm.latencies_ms, default=float("nan")), **extra)  # fmt: skip
    report.emit("witness_lost", loaded.lost + calm.lost, problems=loaded.problems[:5])
    report.emit("dead_letters", sum(dead_letters), per_bus=dead_letters)
    report.emit("bus_tracebacks", tracebacks)
    for name, sample, (rss, fds), up in zip(("bus-a", "bus-b"), samples, after, alive, strict=True):
        report.emit(f"{name}_alive", float(up))
        report.emit(f"{name}_rss_high_mb", sample.high_rss / 2**20, sample.base_rss / 2**20)
        report.emit(f"{name}_rss_after_mb", rss / 2**20, sample.base_rss / 2**20)
        report.emit(f"{name}_fds_high", sample.high_fds, sample.base_fds)
        report.emit(f"{name}_fds_after", fds, sample.base_fds)
    return report.rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration", type=float, default=60.0)
    args = parser.parse_args()
    rows = run(args.duration)
    report = Report("abuse_bus")
    report.rows = rows
    report.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
