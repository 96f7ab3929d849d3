"""Redis beyond one server: Sentinel and Cluster against one server, in the same run.

Starts a private single redis-server, a master + replica + 3 Sentinels and a 3+3
Redis Cluster (tests/support/redisha.py; failure detection 1 s), then:

* ``oneway_msgs_per_s_<layout>``: N routed messages of 256 B from a publisher on
  node A through a stream to a worker on node B (both on one event loop, as
  ``make bench B=streams``'s ``oneway_msgs_per_s_one_process``). Baseline: the
  same on the single server. The layouts take turns, ``BENCH_HA_ROUNDS`` rounds
  (default 3), and each figure is the median of its rounds (``runs`` lists them):
  one run of each on this shared 2-core machine swung by 2x with the load.
* ``oneway_cpu_us_per_msg_<layout>``: this process's CPU seconds per message of the
  same runs (median), against the single server's: what the client costs, which
  other processes' load does not move much.
* ``oneway_msgs_per_s_<layout>_wait1``: the same with ``SLUICE_REDIS_MIN_REPLICAS=1``
  (every push followed by WAIT 1 on its connection). Baseline: WAIT off, same layout.
* ``push_p50_ms`` / ``push_p99_ms`` ``_<layout>[_wait1]``: one push at a time through
  the stream service (the script, plus WAIT when on). Baseline: the single server
  (or WAIT off).
* ``bus_calls_per_s_sentinel``: bus calls at concurrency 50 from a twin to itself
  (client RPUSH, the bus's loops, an SDK handler, BLPOP of ``ret``). Baseline: the
  same twin on the single server. (The bus refuses a cluster.)
* ``first_write_after_kill_s_<layout>``: SIGKILL of the master owning a stream key,
  then an XADD every 10 ms through the factory's client until one succeeds: the
  seconds from the kill to that write, with 1 s failure detection (the tests') and
  ``..._defaults`` with Redis' own (Sentinel ``down-after-milliseconds`` 30 s,
  ``cluster-node-timeout`` 15 s; BENCH_HA_DEFAULTS=0 skips those, about a minute).

    .venv/bin/python tests/bench/bench_ha.py     (BENCH_HA_N: messages, default 20000)
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from common import Report, percentile  # noqa: E402

from pipeline import keys  # noqa: E402
from pipeline.bus.client import BusClient  # noqa: E402
from pipeline.bus.config import BusConfig  # noqa: E402
from pipeline.bus.directory import FileDirectory  # noqa: E402
from pipeline.bus.envelope import Envelope  # noqa: E402
from pipeline.bus.process import BusProcess  # noqa: E402
from pipeline.bus.server import BusServer  # noqa: E402
from pipeline.local.redisserver import LocalRedis  # noqa: E402
from pipeline.redisio import conn as redisconn  # noqa: E402
from pipeline.redisio.durability import Durability  # noqa: E402
from pipeline.routing.message import Route  # noqa: E402
from pipeline.runtime.ports import free_port  # noqa: E402
from pipeline.streams import protocol as p  # noqa: E402
from pipeline.streams.service import StreamService  # noqa: E402
from pipeline.streams.serviceredis import connect  # noqa: E402
from tests.support.redisha import LocalCluster, LocalSentinels  # noqa: E402

N = int(os.environ.get("BENCH_HA_N", "20000"))
ROUNDS = int(os.environ.get("BENCH_HA_ROUNDS", "3"))
PUSHES = int(os.environ.get("BENCH_HA_PUSHES", "2000"))
CALLS = int(os.environ.get("BENCH_HA_CALLS", "5000"))
CONCURRENCY = 50
PAYLOAD = b"x" * 256


async def oneway(url: str, durability: Durability) -> tuple[float, float]:
    """Messages/s of one run, and this process's CPU microseconds per message."""
    from bench_streams import sluice_oneway  # the streams benchmark's one-process loop

    stream = f"bench_ha_{time.monotonic_ns()}"  # fresh streams: each layout runs many times
    cpu = time.process_time()
    rate = await sluice_oneway(url, N, durability=durability, streams=(f"{stream}_a", stream))
    return rate, (time.process_time() - cpu) / N * 1e6


async def oneway_rounds(urls: dict[str, str]) -> dict[str, list[tuple[float, float]]]:
    """``ROUNDS`` runs of each of ``urls`` (WAIT off, and WAIT 1 for all but ``single``),
    taking turns so that a burst of load falls on every layout alike."""
    off, wait1 = Durability(), Durability(1, 1000)
    runs: dict[str, list[tuple[float, float]]] = {}
    for _ in range(ROUNDS):
        for name, url in urls.items():
            runs.setdefault(name, []).append(await oneway(url, off))
            if name != "single":
                runs.setdefault(f"{name}_wait1", []).append(await oneway(url, wait1))
    return runs


def median(values: list[float]) -> float:
    return percentile(values, 50)


async def push_latencies(url: str, durability: Durability) -> list[float]:
    redis = connect(url)
    service = StreamService(redis, durability=durability)
    samples = []
    try:
        for i in range(PUSHES):
            push = (Route(), "bench_ha_push", p.Push(request_id=f"r{i}", data=(PAYLOAD,)))
            start = time.perf_counter()
            [reply] = await service._push_replies([push])
            samples.append((time.perf_counter() - start) * 1000)
            if not isinstance(reply, p.PushConfirm):
                raise RuntimeError(f"push failed: {reply}")
    finally:
        await service.teardown()
        await redis.aclose()
    return samples


async def bus_calls(url: str, tmp: Path) -> float:
    twin = 1001
    directory_file = tmp / f"twins-{time.monotonic_ns()}.json"
    directory_file.write_text(f'{{"{twin}": {{"url": "http://127.0.0.1:1", "key": ""}}}}')
    config = BusConfig(twin=twin, listen=f"127.0.0.1:{free_port()}", legacy_peers=True)
    bus = BusProcess(
        config, redis_url=url, directory=FileDirectory.load(directory_file), signer=None
    )
    await bus.start()
    server = BusServer.from_url(url, workers=8)

    @server.handler("bench.echo")
    async def echo(data: bytes, request: Envelope) -> bytes:
        return data

    serving = asyncio.create_task(server.serve())
    client = BusClient.from_url(url, max_connections=CONCURRENCY + 8)
    left = CALLS

    async def caller() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await client.call("bench.echo", dst=[twin], data=b"x", exp=60)

    try:
        start = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(CONCURRENCY)))
        elapsed = time.perf_counter() - start
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        await client.close()
        await server.close()
        await bus.stop()
    return CALLS / elapsed


async def first_write_after_kill(url: str, group: Any, *, heal: bool = True) -> float:
    key = keys.stream("bench_ha_kill")
    client = redisconn.connect(url, redisconn.Role.PRODUCER)
    try:
        await client.xadd(key, {"data": b"before"})
        killed = time.perf_counter()
        dead = group.kill_master(key) if isinstance(group, LocalCluster) else group.kill_master()
        while True:
            try:
                await client.xadd(key, {"data": b"after"})
                break
            except redisconn.UNAVAILABLE:
                await asyncio.sleep(0.01)
        took = time.perf_counter() - killed
    finally:
        await client.aclose()
    if heal:
        await asyncio.to_thread(group.heal)
    _ = dead
    return took


async def main() -> None:
    report = Report("ha")
    with tempfile.TemporaryDirectory() as tmp_text:
        tmp = Path(tmp_text)
        single = LocalRedis(tmp / "single").start()
        sentinels = LocalSentinels(tmp / "sentinel").start()
        cluster = LocalCluster(tmp / "cluster").start()
        layouts = {"sentinel": sentinels, "cluster": cluster}
        off, wait1 = Durability(), Durability(1, 1000)
        try:
            urls = {"single": single.url} | {name: g.url for name, g in layouts.items()}
            runs = await oneway_rounds(urls)
            rate = {name: median([r for r, _ in found]) for name, found in runs.items()}
            cpu = {name: median([c for _, c in found]) for name, found in runs.items()}
            for name in layouts:
                for metric, base in ((name, "single"), (f"{name}_wait1", name)):
                    report.emit(
                        f"oneway_msgs_per_s_{metric}", rate[metric], rate[base], messages=N,
                        rounds=ROUNDS, runs=[round(r) for r, _ in runs[metric]],
                        baseline_runs=[round(r) for r, _ in runs[base]],
                    )  # fmt: skip
                report.emit(
                    f"oneway_cpu_us_per_msg_{name}", cpu[name], cpu["single"], messages=N,
                    rounds=ROUNDS, runs=[round(c, 1) for _, c in runs[name]],
                    baseline_runs=[round(c, 1) for _, c in runs["single"]],
                )  # fmt: skip
            base_samples = await push_latencies(single.url, off)
            for name, group in layouts.items():
                plain = await push_latencies(group.url, off)
                durable = await push_latencies(group.url, wait1)
                for q in (50, 99):
                    report.emit(
                        f"push_p{q}_ms_{name}",
                        percentile(plain, q),
                        percentile(base_samples, q),
                        samples=PUSHES,
                    )
                    report.emit(
                        f"push_p{q}_ms_{name}_wait1",
                        percentile(durable, q),
                        percentile(plain, q),
                        samples=PUSHES,
                    )
            base = await bus_calls(single.url, tmp)
            value = await bus_calls(sentinels.url, tmp)
            report.emit(
                "bus_calls_per_s_sentinel", value, base, calls=CALLS, concurrency=CONCURRENCY
            )
            for name, group in layouts.items():
                took = await first_write_after_kill(group.url, group)
                report.emit(f"first_write_after_kill_s_{name}", took, detection_ms=1000)
        finally:
            cluster.stop()
            sentinels.stop()
            single.stop()
        print(f"# load: {os.getloadavg()}", file=sys.stderr)
    report.save()


if __name__ == "__main__":
    asyncio.run(main())
