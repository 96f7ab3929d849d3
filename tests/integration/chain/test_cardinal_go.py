"""The real cardinal-streams library (Go, v1.5.1, built from tests/go) and Sluice, both ways.

Its own websocket consumer (``transports.ResolveConsumer`` with a ``ws://``
URL) follows ``sluice serve``'s ``/cardinal`` endpoint: from block 0, from N
with the right hash, from N with a wrong hash, through reorgs of depth 1 to 5
and one to a shorter, heavier chain. Each must fire ``Ready()`` and end with
the canonical chain Sluice holds in Redis and the lake, parent-linked, no gap.

Its own websocket producer (``transports.NewWebsocketProducer`` with a
``StreamsResumption``) feeds Sluice's consumer library and ``sluice subscribe
--dialect cardinal`` the same way; and Sluice's consumer follows ``sluice
serve`` in the cardinal dialect too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from typing import Any

import redis
from aiohttp.test_utils import TestServer

from pipeline import keys
from pipeline.blockcodec import ENTRY_FIELD, Block, decode_block, effective_weight
from pipeline.chain.client.consumer import subscribe
from pipeline.chain.client.ordered import Added, Removed
from pipeline.chain.produce.generator import SyntheticChain, write_blocks
from pipeline.chain.serve.server import create_app
from pipeline.chain.tailindex import TailIndex
from pipeline.lake.storage.reader import LakeReader
from pipeline.runtime.ports import free_port
from tests.integration.chain.conftest import STREAM, GoProcess, write_lake

ZERO = "0x" + "00" * 32


def _merged(block: Block) -> tuple[dict[str, str], list[str]]:
    values = {k: "0x" + v.hex() for k, v in block.updates.items()}
    deletes = set(block.deletes)
    for sub in block.subbatches:
        values.update({k: "0x" + v.hex() for k, v in sub.updates.items()})
        deletes.update(sub.deletes)
    return values, sorted(deletes)


def go_chain(proc: GoProcess) -> list[dict[str, Any]]:
    """The consumer's chain: from its last added block down its parents, lowest first."""
    known: dict[str, dict[str, Any]] = {}
    head: dict[str, Any] | None = None
    for line in proc.lines:
        if line["event"] == "update" and line["added"]:
            for b in line["added"]:
                known[b["hash"]] = b
            head = line["added"][-1]
    chain = [] if head is None else [head]
    while chain and chain[-1]["parent"] in known:
        chain.append(known[chain[-1]["parent"]])
    return chain[::-1]


def go_added_removed(proc: GoProcess) -> tuple[set[str], set[str]]:
    """Hashes of every block the consumer's ChainUpdates added, and of every one they removed."""
    added: set[str] = set()
    removed: set[str] = set()
    for line in proc.lines:
        if line["event"] == "update":
            added.update(b["hash"] for b in line["added"])
            removed.update(b["hash"] for b in line["removed"])
    return added, removed


def at_head(proc: GoProcess, head: Block) -> bool:
    chain = go_chain(proc)
    ready = any(line["event"] == "ready" for line in proc.lines)
    return ready and bool(chain) and chain[-1]["hash"] == "0x" + head.hash.hex()


def sluice_canonical(redis_url: str, lake_uri: str) -> dict[int, str]:
    """num -> hash of the canonical chain as Sluice stores it: the lake below, Redis' tail above."""
    chain = {
        r.num: "0x" + r.hash.hex() for page in LakeReader(lake_uri).iter_canonical(STREAM, 0)
        for r in page
    }  # fmt: skip
    tail = TailIndex()
    client = redis.Redis.from_url(redis_url)
    try:
        for entry_id, fields in client.xrange(keys.stream(STREAM)):
            b = decode_block(fields[ENTRY_FIELD])
            tail.add(b.num, b.hash.hex(), b.parent.hex(), entry_id, b.weight)
    finally:
        client.close()
    for num in [n for n in chain if tail.lo is not None and n >= tail.lo]:
        del chain[num]
    chain.update({n: "0x" + h for n, (h, _, _) in tail.chain.items()})
    return chain


def check_chain(proc: GoProcess, gen: SyntheticChain, first: int, stored: dict[int, str]) -> None:
    chain = go_chain(proc)
    assert [b["num"] for b in chain] == list(range(first, gen.canonical[-1].num + 1))
    for lower, upper in zip(chain, chain[1:], strict=False):
        assert upper["parent"] == lower["hash"]  # parent-linked, no gap
    expected = gen.canonical[first:]
    assert [b["hash"] for b in chain] == ["0x" + b.hash.hex() for b in expected]
    assert [b["hash"] for b in chain] == [stored[b["num"]] for b in chain]
    assert chain[0]["parent"] == "0x" + gen.canonical[first].parent.hex()
    for got, block in zip(chain, expected, strict=True):
        values, deletes = _merged(block)
        assert (got["values"], got["deletes"]) == (values, deletes)
        assert int(got["weight"], 16) == effective_weight(block.num, block.weight)


async def test_go_consumer_follows_sluice_through_reorgs(
    settings, serve, go_run, redis_client, redis_url: str
) -> None:
    gen = SyntheticChain(seed=61, prefixes=("s/", "t/"))
    blocks = gen.take(30)
    write_lake(settings.lake.uri, blocks[:20])
    write_blocks(redis_client, STREAM, blocks[20:])
    async with serve(settings) as (base, _app):
        url = base.replace("http://", "ws://") + "/cardinal"
        right = gen.canonical[25]
        right_args = ["-from", "25", "-hash", "0x" + right.hash.hex(), "-weight", hex(26)]
        wrong_args = ["-from", "25", "-hash", "0x" + "77" * 32, "-weight", hex(26)]
        async with (
            go_run("consumer", "-url", url) as from_zero,
            go_run("consumer", "-url", url, *right_args) as from_right,
            go_run("consumer", "-url", url, *wrong_args) as from_wrong,
        ):
            consumers = {
                0: from_zero,
                26: from_right,
                25 - settings.lake.reorg_threshold: from_wrong,
            }

            async def all_at_head(what: str) -> None:
                for proc in consumers.values():
                    await proc.wait_for(lambda p=proc: at_head(p, gen.canonical[-1]), 30, what)

            await all_at_head("catch-up")
            for depth in range(1, 6):
                write_blocks(redis_client, STREAM, gen.reorg(depth))
                await all_at_head(f"reorg of depth {depth}")
                write_blocks(redis_client, STREAM, gen.take(1))
                await all_at_head(f"block after the reorg of depth {depth}")
            before = gen.canonical[-1].num
            write_blocks(redis_client, STREAM, gen.reorg(4, 2))  # shorter, heavier
            assert gen.canonical[-1].num == before - 2
            await all_at_head("reorg to a shorter, heavier chain")
            write_blocks(redis_client, STREAM, gen.take(2))
            await all_at_head("blocks after the shorter chain")
            stored = sluice_canonical(redis_url, settings.lake.uri)
            assert stored == {b.num: "0x" + b.hash.hex() for b in gen.canonical}
            for first, proc in consumers.items():
                check_chain(proc, gen, first, stored)
            # Reorgs are sent as the library's own producer sends them (the heavier
            # branch, no ``reorg`` result): its processor reports them in Removed().
            assert [line for line in from_zero.lines if line["event"] == "reorg"] == []
            for proc in (from_zero, from_right):
                added, removed = go_added_removed(proc)
                assert len(removed) == 1 + 2 + 3 + 4 + 5 + 4
                assert removed == added - {b["hash"] for b in go_chain(proc)}
            wrong = [line for line in from_wrong.lines if line["event"] == "reorg"][0]
            assert wrong == {
                "event": "reorg",
                "num": 16,
                "hash": "0x" + gen.canonical[16].hash.hex(),
            }  # the rewind is announced: the block below the first one sent


# --- Sluice's consumer in the cardinal dialect ------------------------------------------


class Follower:
    """Sluice's consumer library in a task, its chain kept as num -> block."""

    def __init__(self, url: str, from_num: int = 0, from_hash: bytes | None = None) -> None:
        self.state: dict[int, Block] = {}
        self.removed = 0
        self._changed = asyncio.Event()
        self._task = asyncio.create_task(self._run(url, from_num, from_hash))

    async def _run(self, url: str, from_num: int, from_hash: bytes | None) -> None:
        updates = subscribe(url, from_num, from_hash, dialect="cardinal", retry_delay_s=0.05)
        try:
            async for update in updates:
                if isinstance(update, Added):
                    self.state[update.block.num] = update.block
                else:
                    assert isinstance(update, Removed)
                    gone = self.state.pop(update.num, None)  # None: the block it started from
                    assert gone is None or gone.hash == update.hash
                    self.removed += 1
                self._changed.set()
        finally:
            await updates.aclose()  # type: ignore[attr-defined]

    async def wait_head(self, head: Block, what: str, wait_s: float = 30) -> None:
        def done() -> bool:
            top = max(self.state, default=-1)
            return top == head.num and self.state[top].hash == head.hash

        try:
            async with asyncio.timeout(wait_s):
                while not done():
                    if self._task.done():
                        self._task.result()
                        raise AssertionError(f"{what}: the consumer ended")
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            raise AssertionError(f"{what}: head {max(self.state, default=None)}") from None

    def check(self, gen: SyntheticChain, first: int) -> None:
        assert sorted(self.state) == list(range(first, gen.canonical[-1].num + 1))
        for block in gen.canonical[first:]:
            got = self.state[block.num]
            assert (got.hash, got.parent, got.weight) == (block.hash, block.parent, block.weight)
            assert _merged(got) == _merged(block)

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


def _command(block: Block) -> dict[str, Any]:
    """The Go producer's ``block`` command for ``block``."""
    return {
        "op": "block",
        "num": block.num,
        "hash": "0x" + block.hash.hex(),
        "parent": "0x" + block.parent.hex(),
        "weight": hex(effective_weight(block.num, block.weight)),
        "values": {k: "0x" + v.hex() for k, v in block.updates.items()},
        "deletes": list(block.deletes),
        "batches": {p: "0x" + i.hex() for p, i in block.batches.items()},
        "subbatches": {
            "0x" + s.id.hex(): {
                "values": {k: "0x" + v.hex() for k, v in s.updates.items()},
                "deletes": list(s.deletes),
            }
            for s in block.subbatches
        },
    }


async def _produce(producer: GoProcess, blocks: list[Block], ancestor: Block | None = None) -> None:
    """Send ``blocks`` (after a ``reorg`` naming ``ancestor`` when given); wait until taken."""
    commands = [_command(b) for b in blocks]
    if ancestor is not None:
        commands.insert(0, {"op": "reorg", "num": ancestor.num, "hash": "0x" + ancestor.hash.hex()})
    before = len(producer.lines)
    for command in commands:
        await producer.send(command)
    await producer.wait_for(lambda: len(producer.lines) >= before + len(commands), 10, "produce")
    assert all(line == {"event": "ok"} for line in producer.lines[before:]), producer.lines[before:]


async def _listening(port: int, wait_s: float = 10) -> None:
    async with asyncio.timeout(wait_s):
        while True:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                await asyncio.sleep(0.05)
                continue
            writer.close()
            await writer.wait_closed()
            return


async def _reorgs(gen: SyntheticChain, apply: Any, followers: list[Follower]) -> None:
    """Reorgs of depth 1 to 5, one to a shorter, heavier chain, a block after each."""
    steps: list[tuple[str, int, int | None]] = [(f"depth {d}", d, None) for d in range(1, 6)]
    steps.append(("shorter, heavier", 4, 2))
    for what, depth, length in steps:
        ancestor = gen.canonical[-depth - 1]
        await apply(gen.reorg(depth, length), ancestor)
        for follower in followers:
            await follower.wait_head(gen.canonical[-1], f"reorg {what}")
        await apply(gen.take(1), None)
        for follower in followers:
            await follower.wait_head(gen.canonical[-1], f"block after the reorg {what}")


async def test_go_producer_feeds_sluice_consumer_and_cli(go_run, settings) -> None:
    gen = SyntheticChain(seed=62, prefixes=("s/", "t/"))
    port = free_port()
    async with go_run("producer", "-port", str(port), "-threshold", "8") as producer:
        await _listening(port)
        await _produce(producer, gen.take(20))
        url = f"ws://127.0.0.1:{port}"
        wrong = Follower(url, 10, b"\x77" * 32)  # the producer rewinds to 2
        followers = [Follower(url), Follower(url, 10, gen.canonical[10].hash), wrong]
        try:
            for follower in followers:
                await follower.wait_head(gen.canonical[-1], "catch-up")

            async def apply(blocks: list[Block], ancestor: Block | None) -> None:
                await _produce(producer, blocks, ancestor)

            await _reorgs(gen, apply, followers)
            for follower, first in zip(followers, (0, 11, 2), strict=True):
                follower.check(gen, first)
            assert followers[0].removed > 0
        finally:
            for follower in followers:
                await follower.close()

        count = gen.canonical[-1].num + 1
        env = {**os.environ, "SLUICE_LOG_LEVEL": "WARNING"}
        cli = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "pipeline.cli", "subscribe", "--dialect", "cardinal",
            "--url", url, "--count", str(count),
            env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            async with asyncio.timeout(60):
                out, err = await cli.communicate()
        except TimeoutError:
            raise AssertionError(
                f"sluice subscribe: no end within 60 s (producer exit code "
                f"{producer.proc.returncode})"
            ) from None
        finally:
            if cli.returncode is None:
                cli.kill()
                await cli.communicate()
        assert cli.returncode == 0, err.decode()
        lines = [json.loads(line) for line in out.decode().splitlines()]
        assert [(line["added"], line["hash"]) for line in lines] == [
            (b.num, "0x" + b.hash.hex()) for b in gen.canonical
        ]
        assert [line["weight"] for line in lines] == [hex(b.weight or 0) for b in gen.canonical]


async def test_sluice_consumer_follows_sluice_serve_in_the_cardinal_dialect(
    settings, serve, redis_client
) -> None:
    gen = SyntheticChain(seed=63)
    write_lake(settings.lake.uri, gen.take(10))
    write_blocks(redis_client, STREAM, gen.take(10))
    async with serve(settings) as (base, _app):
        url = base.replace("http://", "ws://") + "/cardinal"
        followers = [Follower(url), Follower(url, 15, b"\x66" * 32)]  # a rewind to 7
        try:
            for follower in followers:
                await follower.wait_head(gen.canonical[-1], "catch-up")

            async def apply(blocks: list[Block], ancestor: Block | None) -> None:
                write_blocks(redis_client, STREAM, blocks)

            await _reorgs(gen, apply, followers)
            followers[0].check(gen, 0)
            followers[1].check(gen, 15 - settings.lake.reorg_threshold)
        finally:
            for follower in followers:
                await follower.close()


async def test_go_consumer_resumes_after_a_server_restart(settings, go_run, redis_client) -> None:
    gen = SyntheticChain(seed=64)
    write_blocks(redis_client, STREAM, gen.take(10))
    server = TestServer(create_app(settings), host="127.0.0.1", shutdown_timeout=5)
    await server.start_server()
    port = server.port
    restarted: TestServer | None = None
    try:
        async with go_run("consumer", "-url", f"ws://127.0.0.1:{port}/cardinal") as proc:
            await proc.wait_for(lambda: at_head(proc, gen.canonical[-1]), 30, "catch-up")
            await server.close()  # the library redials by itself, from its last block
            write_blocks(redis_client, STREAM, gen.take(3) + gen.reorg(2))
            restarted = TestServer(
                create_app(settings), host="127.0.0.1", port=port, shutdown_timeout=5
            )
            await restarted.start_server()
            await proc.wait_for(lambda: at_head(proc, gen.canonical[-1]), 30, "after restart")
            stored = {b.num: "0x" + b.hash.hex() for b in gen.canonical}
            check_chain(proc, gen, 0, stored)
    finally:
        await server.close()
        if restarted is not None:
            await restarted.close()
