"""The lake's canonical flags lag the Redis tail: a tie the canonical job marked the other way.

History checker seed 1028: ``sluice produce`` wrote a branch 16'..20' exactly as
heavy as 16..20; the archive wrote both, the canonical job marked the one seen
first (16..20); trim took both out of Redis; then 21, a child of 20', made the
other branch the heaviest. Redis now starts at 21, whose parent the lake does
not mark canonical. A consumer resuming at 20 matched the lake's stale flag,
the tail did not link to what it was sent, and it went quiet for good.

Here the lake holds 0..20 and 16'..20' (the first marked), Redis holds 21..25
on 20'. Every consumer must end on 0..15, 16'..20', 21..25: from below the fork
(catch-up), from the replaced 20 (a resume), from 18' (a block the lake does not
mark), in both dialects, through Sluice's client and the real Go library.
"""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from pipeline.blockcodec import Block
from pipeline.chain.client.consumer import subscribe
from pipeline.chain.produce.generator import write_blocks
from tests.integration.chain.conftest import STREAM, apply_updates, write_lake

pytestmark = pytest.mark.asyncio

FORK = 16  # the first height of the tie


def _block(num: int, parent: bytes, tag: str, weight: int) -> Block:
    digest = hashlib.sha256(f"{tag}:{num}".encode()).digest()
    return Block(num=num, hash=digest, parent=parent, updates={"k": tag.encode()}, weight=weight)


def _chain(start: int, stop: int, parent: bytes, tag: str, extra: int = 0) -> list[Block]:
    """Blocks ``start..stop-1`` weighing ``num + 1 + extra`` each."""
    out = []
    for num in range(start, stop):
        out.append(_block(num, parent, tag, num + 1 + extra))
        parent = out[-1].hash
    return out


@pytest.fixture
def tie(settings, redis_client) -> tuple[list[Block], list[Block], list[Block]]:
    """(the heaviest chain 0..25, the replaced 16..20, the Redis tail 21..25), written."""
    base = _chain(0, FORK, b"\0" * 32, "base")
    old = _chain(FORK, 21, base[-1].hash, "old")  # marked canonical: seen first
    new = _chain(FORK, 21, base[-1].hash, "new")  # as heavy: not marked
    tail = _chain(21, 26, new[-1].hash, "tail")  # 21 on 20': the new branch is the heaviest
    write_lake(settings.lake.uri, base + old + new, {b.hash for b in base + old})
    write_blocks(redis_client, STREAM, tail)
    return base + new + tail, old, tail


def _hashes(blocks: list[Block]) -> dict[int, bytes]:
    return {b.num: b.hash for b in blocks}


@pytest.mark.parametrize(
    ("start", "which"),
    [(10, "base"), (20, "old"), (18, "new")],
    ids=["catch-up-below-the-fork", "resume-at-the-replaced-20", "resume-at-18-unmarked"],
)
async def test_a_cardinal_consumer_ends_on_the_branch_the_tail_extends(
    settings, serve, connect, tie, start, which
) -> None:
    heaviest, old, _tail = tie
    named = old[start - FORK] if which == "old" else heaviest[start]
    state: dict[int, bytes] = {start: named.hash}
    async with serve(settings) as (base, _app), connect(base) as client:
        await client.subscribe(start, named.hash)
        async with asyncio.timeout(10):
            while state.get(25) != heaviest[25].hash:
                for block in await client.blocks(1, wait_s=10):
                    for height in [n for n in state if n >= block.num]:
                        del state[height]  # a block at or below the head replaces from its height
                    state[block.num] = block.hash
    want = {n: h for n, h in _hashes(heaviest).items() if n >= min(state)}
    assert state == want, sorted(n for n in want if state.get(n) != want[n])


async def test_sluice_client_resuming_at_the_replaced_block_gets_the_new_branch(
    settings, serve, tie
) -> None:
    """The seed dialect (``sluice subscribe``'s client): removed 16..20, added 16'..25."""
    heaviest, old, _tail = tie
    state: dict[int, bytes] = {b.num: b.hash for b in heaviest[:FORK] + old}
    async with serve(settings) as (base, _app):
        updates = subscribe(base.replace("http://", "ws://") + "/ws", 20, old[-1].hash)
        try:
            async with asyncio.timeout(10):
                await apply_updates(updates, state, lambda b: b.num == 25)
        finally:
            await updates.aclose()  # type: ignore[attr-defined]
    assert state == _hashes(heaviest)


async def test_get_block_below_the_tail_answers_the_branch_the_tail_extends(
    settings, serve, connect, tie
) -> None:
    heaviest, _old, _tail = tie
    async with serve(settings) as (base, _app), connect(base) as client:
        reply = await client.call("cardinal_getBlock", [hex(18)])
    assert reply["result"][0]["hash"] == "0x" + heaviest[18].hash.hex(), reply


async def test_the_library_resuming_at_the_replaced_block_ends_on_the_heaviest_chain(
    settings, serve, go_run, tie
) -> None:
    """cardinal-streams' own consumer, from the replaced 20 (its hash and weight)."""
    from tests.integration.chain.test_cardinal_go import at_head, go_chain

    heaviest, old, _tail = tie
    async with serve(settings) as (base, _app):
        url = base.replace("http://", "ws://") + "/cardinal"
        args = ["-from", "20", "-hash", "0x" + old[-1].hash.hex(), "-weight", hex(21)]
        async with go_run("consumer", "-url", url, *args, "-threshold", "8") as go:
            await go.wait_for(lambda: at_head(go, heaviest[25]), 30, "the tail's head")
            chain = go_chain(go)
    assert [b["hash"] for b in chain] == ["0x" + b.hash.hex() for b in heaviest[-len(chain) :]]
    assert chain[0]["num"] <= FORK, chain[:3]


async def _replay(settings, redis_url: str, sender, *, tail: bool = False) -> list:
    """Replay Redis's entries to ``sender`` as serve does after a catch-up (the lake read
    through a real LakeReader); the blocks it sends."""
    import redis.asyncio as aioredis

    from pipeline import keys
    from pipeline.chain.history.entries import Refusals
    from pipeline.chain.history.replay import Replay
    from pipeline.chain.history.tail import RedisTail, SharedTail
    from pipeline.chain.history.turns import Turns
    from pipeline.lake.storage.reader import LakeReader
    from tests.integration.chain.conftest import CollectingSink

    client = aioredis.Redis.from_url(redis_url)
    try:
        refused = Refusals()
        replay = Replay(
            stream=STREAM,
            entries=RedisTail(client, keys.stream(STREAM), refused),
            turns=Turns(),
            refused=refused,
            reorg_threshold=8,
            tail=SharedTail(client, keys.stream(STREAM)) if tail else None,
        )
        sink = CollectingSink()
        await replay.run(LakeReader(settings.lake.uri), b"0-0", None, sink, sender)
        return sink.blocks
    finally:
        await client.aclose()


def _sent(blocks: list[Block]):
    from pipeline.chain.forkchoice import Sender
    from pipeline.chain.planning import Emit

    sender = Sender(blocks[0].num)
    sender.extend([Emit(b.num, b.hash.hex(), b.parent.hex(), [], 0, b.num + 1) for b in blocks])
    return sender


async def test_replay_sends_the_branch_the_lake_marked_late(settings, redis_url, tie) -> None:
    """A subscriber sent 10..20 (the lake's stale flags) when 21..25 come from Redis in
    production order (the entries trimmed since its plan): 21's parent is in the lake,
    not marked; it is no lost branch (heavier than the lake's head), so 16'..20' are read
    by hash and sent with 21 as a reorg, not dropped with every block after them."""
    heaviest, old, _tail = tie
    sender = _sent(heaviest[10:FORK] + old)
    sent = await _replay(settings, redis_url, sender)
    assert [(e.num, e.hash) for e in sent] == [(b.num, b.hash.hex()) for b in heaviest[FORK:]]
    assert sent[0].reorg == 5


@pytest.mark.parametrize("tail", [False, True], ids=["lake-flags", "tail-index"])
async def test_replay_still_drops_a_branch_that_lost(
    settings, redis_url, redis_client, tail
) -> None:
    """The same shape, but the lake marks a heavier chain (16..24): 21 on 20' lost, never sent."""
    base = _chain(0, FORK, b"\0" * 32, "base")
    won = _chain(FORK, 25, base[-1].hash, "won")
    lost = _chain(FORK, 21, base[-1].hash, "lost")
    write_lake(settings.lake.uri, base + won + lost, {b.hash for b in base + won})
    write_blocks(redis_client, STREAM, _chain(21, 23, lost[-1].hash, "child"))
    sender = _sent(base[10:] + won)
    assert await _replay(settings, redis_url, sender, tail=tail) == []
    assert sender.head == 24


async def test_replay_follows_a_longer_branch_revived_past_a_shorter_heavier_one(
    settings, redis_url, redis_client
) -> None:
    """The lake marks a shorter, heavier branch 16'..18' and holds the longer 16..20 unmarked:
    nothing is marked at 20. Then 21, a child of 20 in Redis, outweighs 18': the tail index
    has it on its heaviest chain, so 16..21 are sent as a reorg (by the lake's flags alone,
    21 and everything after it were dropped as lost)."""
    base = _chain(0, FORK, b"\0" * 32, "base")
    short = _chain(FORK, 19, base[-1].hash, "short", extra=10)  # 18' weighs 29
    long = _chain(FORK, 21, base[-1].hash, "long")  # 20 weighs 21
    write_lake(settings.lake.uri, base + short + long, {b.hash for b in base + short})
    revived = _chain(21, 23, long[-1].hash, "revived", extra=10)  # 21 weighs 32
    write_blocks(redis_client, STREAM, revived)
    sender = _sent(base[10:] + short)
    sent = await _replay(settings, redis_url, sender, tail=True)
    assert [e.hash for e in sent] == [b.hash.hex() for b in long + revived]
    assert sent[0].reorg == 3
