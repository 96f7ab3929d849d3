"""Benchmark of the reliable message bus: calls between two twins on loopback.

Two ``sluice bus`` processes (twins 1001 and 1002, each with its own
redis-server) and one handler process (the SDK ``BusServer``) on twin 1002's
Redis. A client on twin 1001 makes CALLS calls at CONCURRENCY, the seed's way:
RPUSH the envelope to ``msgbus.system.local``, BLPOP its ``ret``.

Figures: calls/s, p50 and p99 at CONCURRENCY (default 100), then p50 and
p99 of SERIAL_CALLS calls made one at a time (concurrency 1).

Baseline, same run: the same handler answering through one Redis with no bus
(the client RPUSHes to ``msgbus.$cmd``, the handler BLPOPs it and RPUSHes the
answer to ``ret``).

Floor, same run: the same client and handler through two bare Python forwarders
(:mod:`bus_floor`: the bus's topology and stack with none of its checks, signatures
or durable state), on Redis servers of their own: ``calls_per_s_vs_floor`` and
``p99_ms_vs_floor`` (what the bus's reliability and security cost above the price
of the shape itself in CPython).

Second baseline, same run: NATS core request-reply at the same concurrency
(a real ``nats-server``, one responder process that decodes the envelope and
answers it, the client's ``request()`` on one connection, nats-py). Bench only:
``make bench`` builds nats-server into ``~/.cache/sluice-nats/<version>`` and
installs nats-py (``scripts/ensure-nats.sh``); without them the NATS figure is
skipped with a line saying why. ``# cpu/call`` lines give each process's CPU
per call in each phase at CONCURRENCY.

    .venv/bin/python tests/bench/bench_bus.py [--calls N] [--concurrency C] [--serial-calls N]
        [--trace N]   # then N lone calls under MONITOR: median time of each Redis hop
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import redis.asyncio as aioredis  # noqa: E402
from common import Report, percentile  # noqa: E402

from pipeline.bus.envelope import Envelope  # noqa: E402
from pipeline.bus.server import BusServer  # noqa: E402
from pipeline.bus.signing import Signer  # noqa: E402
from pipeline.local.redisserver import LocalRedis  # noqa: E402
from pipeline.runtime.loops import loop_factory  # noqa: E402
from pipeline.runtime.ports import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CMD = "bench.echo"
A, B = 1001, 1002
NATS_VERSION = "v2.15.2"  # scripts/ensure-nats.sh builds it
NATS_SERVER = (
    Path(os.environ.get("BENCH_NATS_CACHE", Path.home() / ".cache" / "sluice-nats"))
    / NATS_VERSION
    / "nats-server"
)


async def run_handler(url: str, direct: bool) -> None:
    server = BusServer.from_url(url, workers=4, batch=64, direct=direct)

    @server.handler(CMD)
    async def echo(data: bytes, request: Envelope) -> bytes:
        return data

    try:
        await server.serve()
    finally:
        await server.close()


async def run_nats_handler(url: str) -> None:
    """Answer CMD over NATS the way the bus handler does: decode, swap, encode."""
    import nats

    nc = await nats.connect(url)

    async def echo(msg: Any) -> None:
        request = json.loads(msg.data)
        request["src"], request["dst"] = request["dst"][0], [request["src"]]
        request["now"] = int(time.time())
        await msg.respond(json.dumps(request, separators=(",", ":")).encode())

    await nc.subscribe(CMD, queue="echo", cb=echo)
    await nc.flush()
    print("handler ready", flush=True)
    await asyncio.Event().wait()


async def nats_load(url: str, calls: int, concurrency: int) -> tuple[float, list[float]]:
    """NATS core request-reply: ``calls`` requests at ``concurrency`` on one connection."""
    import nats

    nc = await nats.connect(url)
    latencies: list[float] = []
    counter = iter(range(calls))
    payload = base64.b64encode(b"x" * 64).decode()

    async def worker() -> None:
        for _ in counter:
            doc = {
                "ver": 1, "uid": "", "cmd": CMD, "exp": 60, "try": 4, "dat": payload,
                "src": A, "dst": [B], "ret": "", "shm": "", "now": int(time.time()), "err": "",
            }  # fmt: skip
            started = time.perf_counter()
            msg = await nc.request(CMD, json.dumps(doc).encode(), timeout=30)
            answer = json.loads(msg.data)
            if answer["err"] or answer["dat"] != payload:
                raise RuntimeError(f"bad answer: {answer}")
            latencies.append((time.perf_counter() - started) * 1000)

    try:
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    finally:
        await nc.close()
    return elapsed, latencies


def nats_missing() -> str:
    """Why the NATS baseline cannot run here ("" when it can)."""
    if not NATS_SERVER.is_file():
        return f"no {NATS_SERVER} (make bench builds it: scripts/ensure-nats.sh)"
    try:
        import nats  # noqa: F401
    except ImportError:
        return "nats-py is not installed (pip install -e '.[bench]')"
    return ""


def run(coro: Any) -> Any:
    """Run on the same event loop kind as ``sluice bus`` (uvloop when installed), for both paths."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(coro)


def spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "SLUICE_LOG_LEVEL": "WARNING"}
    env.pop("PYTHONASYNCIODEBUG", None)
    with open(log, "ab") as err:
        return subprocess.Popen(
            [sys.executable, *args], stdout=subprocess.PIPE, stderr=err, cwd=ROOT, env=env
        )


def wait_line(proc: subprocess.Popen[bytes], word: bytes, log: Path) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if word not in line:
        raise RuntimeError(f"child did not start: {log.read_text()[-2000:]}")


async def load(
    url: str, queue: str, dst: int, calls: int, concurrency: int
) -> tuple[float, list[float]]:
    """Run ``calls`` request/answer round trips at ``concurrency``; (seconds, latencies ms).

    Each worker has its own connection (as a caller process would), so the
    client's cost per call is the two commands, not a pool's bookkeeping; the
    same for the baseline and the bus.
    """
    clients = [
        aioredis.Redis.from_url(url, single_connection_client=True) for _ in range(concurrency)
    ]
    latencies: list[float] = []
    counter = iter(range(calls))
    payload = base64.b64encode(b"x" * 64).decode()

    async def worker(client: aioredis.Redis) -> None:
        for _ in counter:
            ret = os.urandom(16).hex()
            doc = {
                "ver": 1, "uid": "", "cmd": CMD, "exp": 60, "try": 4, "dat": payload,
                "src": 0, "dst": [dst], "ret": ret, "shm": "", "now": int(time.time()), "err": "",
            }  # fmt: skip
            started = time.perf_counter()
            await client.rpush(queue, json.dumps(doc))
            popped = await client.blpop([ret], timeout=30)
            if popped is None:
                raise RuntimeError("no answer in 30 s")
            answer = json.loads(popped[1])
            if answer["err"] or answer["dat"] != payload:
                raise RuntimeError(f"bad answer: {answer}")
            latencies.append((time.perf_counter() - started) * 1000)

    try:
        for client in clients:
            await client.ping()  # connect before the clock starts
        started = time.perf_counter()
        await asyncio.gather(*(worker(client) for client in clients))
        elapsed = time.perf_counter() - started
    finally:
        for client in clients:
            await client.aclose()
    return elapsed, latencies


async def trace_hops(urls: dict[str, str], queue: str, dst: int, calls: int) -> None:
    """``calls`` lone calls under Redis MONITOR on each Redis: print each command's median
    time since the call began (server clock), i.e. where a lone call's time goes, hop by hop.

    A command counts when it shows up in at least half of the calls at the same position.
    """
    seen: list[tuple[float, str, str]] = []
    watchers = [aioredis.Redis.from_url(url) for url in urls.values()]

    async def watch(name: str, client: aioredis.Redis) -> None:
        async with client.monitor() as monitor:
            while True:
                command = await monitor.next_command()
                seen.append((command["time"], name, command["command"][:70]))

    tasks = [asyncio.create_task(watch(n, c)) for n, c in zip(urls, watchers, strict=True)]
    caller = aioredis.Redis.from_url(urls[next(iter(urls))], single_connection_client=True)
    spans: list[tuple[float, float]] = []
    try:
        await asyncio.sleep(0.2)
        for _ in range(calls):
            ret = os.urandom(16).hex()
            doc = {
                "ver": 1, "uid": "", "cmd": CMD, "exp": 60, "try": 4, "dat": "", "src": 0,
                "dst": [dst], "ret": ret, "shm": "", "now": int(time.time()), "err": "",
            }  # fmt: skip
            started = time.time()
            await caller.rpush(queue, json.dumps(doc))
            await caller.blpop([ret], timeout=30)
            spans.append((started, time.time()))
            await asyncio.sleep(0.01)  # the call alone: the previous one's tail is over
        await asyncio.sleep(0.2)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for client in (caller, *watchers):
            await client.aclose()
    seen.sort()
    at: dict[tuple[int, str, str], list[float]] = {}
    for started, ended in spans:
        hops = [e for e in seen if started <= e[0] <= ended]
        for i, (when, name, command) in enumerate(hops):
            at.setdefault((i, name, command.split(" ")[0]), []).append((when - started) * 1000)
    totals = sorted((end - start) * 1000 for start, end in spans)
    print(f"# trace: {calls} lone calls, p50 {percentile(totals, 50):.3f} ms", file=sys.stderr)
    for (_, name, command), times in sorted(at.items(), key=lambda kv: kv[0][0]):
        if len(times) >= calls / 2:
            print(
                f"# trace: {percentile(times, 50):7.3f} ms  redis-{name} {command}", file=sys.stderr
            )


async def print_commandstats(urls: dict[str, str]) -> None:
    for name, url in urls.items():
        client = aioredis.Redis.from_url(url)
        try:
            stats = await client.info("commandstats")
        finally:
            await client.aclose()
        calls = {k.removeprefix("cmdstat_"): v["calls"] for k, v in stats.items()}
        print(
            f"# redis-{name} commands: {sorted(calls.items(), key=lambda kv: -kv[1])}",
            file=sys.stderr,
        )
        # server time inside each command (a script's includes the commands it runs)
        usec = {k.removeprefix("cmdstat_"): v["usec"] for k, v in stats.items()}
        print(
            f"# redis-{name} usec in commands: {sorted(usec.items(), key=lambda kv: -kv[1])[:8]}",
            file=sys.stderr,
        )


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a running process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_port(port: int, wait_s: float = 10.0) -> None:
    """Until something accepts TCP connections on 127.0.0.1:``port`` (a hang bound only)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@contextlib.contextmanager
def cpu_per_call(pids: dict[str, int], calls: int, phase: str) -> Iterator[None]:
    """Print each process's CPU per call (us) over the block, the client (this process) too."""
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    mine = sum(os.times()[:2])
    yield
    used = {name: cpu_seconds(pid) - before[name] for name, pid in pids.items()}
    used["client"] = sum(os.times()[:2]) - mine
    parts = " ".join(f"{name} {s / calls * 1e6:.0f}" for name, s in used.items() if s > 0)
    total = sum(used.values()) / calls * 1e6
    print(f"# cpu/call us, {phase}: total {total:.0f}: {parts}", file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--serial-calls", type=int, default=1000, help="calls at concurrency 1")
    parser.add_argument(
        "--trace", type=int, default=0, help="then N lone calls traced hop by hop (MONITOR)"
    )
    parser.add_argument("--handler", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--direct", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--nats-handler", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.nats_handler:
        run(run_nats_handler(args.nats_handler))
        return 0
    if args.handler:
        print("handler ready", flush=True)
        run(run_handler(args.handler, args.direct))
        return 0

    report = Report("bus")
    with tempfile.TemporaryDirectory(prefix="bench-bus-") as tmp:
        work = Path(tmp)
        redises = [
            LocalRedis(work / f"redis-{name}").start()
            for name in ("a", "b", "raw", "floor-a", "floor-b")
        ]
        procs: list[subprocess.Popen[bytes]] = []
        try:
            ra, rb, rraw, rfa, rfb = redises
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
            for twin, redis_server in ((A, ra), (B, rb)):
                key = work / f"{twin}.key"
                signers[twin].write(key)
                log = work / f"bus-{twin}.log"
                profile = (
                    ["-m", "cProfile", "-o", f"/tmp/prof-{twin}"]
                    if os.environ.get("BENCH_PROFILE")
                    else []
                )
                proc = spawn(
                    [
                        *profile,
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
                        redis_server.url,
                    ],  # fmt: skip
                    log,
                )
                procs.append(proc)
                wait_line(proc, b"listening", log)
            floor_ports = (free_port(), free_port())
            for side, redis_server, port, peer in (
                ("a", rfa, floor_ports[0], floor_ports[1]),
                ("b", rfb, floor_ports[1], floor_ports[0]),
            ):
                log = work / f"floor-{side}.log"
                floor_args = [side, redis_server.url, str(port), f"http://127.0.0.1:{peer}"]
                proc = spawn([str(Path(__file__).parent / "bus_floor.py"), *floor_args], log)
                procs.append(proc)
                wait_line(proc, b"ready", log)
            for url, direct in ((rb.url, False), (rraw.url, True), (rfb.url, False)):
                log = work / "handler.log"
                extra = ["--direct"] if direct else []
                proc = spawn([__file__, "--handler", url, *extra], log)
                procs.append(proc)
                wait_line(proc, b"ready", log)

            nats_url, why_not = "", nats_missing()
            if not why_not:
                nats_port = free_port()
                nats_url = f"nats://127.0.0.1:{nats_port}"
                with open(work / "nats.log", "ab") as err:
                    procs.append(
                        subprocess.Popen(
                            [str(NATS_SERVER), "-a", "127.0.0.1", "-p", str(nats_port)],
                            stdout=err,
                            stderr=err,
                        )
                    )
                wait_port(nats_port)
                log = work / "nats-handler.log"
                proc = spawn([__file__, "--nats-handler", nats_url], log)
                procs.append(proc)
                wait_line(proc, b"ready", log)
            names = ["bus-1001", "bus-1002", "floor-a", "floor-b"]
            names += ["handler-bus", "handler-raw", "handler-floor"]
            if nats_url:
                names += ["nats-server", "handler-nats"]
            pids = {
                **dict(zip(names, [p.pid for p in procs], strict=True)),
                **{
                    f"redis-{n}": r.proc.pid
                    for n, r in zip(("a", "b", "r", "fa", "fb"), redises, strict=True)
                    if r.proc
                },
            }

            # warm up every path, then measure the baseline, the bus, NATS
            run(load(rraw.url, f"msgbus.{CMD}", B, 1000, args.concurrency))
            run(load(ra.url, "msgbus.system.local", B, 1000, args.concurrency))
            run(load(rfa.url, "msgbus.system.local", B, 1000, args.concurrency))
            if nats_url:
                run(nats_load(nats_url, 1000, args.concurrency))
            with cpu_per_call(pids, args.calls, "direct"):
                base_s, base_lat = run(
                    load(rraw.url, f"msgbus.{CMD}", B, args.calls, args.concurrency)
                )
            print("# measuring the bus", file=sys.stderr, flush=True)  # profilers attach now
            with cpu_per_call(pids, args.calls, "bus"):
                bus_s, bus_lat = run(
                    load(ra.url, "msgbus.system.local", B, args.calls, args.concurrency)
                )
            with cpu_per_call(pids, args.calls, "floor"):
                floor_s, floor_lat = run(
                    load(rfa.url, "msgbus.system.local", B, args.calls, args.concurrency)
                )
            if nats_url:
                with cpu_per_call(pids, args.calls, "nats"):
                    nats_s, nats_lat = run(nats_load(nats_url, args.calls, args.concurrency))
            # one call at a time: the latency of a lone call (no batching to hide behind)
            one_base_s, one_base = run(load(rraw.url, f"msgbus.{CMD}", B, args.serial_calls, 1))
            one_bus_s, one_bus = run(load(ra.url, "msgbus.system.local", B, args.serial_calls, 1))
            one = {"calls": args.serial_calls, "concurrency": 1}
            report.emit("p50_ms", percentile(one_bus, 50), percentile(one_base, 50), **one)
            report.emit("p99_ms", percentile(one_bus, 99), percentile(one_base, 99), **one)
            extra = {"calls": args.calls, "concurrency": args.concurrency}
            report.emit("calls_per_s", args.calls / bus_s, args.calls / base_s, **extra)
            report.emit("p50_ms", percentile(bus_lat, 50), percentile(base_lat, 50), **extra)
            report.emit("p99_ms", percentile(bus_lat, 99), percentile(base_lat, 99), **extra)
            vs_floor = {**extra, "baseline_is": "floor"}
            report.emit(
                "calls_per_s_vs_floor", args.calls / bus_s, args.calls / floor_s, **vs_floor
            )
            report.emit(
                "p99_ms_vs_floor", percentile(bus_lat, 99), percentile(floor_lat, 99), **vs_floor
            )
            if nats_url:
                # baseline: NATS core request-reply in the same run
                vs_nats = {**extra, "baseline_is": "nats"}
                report.emit(
                    "calls_per_s_vs_nats", args.calls / bus_s, args.calls / nats_s, **vs_nats
                )
                report.emit(
                    "p99_ms_vs_nats", percentile(bus_lat, 99), percentile(nats_lat, 99), **vs_nats
                )
            else:
                print(f"# nats baseline skipped: {why_not}", file=sys.stderr)
            for name, pid in pids.items():
                print(f"# cpu {name}: {cpu_seconds(pid):.1f} s", file=sys.stderr)
            print(f"# cpu client (this process): {sum(os.times()[:2]):.1f} s", file=sys.stderr)
            # the buses, handlers and this client run on the same loop kind (cli.loop_factory)
            loop = "uvloop" if loop_factory() is not None else "asyncio (uvloop not installed)"
            print(f"# event loop: {loop}", file=sys.stderr)
            print(f"# load: {Path('/proc/loadavg').read_text().strip()}", file=sys.stderr)
            if args.trace:
                urls = {"a": ra.url, "b": rb.url}
                run(trace_hops(urls, "msgbus.system.local", B, args.trace))
            if os.environ.get("BENCH_STATS"):  # Redis commands per call, to see where trips go
                run(print_commandstats({n: r.url for n, r in zip("abr", redises[:3], strict=True)}))
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
            for redis_server in redises:
                redis_server.stop()
    report.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
