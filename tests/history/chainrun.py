"""One generated history of a chain stream, run against the real processes.

Redis (appendonly, fsync always; or, in about one seed in four, a Sentinel
group that the nemesis fails over: :mod:`tests.history.redisgroup`, which also
says what the model learns when a master's death loses writes), ``sluice
serve`` in its own process with its Redis link through Toxiproxy (on Sentinel:
the group's URL, no proxy), consumers of every kind reaching serve through a
second proxy, the real archive, canonical and trim jobs on the
session's Spark, and ``sluice produce`` now and then. A seeded schedule
(:mod:`tests.history.schedule`) says what happens at each step; the model
(:mod:`tests.history.model`) learns every block in stream order from Redis
itself (read before anything is trimmed); at the end every consumer must hold
the model's heaviest chain (:mod:`tests.history.checker`).

Timing is not replayed: a seed replays the same schedule, not the same
interleaving (as Jepsen's seeds do).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from pipeline import keys
from pipeline.blockcodec import ENTRY_FIELD, Block, decode_block
from pipeline.chain.produce.generator import SyntheticChain, write_blocks
from pipeline.runtime.ports import free_port
from pipeline.settings import Settings
from tests.history import consumers as consumer_kinds
from tests.history import harness
from tests.history.checker import apply, check
from tests.history.model import ChainModel
from tests.history.nemesis import Nemesis, Serve
from tests.history.redisgroup import SingleRedis, for_seed
from tests.history.schedule import Step, draw_schedule
from tests.support.toxiproxy import Toxiproxy

log = logging.getLogger(__name__)

STREAM = "chain:h"


@dataclass
class Report:
    seed: int
    steps: list[str] = field(default_factory=list)
    violations: dict[str, list[str]] = field(default_factory=dict)
    #: per consumer: seconds from a reorg's tip written to the consumer holding it
    reorg_latency: dict[str, list[float]] = field(default_factory=dict)
    consumers: list[str] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)
    blocks: int = 0
    reorgs: int = 0
    #: "single" (one server) or "sentinel" (a Sentinel group)
    redis: str = "single"
    #: kill_serve faults whose consumers went to the second serve process
    switches: int = 0

    def summary(self) -> str:
        worst = max((max(v) for v in self.reorg_latency.values() if v), default=0.0)
        return (
            f"seed {self.seed} ({self.redis} Redis): {self.blocks} blocks, {self.reorgs} reorgs, "
            f"{len(self.consumers)} consumers, faults {self.faults}, "
            f"slowest reorg seen by a live consumer {worst:.2f}s"
        )


class ChainHistory:
    """The processes and state of one run (see the module doc)."""

    def __init__(
        self, seed: int, workdir: Path, spark: Any, go_binary: str, toxiproxy: Toxiproxy,
        *, threshold: int = 8,
    ) -> None:  # fmt: skip
        self.seed = seed
        self.rng = random.Random(seed)
        self.workdir = workdir
        self.spark = spark
        self.go_binary = go_binary
        self.toxiproxy = toxiproxy
        self.threshold = threshold
        self.report = Report(seed)
        self.model = ChainModel()
        self.gen = SyntheticChain(seed=seed, prefixes=("s/",), keys=16)
        self.redis = for_seed(seed, workdir)
        self.report.redis = self.redis.kind
        self.lake_uri = str(workdir / "lake")
        self.last_id = b"0-0"
        self.archived_ms = 0
        #: the height of the lake's canonical head (-1: nothing archived yet)
        self.lake_head = -1
        self.consumers: list[consumer_kinds.Consumer] = []
        #: (time written, tip hash) of each reorg
        self.reorg_tips: list[tuple[float, str]] = []

    # --- the parts ---------------------------------------------------------------

    @property
    def client(self) -> redis.Redis:
        """The checker's own client: the master's, on Sentinel."""
        return self.redis.client

    def settings(self) -> Settings:
        return Settings.load(
            env=self.redis.env(),
            redis_url=self.redis.url,
            lake_uri=self.lake_uri,
            streams=(STREAM,),
            chain_streams=(STREAM,),
            archive_partitions=2,
            archive_range_entries=1,  # two ranges however small the interval
            hot_retention_s=0,
            reorg_threshold=self.threshold,
        )

    def _env(self, redis_url: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
        return {
            **env,
            **self.redis.env(),
            "SLUICE_REDIS_URL": redis_url,
            "SLUICE_LAKE_URI": self.lake_uri,
            "SLUICE_SERVE_STREAM": STREAM,
            "SLUICE_STREAMS": STREAM,
            "SLUICE_CHAIN_STREAMS": STREAM,
            "SLUICE_REORG_THRESHOLD": str(self.threshold),
            "SLUICE_LOG_LEVEL": os.environ.get("CHECKER_SERVE_LOG", "WARNING"),
            "SLUICE_VAR_DIR": str(self.workdir / "var"),
            "SLUICE_CONFIG": os.devnull,
        }

    def sync(self) -> None:
        """Teach the model every entry written since the last sync (before any trim); on
        Sentinel only once the replica holds them (:mod:`tests.history.redisgroup`)."""
        self.redis.fence()
        while True:
            entries = self.client.xrange(
                keys.stream(STREAM), f"({self.last_id.decode()}", "+", 1000
            )
            for entry_id, fields in entries:
                self.last_id = entry_id
                self.model.add(decode_block(fields[ENTRY_FIELD]))
                self.report.blocks += 1
            if len(entries) < 1000:
                return

    def write(self, blocks: list[Block]) -> None:
        write_blocks(self.client, STREAM, blocks)
        self.sync()

    # --- the run -------------------------------------------------------------------

    async def run(self, steps: int) -> Report:
        await asyncio.to_thread(self.redis.start)
        redis_link, serve_url = None, self.redis.url
        if isinstance(self.redis, SingleRedis):
            redis_link = self.toxiproxy.proxy(f"redis-{self.seed}", self.redis.port)
            serve_url = f"redis://127.0.0.1:{redis_link.port}/0"
        serve = Serve(self._env(serve_url), free_port(), self.workdir / "serve.log")
        second = Serve(serve.env, 0, self.workdir / "serve-b.log")  # its port when started
        client_link = self.toxiproxy.proxy(f"serve-{self.seed}", serve.port)
        self.base = f"ws://127.0.0.1:{client_link.port}"
        nemesis = Nemesis(
            self.rng, serve, self.redis, redis_link, client_link, second, seed=self.seed
        )
        try:
            self.write(self.gen.take(self.rng.randint(40, 300)))
            if self.rng.random() < 0.5:
                await self.archive()
            await serve.start()
            for step in draw_schedule(self.rng, steps, nemesis.faults):
                self.report.steps.append(await self.do(step, nemesis))
            await nemesis.heal()
            self.write(self.gen.take(3))
            await self.settle()
            self.verdict()
        finally:
            (self.workdir / "steps.txt").write_text("".join(f"{s}\n" for s in self.report.steps))
            await nemesis.heal()
            for consumer in self.consumers:
                await consumer.stop()
            await nemesis.stop_serves()
            self.report.switches = nemesis.switches
            self.redis.stop()
            if redis_link is not None:
                redis_link.delete()
            client_link.delete()
        return self.report

    async def do(self, step: Step, nemesis: Nemesis) -> str:
        rng = self.rng
        if step.op == "blocks":
            for _ in range(step.count):
                self.write(self.gen.step())
                await asyncio.sleep(rng.uniform(0, 0.05))
            return f"blocks {step.count}"
        if step.op == "reorg":
            return self.reorg(step.place)
        if step.op == "archive":
            return await self.archive()
        if step.op == "produce":
            return await self.produce()
        if step.op == "consumer":
            return await self.join(step.kind, step.dialect)
        self.report.faults.append(step.fault)
        if step.fault == "failover" and rng.random() < 0.5:  # the master dies under a writer
            return await self.produce(during=lambda: nemesis.strike(step.fault))
        return await nemesis.strike(step.fault)

    def reorg(self, place: str) -> str:
        rng, gen = self.rng, self.gen
        if gen.reorg_room < 1:  # it holds its head alone (rebuilt after a producer restart)
            self.write(gen.take(1))
        head = gen.canonical[-1].num
        low = gen.canonical[0].num  # the deepest a reorg can reach
        if place == "seam" and self.lake_head >= low and self.lake_head < head:
            fork = self.lake_head + 1  # the first replaced height: the lake's head is the ancestor
        elif place == "lake" and min(self.lake_head, head) > low:
            fork = rng.randint(low + 1, min(self.lake_head, head))
        else:
            place = "redis"
            floor = max(low + 1, self.lake_head + 2, head - 4 * self.threshold)
            fork = rng.randint(min(floor, head), head)
        depth = head - fork + 1
        length = rng.choice(
            [max(1, depth - rng.randint(1, depth)), depth, depth + rng.randint(1, 3)]
        )
        branch = gen.reorg(depth, length)
        self.write(branch)
        self.reorg_tips.append((asyncio.get_running_loop().time(), branch[-1].hash.hex()))
        self.report.reorgs += 1
        return f"reorg {place} depth {depth} length {length}"

    async def archive(self) -> str:
        from pipeline.lake.archive import archive_interval
        from pipeline.lake.canonical import mark_canonical
        from pipeline.lake.trim import safe_trim

        self.sync()
        seconds, micros = self.client.time()
        end_ms = int(seconds) * 1000 + int(micros) // 1000
        settings = self.settings()
        await asyncio.to_thread(
            archive_interval, self.spark, settings, STREAM, self.archived_ms, end_ms
        )
        self.archived_ms = end_ms
        marked = await asyncio.to_thread(mark_canonical, self.spark, settings, STREAM)
        self.sync()  # (nothing is written meanwhile: the trim below cuts what the model holds)
        trimmed = await asyncio.to_thread(safe_trim, settings, STREAM)
        self.lake_head = -1 if marked.head_num is None else marked.head_num
        return f"archive to {self.lake_head}, trimmed {trimmed.trimmed}"

    async def produce(self, during: Callable[[], Awaitable[str]] | None = None) -> str:
        """``sluice produce`` goes on from the stream's head for a while, then is killed -9;
        ``during``: a fault struck while it runs (after 0.5 to 2 s; it is killed 0.5 to
        2.5 s after the fault healed)."""
        rng = self.rng
        depth = rng.randint(1, 3 * self.threshold)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "pipeline.cli", "produce", "--stream", STREAM,
            "--rate", "50", "--seed", str(rng.randrange(1 << 30)), "--keys", "16",
            "--reorg-every", str(rng.randint(3, 10)), "--reorg-depth", str(depth),
            env=self._env(self.redis.url), stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        fault = ""
        if during is not None:
            await asyncio.sleep(rng.uniform(0.5, 2))
            last = self.client.xrevrange(keys.stream(STREAM), "+", "-", 1)
            at = decode_block(last[0][1][ENTRY_FIELD]).num if last else -1
            fault = f"{await during()} (head {at} at the kill), under "
        await asyncio.sleep(rng.uniform(0.5, 2.5))
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        code = await proc.wait()
        self.sync()
        recent = self.client.xrevrange(keys.stream(STREAM), "+", "-", 512)
        self.gen.continue_from([decode_block(f[ENTRY_FIELD]) for _, f in reversed(recent)])
        if (
            code == 2
        ):  # refused in one line: the stream was trimmed empty (its chain is in the lake)
            return f"{fault}produce refused: the stream was trimmed empty"
        return f"{fault}produce (reorg depth <= {depth}) killed at {self.gen.canonical[-1].num}"

    async def join(self, kind: str, dialect: str) -> str:
        rng = self.rng
        chain = self.model.chain()
        head = max(chain)
        num = rng.randint(0, head)
        how = rng.choice(["right", "right", "wrong", "replaced"])
        replaced = [h for h, k in self.model.blocks.items() if chain.get(k.num) != h]
        if how == "replaced" and replaced:
            h = rng.choice(replaced)
            num, weight = self.model.blocks[h].num, self.model.blocks[h].weight
            bound = num
        elif how == "wrong":
            h, weight, bound = "77" * 32, num + 1, max(0, num - self.threshold)
        else:
            how, h = "right", chain[num]
            weight = self.model.blocks[h].weight
            bound = num if kind == "raw" else num + 1
        name = f"{kind}-{dialect}-{len(self.consumers)}"
        consumer = await consumer_kinds.start(
            kind, dialect, self.base, num, h, self.go_binary, self.threshold,
            name=name, start_bound=bound, weight=weight, logs=self.workdir,
        )  # fmt: skip
        consumer.record.joined = asyncio.get_running_loop().time()
        self.consumers.append(consumer)
        self.report.consumers.append(name)
        return f"consumer {name} from {num} ({how} hash)"

    async def settle(self, wait_s: float = 60.0) -> None:
        """Wait until every consumer holds the model's head (or the time is up)."""
        head = self.model.head
        assert head is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while loop.time() < deadline:
            if all(apply(c.record)[0].get(head[0]) == head[1] for c in self.consumers):
                return
            await asyncio.sleep(0.2)

    def verdict(self) -> None:
        chain = self.model.chain()
        with (self.workdir / "model.jsonl").open("w") as out:  # to read a failure by
            for h, known in self.model.blocks.items():
                canonical = chain.get(known.num) == h
                out.write(
                    json.dumps(
                        {
                            "num": known.num,
                            "hash": h,
                            "parent": known.parent,
                            "weight": known.weight,
                            "canonical": canonical,
                        }
                    )
                    + "\n"
                )
        for consumer in self.consumers:
            record = consumer.record
            bad = check(record, chain)
            bad += [f"malformed notification: {m}" for m in getattr(consumer, "malformed", [])]
            if bad:
                self.report.violations[record.name] = bad
            joined = record.joined
            seen = [
                t - written
                for written, tip in self.reorg_tips
                if written > joined and (t := record.first_seen(tip)) is not None
            ]
            self.report.reorg_latency[record.name] = seen


def replay_command(seed: int) -> str:
    return harness.replay_command("tests/history/test_chain_history.py", seed)


async def run_seed(seed: int, workdir: Path, spark: Any, go_binary: str, toxiproxy: Toxiproxy,
                   steps: int = 12) -> Report:  # fmt: skip
    return await ChainHistory(seed, workdir, spark, go_binary, toxiproxy).run(steps)


__all__ = ["ChainHistory", "Report", "replay_command", "run_seed"]
