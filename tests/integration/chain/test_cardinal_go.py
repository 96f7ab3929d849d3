"""The real cardinal-streams library (Go, v1.5.1, built from tests/go) and Sluice, both ways.

Its own websocket consumer (``transports.ResolveConsumer`` with a ``ws://``
URL) follows ``sluice serve``'s ``/cardinal`` endpoint: from block 0, from N
with the right hash, from N with a wrong hash, through reorgs of depth 1 to 5
and one to a shorter, heavier chain. Each must fire ``Ready()`` and end with
the canonical chain Sluice holds in Redis and the lake, parent-linked, no gap.
"""

from __future__ import annotations

from typing import Any

import redis

from pipeline import keys
from pipeline.chain.batch import ENTRY_FIELD, Block, decode_block, effective_weight
from pipeline.chain.generator import SyntheticChain, write_blocks
from pipeline.chain.resumption import TailIndex
from pipeline.lake.reader import LakeReader
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
    write_lake(settings.lake_uri, blocks[:20])
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
            consumers = {0: from_zero, 26: from_right, 25 - settings.reorg_threshold: from_wrong}

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
            stored = sluice_canonical(redis_url, settings.lake_uri)
            assert stored == {b.num: "0x" + b.hash.hex() for b in gen.canonical}
            for first, proc in consumers.items():
                check_chain(proc, gen, first, stored)
            reorgs = [line for line in from_zero.lines if line["event"] == "reorg"]
            assert len(reorgs) >= 6  # one per reorg, each naming the common ancestor
            wrong = [line for line in from_wrong.lines if line["event"] == "reorg"][0]
            assert wrong == {
                "event": "reorg",
                "num": 16,
                "hash": "0x" + gen.canonical[16].hash.hex(),
            }  # the rewind is announced: the block below the first one sent
