"""Streams benchmark: routed messages between two nodes through Redis Streams.

* ``oneway_msgs_per_s``: N routed messages of 256 B, a publisher worker on
  node A through a stream to a worker on node B (seed 000 bi-directional
  publisher / consumer), delivered per second, node B in its own process as
  two ``sluice node`` would run. Baseline: raw redis-py asyncio pipelined
  ``XADD`` of the same payloads, then ``XREAD`` of them all.
  ``oneway_msgs_per_s_one_process`` is the same with both nodes on one event
  loop (so one core does all the Python work of both sides).
* ``rtt_p50_ms`` / ``rtt_p99_ms``: request/response through the stream
  transport (seed 001) to an echo worker. Baseline: raw ping-pong over two
  streams with ``XREAD BLOCK``. Both sides on one event loop, so the figure is
  the Python work of both per round trip.
* ``rtt_p50_ms_two_processes``: the same with node B (the echo) in its own
  process, as two ``sluice node`` run; its baseline is the raw ping-pong with
  the ponging side in its own process too.

Run: ``.venv/bin/python tests/bench/bench_streams.py`` (own private redis-server).
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
from redis.asyncio import Redis  # noqa: E402

from pipeline.local.redisserver import LocalRedis  # noqa: E402
from pipeline.redisio.durability import Durability  # noqa: E402
from pipeline.routing.message import Route, StreamAddress, TransportMessage  # noqa: E402
from pipeline.routing.node import Context, Node, Worker  # noqa: E402
from pipeline.routing.workers import Echo  # noqa: E402
from pipeline.streams.bidirectional import ReturnRegistry, bidirectional_consumer  # noqa: E402
from pipeline.streams.service import StreamService  # noqa: E402
from pipeline.streams.serviceredis import connect, connect_hot  # noqa: E402
from pipeline.streams.transport import StreamTransport  # noqa: E402

N = int(os.environ.get("BENCH_STREAMS_N", "200000"))
RTT_N = int(os.environ.get("BENCH_STREAMS_RTT_N", "2000"))
PAYLOAD = b"x" * 256
CHUNK = 1000


class Counter(Worker):
    batch_size = 1000
    mailbox_size = 4096

    def __init__(self, target: int) -> None:
        self.count = 0
        self.target = target
        self.done = asyncio.Event()

    async def handle_batch(self, batch: list[Context]) -> None:
        self.count += len(batch)
        if self.count >= self.target:
            self.done.set()


class Waiter(Worker):
    def __init__(self) -> None:
        self.future: asyncio.Future[bytes] | None = None

    async def handle(self, ctx: Context) -> None:
        if self.future is not None and not self.future.done():
            self.future.set_result(ctx.payload)


async def make_node(
    name: str, url: str, durability: Durability | None = None
) -> tuple[Node, Redis, StreamTransport]:
    redis = connect(url)
    node = Node(name)
    transport = StreamTransport(lease_ttl_ms=10_000)
    node.register_transport(transport)
    service = StreamService(
        redis, max_payload=(1 << 20) + 65536, hot=connect_hot(url), durability=durability
    )
    await node.add_worker("stream_service", service)
    await node.start()
    return node, redis, transport


async def raw_oneway(url: str) -> float:
    redis = Redis.from_url(url)
    key = "bench:raw:oneway"
    await redis.delete(key)
    start = time.perf_counter()
    for base in range(0, N, CHUNK):
        async with redis.pipeline(transaction=False) as pipe:
            for _ in range(min(CHUNK, N - base)):
                pipe.xadd(key, {b"data": PAYLOAD})
            await pipe.execute()
    index = b"0-0"
    got = 0
    while got < N:
        found = await redis.xread({key: index}, count=CHUNK)
        entries = found[0][1]
        got += sum(1 for _, fields in entries if fields[b"data"])
        index = entries[-1][0]
    elapsed = time.perf_counter() - start
    await redis.delete(key)
    await redis.aclose()
    return N / elapsed


async def node_b_process(url: str, count: int) -> None:
    """Node B in its own process: consumer of bench_b and a counting sink."""
    node_b, redis_b, _ = await make_node("B", url)
    registry_b = ReturnRegistry(node_b, "bench_b")
    consumer = bidirectional_consumer(node_b, registry_b, client_id="B", holder="B")
    await node_b.add_worker("consumer:bench_b", consumer)
    sink = Counter(count)
    await node_b.add_worker("sink", sink)
    await asyncio.wait_for(consumer.ready.wait(), 30)
    await redis_b.rpush("bench:b:ready", 1)
    await asyncio.wait_for(sink.done.wait(), 600)
    await redis_b.rpush("bench:b:done", sink.count)
    await node_b.stop()
    await redis_b.aclose()


async def sluice_oneway_two_processes(url: str) -> float:
    """Node A here, node B in a child process (the way two ``sluice node`` run)."""
    redis = Redis.from_url(url)
    await redis.delete("bench:b:ready", "bench:b:done", "sluice:{bench_b}:stream")
    await redis.delete("sluice:{bench_b}:index", "sluice:{bench_b}:lease")
    child = await asyncio.create_subprocess_exec(sys.executable, __file__, "--node-b", url, str(N))
    try:
        if not await redis.blpop(["bench:b:ready"], timeout=60):
            raise RuntimeError("node B did not start")
        node_a, redis_a, _ = await make_node("A", url)
        registry_a = ReturnRegistry(node_a, "bench_a")
        await registry_a.ensure("bench_b", name="pub")
        route, ret = Route(["pub", "sink"]), Route(["src"])
        start = time.perf_counter()
        for _ in range(N):
            await node_a.deliver(TransportMessage(route, ret, PAYLOAD))
        done = await redis.blpop(["bench:b:done"], timeout=600)
        elapsed = time.perf_counter() - start
        if not done or int(done[1]) != N:
            raise RuntimeError(f"node B reported {done!r}")
        await node_a.stop()
        await redis_a.aclose()
        await asyncio.wait_for(child.wait(), 30)
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
        await redis.aclose()
    return N / elapsed


async def sluice_oneway(
    url: str,
    n: int = N,
    *,
    durability: Durability | None = None,
    streams: tuple[str, str] = ("bench_a", "bench_b"),
) -> float:
    """Messages/s of ``n`` routed messages from a publisher on node A through stream
    ``streams[1]`` to a counting worker on node B, both nodes on this event loop
    (``bench_ha`` runs it on Sentinel and Cluster URLs, with and without ``durability``)."""
    node_a, redis_a, _ = await make_node("A", url, durability)
    node_b, redis_b, _ = await make_node("B", url, durability)
    stream_a, stream_b = streams
    registry_b = ReturnRegistry(node_b, stream_b)
    consumer = bidirectional_consumer(node_b, registry_b, client_id="B", holder="B")
    await node_b.add_worker(f"consumer:{stream_b}", consumer)
    sink = Counter(n)
    await node_b.add_worker("sink", sink)
    registry_a = ReturnRegistry(node_a, stream_a)
    await registry_a.ensure(stream_b, name="pub")
    await asyncio.wait_for(consumer.ready.wait(), 30)
    route, ret = Route(["pub", "sink"]), Route(["src"])
    start = time.perf_counter()
    for _ in range(n):
        await node_a.deliver(TransportMessage(route, ret, PAYLOAD))
    await asyncio.wait_for(sink.done.wait(), 600)
    elapsed = time.perf_counter() - start
    for node, redis in ((node_a, redis_a), (node_b, redis_b)):
        await node.stop()
        await redis.aclose()
    return n / elapsed


async def raw_rtt(url: str) -> list[float]:
    client, client_read = Redis.from_url(url), Redis.from_url(url)
    server_read, server = Redis.from_url(url), Redis.from_url(url)
    ping, pong = "bench:raw:ping", "bench:raw:pong"
    await client.delete(ping, pong)
    stop = asyncio.Event()

    async def serve() -> None:
        index: bytes | str = "0-0"
        while not stop.is_set():
            found = await server_read.xread({ping: index}, count=100, block=200)
            for _, entries in found:
                for entry_id, fields in entries:
                    index = entry_id
                    await server.xadd(pong, {b"data": fields[b"data"]})

    task = asyncio.create_task(serve())
    await asyncio.sleep(0.05)
    index: bytes | str = "0-0"
    samples: list[float] = []
    for i in range(RTT_N + 100):
        start = time.perf_counter()
        await client.xadd(ping, {b"data": PAYLOAD})
        found = await client_read.xread({pong: index}, count=1, block=5000)
        index = found[0][1][-1][0]
        if i >= 100:
            samples.append((time.perf_counter() - start) * 1000)
    stop.set()
    await task
    for r in (client, client_read, server_read, server):
        await r.aclose()
    return samples


async def raw_pong_process(url: str) -> None:
    """The raw ping-pong's ponging side in its own process (until ``bench:pong:stop``)."""
    server_read, server = Redis.from_url(url), Redis.from_url(url)
    ping, pong = "bench:raw:ping", "bench:raw:pong"
    await server.rpush("bench:b:ready", 1)
    index: bytes | str = "0-0"
    while True:
        found = await server_read.xread({ping: index}, count=100, block=200)
        if not found and await server.exists("bench:pong:stop"):
            break  # checked only when idle: the same commands per ping as in one process
        for _, entries in found:
            for entry_id, fields in entries:
                index = entry_id
                await server.xadd(pong, {b"data": fields[b"data"]})
    for r in (server_read, server):
        await r.aclose()


async def echo_b_process(url: str) -> None:
    """Node B with the stream transport and an echo worker (until ``bench:pong:stop``)."""
    node_b, redis_b, transport_b = await make_node("B", url)
    consumer = await transport_b.subscribe("rtt_b")
    await asyncio.wait_for(consumer.ready.wait(), 30)
    await node_b.add_worker("echo", Echo())
    await redis_b.rpush("bench:b:ready", 1)
    await redis_b.blpop(["bench:pong:stop"], timeout=600)
    await node_b.stop()
    await redis_b.aclose()


async def in_child(url: str, mode: str, measure: Any) -> list[float]:
    """Run ``measure()`` here while the other side runs as ``--<mode>`` in a child process."""
    redis = Redis.from_url(url)
    await redis.delete("bench:b:ready", "bench:pong:stop", "bench:raw:ping", "bench:raw:pong")
    child = await asyncio.create_subprocess_exec(sys.executable, __file__, f"--{mode}", url)
    try:
        if not await redis.blpop(["bench:b:ready"], timeout=60):
            raise RuntimeError(f"{mode} did not start")
        samples: list[float] = await measure()
        await redis.rpush("bench:pong:stop", 1)
        await asyncio.wait_for(child.wait(), 30)
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
        await redis.aclose()
    return samples


async def raw_ping(url: str) -> list[float]:
    """The pinging side of the raw ping-pong (the other side in another process)."""
    client, client_read = Redis.from_url(url), Redis.from_url(url)
    index: bytes | str = "0-0"
    samples: list[float] = []
    for i in range(RTT_N + 100):
        start = time.perf_counter()
        await client.xadd("bench:raw:ping", {b"data": PAYLOAD})
        found = await client_read.xread({"bench:raw:pong": index}, count=1, block=5000)
        index = found[0][1][-1][0]
        if i >= 100:
            samples.append((time.perf_counter() - start) * 1000)
    for r in (client, client_read):
        await r.aclose()
    return samples


async def _pings(node_a: Node) -> list[float]:
    """Round trips (ms) from node A through the stream transport to ``echo`` (first 100 warm up)."""
    waiter = Waiter()
    await node_a.add_worker("waiter", waiter)
    route = Route([StreamAddress("rtt_b", "rtt_a").to_address(), "echo"])
    loop = asyncio.get_running_loop()
    samples: list[float] = []
    for i in range(RTT_N + 100):
        waiter.future = loop.create_future()
        start = time.perf_counter()
        await node_a.deliver(TransportMessage(route, Route(["waiter"]), PAYLOAD))
        await asyncio.wait_for(waiter.future, 10)
        if i >= 100:
            samples.append((time.perf_counter() - start) * 1000)
    return samples


async def sluice_ping(url: str) -> list[float]:
    """Node A: requests through the stream transport to node B's echo (in another process)."""
    node_a, redis_a, _ = await make_node("A", url)
    samples = await _pings(node_a)
    await node_a.stop()
    await redis_a.aclose()
    return samples


async def sluice_rtt(url: str) -> list[float]:
    node_a, redis_a, _ = await make_node("A", url)
    node_b, redis_b, transport_b = await make_node("B", url)
    consumer = await transport_b.subscribe("rtt_b")
    await asyncio.wait_for(consumer.ready.wait(), 10)
    await node_b.add_worker("echo", Echo())
    samples = await _pings(node_a)
    for node, redis in ((node_a, redis_a), (node_b, redis_b)):
        await node.stop()
        await redis.aclose()
    return samples


async def main() -> None:
    report = Report("streams")
    with tempfile.TemporaryDirectory() as tmp, LocalRedis(Path(tmp)) as server:
        raw = await raw_oneway(server.url)
        ours = await sluice_oneway_two_processes(server.url)
        report.emit(
            "oneway_msgs_per_s",
            ours,
            raw,
            messages=N,
            payload_bytes=len(PAYLOAD),
            nodes="A and B in two processes",
        )
        raw = await raw_oneway(server.url)
        ours = await sluice_oneway(server.url)
        report.emit(
            "oneway_msgs_per_s_one_process",
            ours,
            raw,
            messages=N,
            payload_bytes=len(PAYLOAD),
            nodes="A and B on one event loop",
        )
        raw_samples = await raw_rtt(server.url)
        our_samples = await sluice_rtt(server.url)
        for q in (50, 99):
            report.emit(
                f"rtt_p{q}_ms",
                percentile(our_samples, q),
                percentile(raw_samples, q),
                samples=len(our_samples),
            )
        raw_samples = await in_child(server.url, "raw-pong", lambda: raw_ping(server.url))
        our_samples = await in_child(server.url, "echo-b", lambda: sluice_ping(server.url))
        report.emit(
            "rtt_p50_ms_two_processes",
            percentile(our_samples, 50),
            percentile(raw_samples, 50),
            samples=len(our_samples),
            nodes="B (the echo) in its own process",
        )
    report.save()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--node-b"]:
        asyncio.run(node_b_process(sys.argv[2], int(sys.argv[3])))
    elif sys.argv[1:2] == ["--raw-pong"]:
        asyncio.run(raw_pong_process(sys.argv[2]))
    elif sys.argv[1:2] == ["--echo-b"]:
        asyncio.run(echo_b_process(sys.argv[2]))
    else:
        asyncio.run(main())
