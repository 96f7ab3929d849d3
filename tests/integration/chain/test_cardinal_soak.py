"""The real cardinal-streams consumer catches up through ``sluice serve`` and loses nothing.

23 of the library's own websocket consumers (Go, v1.5.1) follow ``/cardinal``
while blocks come at 50 a second with a reorg every 30 (depths 1 to 5, and
one to a shorter, heavier chain in each round): one from block 0 (history
from the lake, then the Redis tail, then live), one from N with the right
hash, one with a wrong hash, and 20 from random heights, all at once. After
every one is ready, 15 s of live blocks (``SLUICE_TEST_CARDINAL_LIVE_S``; 60 s or more
for a longer soak), across two ``kill -9`` restarts of ``sluice serve``. Each consumer's final chain (its ChainUpdates applied in
order: removed, then added) is compared height by height with the heaviest
chain in Redis and the lake: no hole, no stale block, no duplicate.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import sys
from collections.abc import AsyncIterator
from typing import Any

import redis

from pipeline.blockcodec import effective_weight
from pipeline.chain.produce.generator import SyntheticChain, write_blocks
from pipeline.runtime.ports import free_port
from tests.integration.chain.conftest import STREAM, GoProcess, write_lake
from tests.integration.chain.test_cardinal_go import _listening, sluice_canonical
from tests.support.poll import until

RATE = 50  # blocks a second
#: Seconds of live blocks after every consumer is ready: 15 s in the suite (750 blocks, 25
#: reorgs: every depth of ROUND four times, a serve restart every 5 s), longer with
#: ``SLUICE_TEST_CARDINAL_LIVE_S=60`` (the soak's length before the suite's 20-minute budget).
LIVE_S = float(os.environ.get("SLUICE_TEST_CARDINAL_LIVE_S", "15"))
THRESHOLD = 64  # sluice serve's default reorg threshold: a wrong hash rewinds this far
ROUND = [(1, None), (2, None), (3, None), (4, None), (5, None), (4, 2)]  # (depth, length)


def final_chain(proc: GoProcess) -> dict[int, str]:
    """The consumer's chain: each ChainUpdate applied in order (removed, then added)."""
    state: dict[int, str] = {}
    for line in proc.lines:
        if line["event"] != "update":
            continue
        for b in line["removed"]:
            if state.get(b["num"]) == b["hash"]:
                del state[b["num"]]
        for b in line["added"]:
            state[b["num"]] = b["hash"]
    return state


def faults(state: dict[int, str], canonical: dict[int, str], first: int) -> dict[str, Any]:
    """Holes (heights missing), stale blocks (not the heaviest chain's) and extra heights."""
    head = max(canonical)
    holes = [n for n in range(first, head + 1) if n not in state]
    stale = [n for n in range(first, head + 1) if n in state and state[n] != canonical[n]]
    extra = [n for n in state if n > head]
    return {"holes": len(holes), "stale": len(stale), "extra": len(extra), "first_holes": holes[:5]}


class Producer:
    """Writes the chain into Redis at RATE blocks a second, a reorg every 30 steps."""

    def __init__(self, client: redis.Redis, gen: SyntheticChain) -> None:
        self.client = client
        self.gen = gen
        self._stop = asyncio.Event()
        self.task = asyncio.create_task(self._run(), name="soak-producer")

    async def _run(self) -> None:
        steps = 0
        reorgs = 0
        while not self._stop.is_set():
            steps += 1
            if steps % 30 == 0:
                depth, length = ROUND[reorgs % len(ROUND)]
                reorgs += 1
                blocks = self.gen.reorg(depth, length)
            else:
                blocks = self.gen.take(1)
            write_blocks(self.client, STREAM, blocks)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), 1 / RATE)

    async def stop(self) -> None:
        self._stop.set()
        await self.task


class Serve:
    """``sluice serve`` in its own process, killed with SIGKILL and started again on its port."""

    def __init__(self, env: dict[str, str], port: int) -> None:
        self.env = env
        self.port = port
        self.proc: asyncio.subprocess.Process | None = None
        self.starts = 0

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "pipeline.cli", "serve", "--port", str(self.port),
            env=self.env, stdout=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        self.starts += 1
        await _listening(self.port, 60)

    async def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        await self.proc.wait()

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            try:
                async with asyncio.timeout(15):
                    await self.proc.wait()
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


@contextlib.asynccontextmanager
async def running_serve(env: dict[str, str]) -> AsyncIterator[Serve]:
    serve = Serve(env, free_port())
    await serve.start()
    try:
        yield serve
    finally:
        await serve.stop()


async def test_go_consumers_catch_up_and_follow_with_no_hole(
    settings, go_run, redis_client: redis.Redis, redis_url: str
) -> None:
    gen = SyntheticChain(seed=71, prefixes=("s/", "t/"))
    write_lake(settings.lake.uri, gen.take(200))  # history: the lake only
    write_blocks(redis_client, STREAM, gen.take(200))  # the Redis tail
    env = {
        **os.environ,
        "SLUICE_REDIS_URL": settings.redis.url,
        "SLUICE_LAKE_URI": settings.lake.uri,
        "SLUICE_SERVE_STREAM": STREAM,
        "SLUICE_CHAIN_STREAMS": STREAM,
        "SLUICE_LOG_LEVEL": "WARNING",
    }
    rng = random.Random(72)
    async with running_serve(env) as serve:
        url = f"ws://127.0.0.1:{serve.port}/cardinal"
        producer = Producer(redis_client, gen)
        try:
            await asyncio.sleep(2)  # the tail grows and reorgs while the consumers come
            starts: list[tuple[int, list[str]]] = [(0, [])]
            n = 150
            right = gen.canonical[n]
            weight = hex(effective_weight(n, right.weight))
            starts.append(
                (n + 1, ["-from", str(n), "-hash", "0x" + right.hash.hex(), "-weight", weight])
            )
            starts.append(
                (n - THRESHOLD, ["-from", str(n), "-hash", "0x" + "77" * 32, "-weight", weight])
            )
            for height in sorted(rng.sample(range(1, len(gen.canonical) - 10), 20)):
                block = gen.canonical[height]
                w = hex(effective_weight(height, block.weight))
                starts.append(
                    (
                        height + 1,
                        ["-from", str(height), "-hash", "0x" + block.hash.hex(), "-weight", w],
                    )
                )
            async with contextlib.AsyncExitStack() as stack:
                procs = [
                    (first, await stack.enter_async_context(go_run("consumer", "-url", url, *args)))
                    for first, args in starts
                ]
                for _, proc in procs:
                    await proc.wait_for(
                        lambda p=proc: any(line["event"] == "ready" for line in p.lines),
                        60,
                        "ready",
                    )
                for _ in range(2):
                    await asyncio.sleep(LIVE_S / 3)
                    await serve.kill()
                    await serve.start()  # the library redials by itself, from its last block
                await asyncio.sleep(LIVE_S / 3)
                await producer.stop()
                head = "0x" + gen.canonical[-1].hash.hex()
                for _, proc in procs:
                    await proc.wait_for(
                        lambda p=proc: final_chain(p).get(gen.canonical[-1].num) == head,
                        60,
                        "at the head after the producer stopped",
                    )
                canonical = {b.num: "0x" + b.hash.hex() for b in gen.canonical}
                assert sluice_canonical(redis_url, settings.lake.uri) == canonical
                report = {first: faults(final_chain(p), canonical, first) for first, p in procs}
                bad = {k: v for k, v in report.items() if v["holes"] or v["stale"] or v["extra"]}
                assert not bad, f"consumers with faults (by first height): {bad}"
                assert serve.starts == 3 and gen.canonical[-1].num > 400 + LIVE_S * RATE * 0.5
        finally:
            if not producer.task.done():
                await producer.stop()


#: How long the library's producer feeds ``sluice subscribe``: 15 s in the suite (750 live
#: blocks after the 600 made before it came, 1,350 in all: the old client, which held blocks
#: until 4,096 waited and stalled after block ~670, never reached the head), the issue's
#: 3 minutes with ``SLUICE_CARDINAL_FEED_S=180``.
FEED_S = float(os.environ.get("SLUICE_CARDINAL_FEED_S", "15"))


class Subscriber:
    """``sluice subscribe --dialect cardinal`` in its own process; its chain and each block's arrival."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.state: dict[int, str] = {}
        self.arrived: dict[str, float] = {}
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        import json

        assert self.proc.stdout is not None
        loop = asyncio.get_running_loop()
        async for raw in self.proc.stdout:
            line = json.loads(raw)
            if "added" in line:
                self.state[line["added"]] = line["hash"]
                self.arrived.setdefault(line["hash"], loop.time())
            elif self.state.get(line["removed"]) == line["hash"]:
                del self.state[line["removed"]]


async def test_sluice_subscribe_keeps_up_with_the_library_producer(go_run, settings) -> None:
    from tests.integration.chain.test_cardinal_go import _command

    gen = SyntheticChain(seed=73, prefixes=("s/",))
    port = free_port()
    loop = asyncio.get_running_loop()
    produced: dict[str, float] = {}
    async with go_run("producer", "-port", str(port), "-threshold", "64") as producer:
        await _listening(port)

        async def send(blocks: list[Any], ancestor: Any = None) -> None:
            if ancestor is not None:  # a producer may name the common ancestor of a reorg
                await producer.send(
                    {"op": "reorg", "num": ancestor.num, "hash": "0x" + ancestor.hash.hex()}
                )
            for block in blocks:
                await producer.send(_command(block))
                produced["0x" + block.hash.hex()] = loop.time()

        await send(gen.take(600))  # the producer is ahead when the subscriber comes
        env = {**os.environ, "SLUICE_LOG_LEVEL": os.environ.get("SOAK_LOG", "WARNING")}
        cli = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "pipeline.cli", "subscribe", "--dialect", "cardinal",
            "--url", f"ws://127.0.0.1:{port}",
            env=env, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        sub = Subscriber(cli)
        try:
            steps = reorgs = 0
            end = loop.time() + FEED_S
            while loop.time() < end:
                steps += 1
                if steps % 30 == 0:
                    depth, length = ROUND[reorgs % len(ROUND)]
                    # Named only in the last sixth (10 s at most): a named ancestor lets a
                    # consumer holding blocks past a gap move on, which would hide the gap
                    # this test looks for.
                    named = loop.time() > end - min(10.0, FEED_S / 6)
                    ancestor = gen.canonical[-depth - 1] if named else None
                    reorgs += 1
                    await send(gen.reorg(depth, length), ancestor)
                else:
                    await send(gen.take(1))
                await asyncio.sleep(1 / RATE)
            head = gen.canonical[-1]

            def at_head() -> bool:
                assert not sub.reader.done(), f"sluice subscribe ended ({cli.returncode})"
                top = max(sub.state, default=-1)
                return top == head.num and sub.state[top] == "0x" + head.hash.hex()

            await until(
                at_head,
                "sluice subscribe at the producer's head",
                within_s=30,
                every_s=0.1,
                detail=lambda: (
                    f"producer head {head.num}, subscriber head {max(sub.state, default=None)}"
                ),
            )
            canonical = {b.num: "0x" + b.hash.hex() for b in gen.canonical}
            assert sub.state == canonical  # the producer's heaviest chain, every height, no stale
            # The subscriber's delay behind the producer, per canonical block, once caught up
            # (the first 600 blocks were made before it came).
            lags = sorted(
                sub.arrived[h] - produced[h]
                for n, h in canonical.items()
                if n >= 600 and h in sub.arrived
            )
            assert lags, "no live block reached the subscriber"
            p99 = lags[int(len(lags) * 0.99)]
            logging.getLogger(__name__).warning(
                f"live blocks {len(lags)}, delay p50 {lags[len(lags) // 2]:.3f} s, p99 {p99:.3f} s, max {lags[-1]:.3f} s"
            )
            # The goal is 2 s; the bound leaves room for a loaded CI machine but not for a stall
            # (before the fix: nothing for 130 s after block ~670).
            assert lags[-1] < 10, f"the subscriber fell {lags[-1]:.1f} s behind the producer"
        finally:
            if cli.returncode is None:
                cli.terminate()
                await cli.wait()
            sub.reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sub.reader
    assert all(line == {"event": "ok"} for line in producer.lines), producer.lines[-3:]


async def test_sluice_subscribe_follows_the_library_producer_through_deep_reorgs(
    go_run, settings
) -> None:
    """The library's producer (threshold 64) names the common ancestor of each reorg deeper
    than its threshold, as its API asks (``Reorg``): shorter and longer heavier branches 80
    to 150 deep, one right after another. ``sluice subscribe --dialect cardinal`` ends on
    the producer's heaviest chain, every height, nothing stale (issue 30)."""
    from tests.integration.chain.test_cardinal_go import _command

    gen = SyntheticChain(seed=74, prefixes=("s/",))
    port = free_port()
    async with go_run("producer", "-port", str(port), "-threshold", "64") as producer:
        await _listening(port)

        async def send(blocks: list[Any], ancestor: Any = None) -> None:
            if ancestor is not None:
                await producer.send(
                    {"op": "reorg", "num": ancestor.num, "hash": "0x" + ancestor.hash.hex()}
                )
            for block in blocks:
                await producer.send(_command(block))

        await send(gen.take(400))
        env = {**os.environ, "SLUICE_LOG_LEVEL": "WARNING"}
        cli = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "pipeline.cli", "subscribe", "--dialect", "cardinal",
            "--url", f"ws://127.0.0.1:{port}",
            env=env, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        sub = Subscriber(cli)
        try:
            await until(lambda: max(sub.state, default=-1) >= 399, "caught up", within_s=30)
            for depth, length in [(80, 3), (100, 101), (150, 1), (90, 95)]:
                ancestor = gen.canonical[-depth - 1]
                await send(gen.reorg(depth, length), ancestor)
                await send(gen.take(2))
                await asyncio.sleep(0.3)
            head = gen.canonical[-1]
            await until(
                lambda: sub.state.get(head.num) == "0x" + head.hash.hex(),
                "sluice subscribe at the producer's head",
                within_s=30,
            )
            canonical = {b.num: "0x" + b.hash.hex() for b in gen.canonical}
            stale = {n for n in sub.state if canonical.get(n) != sub.state[n]}
            assert not stale, f"{len(stale)} heights not the producer's heaviest chain"
            assert sub.state == canonical
        finally:
            if cli.returncode is None:
                cli.terminate()
                await cli.wait()
            sub.reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sub.reader
