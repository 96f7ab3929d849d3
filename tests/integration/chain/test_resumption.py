"""Resumption across the lake, the Redis tail and live data; reorg starts."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import redis

from pipeline import keys
from pipeline.blockcodec import ENTRY_FIELD, decode_block
from pipeline.chain.client.ordered import Added, OrderedChain
from pipeline.chain.history.resumption import TieredResumption
from pipeline.chain.produce.generator import SyntheticChain, write_blocks
from pipeline.chain.produce.producer import WebsocketHub
from pipeline.lake.storage.reader import LakeReader
from pipeline.redisio.conn import Role, connect
from tests.support.poll import until

from .conftest import STREAM, CollectingSink, write_lake


def final_state(chain: OrderedChain, blocks) -> dict[int, bytes]:
    state: dict[int, bytes] = {}
    for block in blocks:
        for update in chain.accept(block):
            if isinstance(update, Added):
                state[update.block.num] = update.block.hash
            else:
                state.pop(update.num, None)
    return state


async def _until_ready(work, sink: CollectingSink) -> None:
    """Run a subscription until its sink is live (or it fails: then its error), then cancel it."""
    task = asyncio.create_task(work)
    try:
        await until(lambda: sink.head is not None or task.done(), within_s=30)
        if task.done():
            task.result()  # the failure, if it failed
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_no_gap_no_duplicate_while_producing_archiving_and_trimming(
    settings, serve, connect, redis_client: redis.Redis
) -> None:
    gen = SyntheticChain(seed=11, reorg_every=15, reorg_depth=3)
    key = keys.stream(STREAM)
    write_blocks(redis_client, STREAM, gen.take(60))
    done = asyncio.Event()

    async def produce() -> None:
        for _ in range(120):
            write_blocks(redis_client, STREAM, gen.step())
            await asyncio.sleep(0.004)
        done.set()

    async def archive_and_trim() -> None:
        # move everything but the last 20 entries to the lake, then trim Redis below it
        while not done.is_set():
            entries = redis_client.xrange(key, "-", "+")
            old = entries[:-20]
            if old:
                blocks = [decode_block(f[ENTRY_FIELD]) for _, f in old]
                final = {b.hash for b in gen.canonical}
                horizon = gen.canonical[-1].num - 5
                cut = next((i for i, b in enumerate(blocks) if b.num >= horizon), len(blocks))
                settled = blocks[:cut]  # a prefix in production order, final by now
                if settled:
                    write_lake(settings.lake.uri, settled, final)
                    last_id = old[len(settled) - 1][0].decode()
                    redis_client.xtrim(key, minid=last_id, approximate=False)  # keeps last_id
                    redis_client.xdel(key, last_id)
            await asyncio.sleep(0.05)

    async def subscriber(start: int) -> tuple[int, list]:
        async with connect(base) as client:
            await client.subscribe(start, gen.canonical[start].hash)
            got: list = []
            deadline = asyncio.get_running_loop().time() + 30
            while not (done.is_set() and got and got[-1].hash == gen.canonical[-1].hash):
                try:
                    got += await client.blocks(1, wait_s=0.5)
                except TimeoutError:
                    if asyncio.get_running_loop().time() > deadline:
                        raise AssertionError(
                            f"subscriber from {start} stalled at {[b.num for b in got[-5:]]}, "
                            f"head {gen.canonical[-1].num}"
                        ) from None
            return start, got

    async with serve(settings) as (base, _app):
        jobs = [asyncio.create_task(produce()), asyncio.create_task(archive_and_trim())]
        subs = []
        for start in (0, 5, 30, 55):
            subs.append(asyncio.create_task(subscriber(start)))
            await asyncio.sleep(0.1)
        results = await asyncio.wait_for(asyncio.gather(*subs), 60)
        await asyncio.gather(*jobs)
    assert redis_client.xlen(key) < 100, "the test must have archived and trimmed"
    canonical = {b.num: b.hash for b in gen.canonical}
    for start, got in results:
        pairs = [(b.num, b.hash) for b in got]
        assert len(pairs) == len(set(pairs)), f"subscriber from {start} got a duplicate"
        assert got[0].num == start
        oc = OrderedChain()
        state = final_state(oc, got)
        assert oc.unlinked == 0, f"subscriber from {start}: blocks that do not link: " + ", ".join(
            f"{a.num}:{a.hash.hex()[:4]} then {b.num}:{b.hash.hex()[:4]}<{b.parent.hex()[:4]}"
            for a, b in zip(got, got[1:], strict=False)
            if b.parent != a.hash
        )
        assert state == {n: h for n, h in canonical.items() if n >= start}, start


async def test_fork_point_from_the_lake(settings, serve, connect) -> None:
    gen = SyntheticChain(seed=12)
    canon = gen.take(30)
    side = SyntheticChain(seed=99)
    # an orphaned branch forked after block 19: heights 20..22
    orphans = []
    parent = canon[19].hash
    for num, b in zip(range(20, 23), side.take(25)[20:23], strict=True):
        orphan = type(b)(num=num, hash=b.hash, parent=parent)
        orphans.append(orphan)
        parent = orphan.hash
    write_lake(settings.lake.uri, canon + orphans, {b.hash for b in canon})
    async with serve(settings) as (base, _app), connect(base) as client:
        await client.subscribe(22, orphans[-1].hash)
        got = await client.blocks(10)
    assert [b.num for b in got] == list(range(20, 30))  # exact fork point, not 22 - 8
    assert got == canon[20:30]


async def test_fork_point_from_the_redis_tail(settings, serve, connect, redis_client) -> None:
    gen = SyntheticChain(seed=13)
    first = gen.take(30)
    write_lake(settings.lake.uri, first[:10])
    write_blocks(redis_client, STREAM, first[10:])
    orphan = first[27]
    # reorg at 26: blocks 26.. replaced
    del gen.canonical[26:]
    side = SyntheticChain(seed=5)
    parent = gen.canonical[-1].hash
    new = []
    for num in range(26, 31):
        b = side.take(1)[0]
        nb = type(b)(num=num, hash=b.hash, parent=parent, updates=b.updates, weight=num + 1)
        new.append(nb)
        parent = nb.hash
    write_blocks(redis_client, STREAM, new)
    async with serve(settings) as (base, _app), connect(base) as client:
        await client.subscribe(27, orphan.hash)
        got = await client.blocks(5)
    assert [b.num for b in got] == list(range(26, 31))
    assert got == new


async def test_unknown_hash_rewinds_by_the_threshold_once(
    settings, serve, connect, redis_client
) -> None:
    gen = SyntheticChain(seed=14)
    blocks = gen.take(40)
    write_lake(settings.lake.uri, blocks[:25])
    write_blocks(redis_client, STREAM, blocks[25:])
    async with serve(settings) as (base, _app):
        async with connect(base) as client:
            await client.subscribe(30, b"\x77" * 32)
            got = await client.blocks(18)
        assert [b.num for b in got] == list(range(22, 40))  # 30 - reorg_threshold (8)
        async with connect(base) as client:
            await client.subscribe(3, b"\x77" * 32)
            got = await client.blocks(2)
        assert [b.num for b in got] == [0, 1]  # clamped at 0
        async with connect(base) as client:  # a matching hash starts exactly there
            await client.subscribe(24, blocks[24].hash)
            got = await client.blocks(2)
        assert [b.num for b in got] == [24, 25]


async def test_lake_gap_is_reported(settings, serve, connect, redis_client) -> None:
    gen = SyntheticChain(seed=15)
    blocks = gen.take(40)
    write_lake(settings.lake.uri, blocks[:10])
    write_blocks(redis_client, STREAM, blocks[20:])  # 10..19 are nowhere
    async with serve(settings) as (base, _app), connect(base) as client:
        await client.subscribe(0, blocks[0].hash)
        got = await client.blocks(10)
        assert [b.num for b in got] == list(range(10))
        msg = await client.ws.receive(timeout=10)
    assert msg.type.name in ("CLOSE", "CLOSED", "CLOSING")
    assert client.ws.close_code == 1011
    assert "history gap" in (msg.extra or "")


@pytest.mark.parametrize("lost_length", [2, 3, 5])
async def test_a_lost_branch_behind_a_trim_is_no_history_gap(
    settings, redis_url, redis_client: redis.Redis, lost_length: int
) -> None:
    # After a plan was made, blocks 10A 11A (and more) were produced, then a heavier
    # branch 10B 11B 12B (...). The archive moved everything up to 10A to the lake (10A
    # as not canonical: it lost) and trimmed Redis there, so the next entry after the
    # plan's tail is 11A, whose parent only the lake knows, on the lost branch. 12A, a
    # child of 11A heavier than the head, is lost as well: sent, it would follow a
    # branch whose first block the subscriber never got (a gap; seen in CI).
    gen = SyntheticChain(seed=13)
    canon = gen.take(10)
    key = keys.stream(STREAM)
    write_blocks(redis_client, STREAM, canon)
    client = connect(redis_url, Role.SERVE)
    try:
        resumption = TieredResumption(
            redis=client,
            stream=STREAM,
            hub=WebsocketHub(),
            history_factory=lambda: LakeReader(settings.lake),
            reorg_threshold=8,
        )
        plan = await resumption.resolve(0, canon[0].hash, None)
        lost = gen.take(lost_length)
        won = gen.reorg(lost_length)
        write_blocks(redis_client, STREAM, lost + won)
        write_lake(settings.lake.uri, [*canon, lost[0]], {b.hash for b in canon})
        ten_a = redis_client.xrange(key, "-", "+")[10][0]
        redis_client.xtrim(key, minid=ten_a, approximate=False)
        redis_client.xdel(key, ten_a)
        sink = CollectingSink()
        await _until_ready(resumption.stream(plan, None, sink), sink)
    finally:
        await client.aclose()
    got = [(e.num, e.hash) for e in sink.blocks]
    assert got == [(b.num, b.hash.hex()) for b in [*canon, *won]]
    assert sink.head == won[-1].num


async def test_a_plan_from_the_lake_is_sent_in_the_subscribers_dialect(
    settings, redis_url, redis_client: redis.Redis
) -> None:
    """The first lake page a plan reads while checking the start's hash goes out as it is:
    it must be encoded for the subscriber. Resolved without the subscriber's encoding (a
    resumption again after a deep reorg did that), a cardinal subscriber got seed-shaped
    ``batch`` results, which the library cannot read (history checker seed 1009)."""
    from pipeline.chain.cardinal import CARDINAL, encoding_for

    gen = SyntheticChain(seed=14)
    canon = gen.take(60)
    write_lake(settings.lake.uri, canon)
    write_blocks(redis_client, STREAM, gen.take(5))  # 60..64 in Redis, the rest in the lake
    client = connect(redis_url, Role.SERVE)
    try:
        resumption = TieredResumption(
            redis=client,
            stream=STREAM,
            hub=WebsocketHub(),
            history_factory=lambda: LakeReader(settings.lake),
            reorg_threshold=8,
        )
        sink = CollectingSink()
        keep = encoding_for(None, CARDINAL, False)
        await _until_ready(resumption.blocks_from(10, canon[10].hash, keep, sink), sink)
    finally:
        await client.aclose()
    assert [e.num for e in sink.blocks] == list(range(10, 65))
    seed_shaped = [
        e.num for e in sink.blocks if not e.results[0].startswith('{"type":"batch","batch":')
    ]
    assert not seed_shaped, (
        f"{len(seed_shaped)} blocks not in the cardinal shape, first {seed_shaped[:5]}"
    )


async def test_a_replay_that_begins_above_the_plans_start_reads_the_gap_from_the_lake(
    settings, redis_url, redis_client: redis.Redis
) -> None:
    """A plan made on a stale tail index (its refresh skipped: catch-ups held the index)
    sends nothing from the tail; the entries after the index's last id were archived and
    trimmed meanwhile, so the first entry replayed is above the plan's start. With
    nothing sent yet it went out as the subscriber's first block: a gap (history
    checker seed 1068: a raw subscriber from 304 got 307 first)."""
    gen = SyntheticChain(seed=15)
    canon = gen.take(10)
    key = keys.stream(STREAM)
    write_blocks(redis_client, STREAM, canon[:5])
    client = connect(redis_url, Role.SERVE)
    try:
        resumption = TieredResumption(
            redis=client,
            stream=STREAM,
            hub=WebsocketHub(),
            history_factory=lambda: LakeReader(settings.lake),
            reorg_threshold=8,
        )
        await resumption.warm()  # the index holds 0..4
        write_blocks(redis_client, STREAM, canon[5:])
        write_lake(settings.lake.uri, canon)
        eight = redis_client.xrange(key, "-", "+")[8][0]
        redis_client.xtrim(key, minid=eight, approximate=False)  # 0..7 archived, trimmed
        # What a plan was when its refresh was skipped (catch-ups held the index): made on
        # the index as it was (a plan now refreshes again first, _fresh_index; the replay
        # must still never send a jump as the first block)
        tail = resumption._tail
        async with tail.reading() as index:
            plan = await resumption._locator._resolve(index, 7, canon[7].hash, None)
            plan.tail = tail.snapshot(plan.start)
        assert plan.start > plan.tail.hi, "the plan was to be made on the stale index"
        sink = CollectingSink()
        await _until_ready(resumption.stream(plan, None, sink), sink)
    finally:
        await client.aclose()
    got = [(e.num, e.hash) for e in sink.blocks]
    assert got == [(b.num, b.hash.hex()) for b in canon[plan.start :]]
    assert sink.head == 9
