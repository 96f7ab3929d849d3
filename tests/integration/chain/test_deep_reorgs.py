"""Reorgs of any depth reach live and resuming subscribers as the heaviest chain (issue 30).

Each case writes a chain into Redis with a subscriber following it live, then a
heavier branch forking far below the head (deeper than the reorg threshold,
deeper than what a subscriber's fork choice holds): shorter than what it
replaces, and longer. The subscriber must get the new branch from its first
block, right after the common ancestor, as soon as the branch is heaviest, and
end on the heaviest chain. A subscriber resuming from a replaced block starts
exactly at the fork point.
"""

from __future__ import annotations

import asyncio

import pytest

from pipeline.chain.produce.generator import SyntheticChain, write_blocks

from .conftest import STREAM, apply_updates

pytestmark = pytest.mark.asyncio


def apply(state: dict[int, bytes], blocks) -> None:
    """A block at or below the head replaces every height from its own up."""
    for block in blocks:
        for height in [n for n in state if n >= block.num]:
            del state[height]
        state[block.num] = block.hash


def check_links(state: dict[int, bytes], gen: SyntheticChain) -> None:
    canonical = {b.num: b.hash for b in gen.canonical}
    assert max(state) == max(canonical)
    wrong = [n for n in canonical if state.get(n) != canonical[n]]
    assert not wrong, f"{len(wrong)} heights differ from the heaviest chain, first {wrong[:5]}"


@pytest.mark.parametrize(
    ("depth", "length"),
    [(200, 3), (100, 101), (150, 1), (9, 2)],
    ids=["shorter-200", "longer-100", "one-block-150", "past-threshold-9"],
)
async def test_live_subscriber_follows_a_deep_reorg(
    settings, serve, connect, redis_client, depth, length
) -> None:
    gen = SyntheticChain(seed=depth * 7 + length)
    first = gen.take(300)
    write_blocks(redis_client, STREAM, first)
    async with serve(settings) as (base, _app), connect(base) as client:
        await client.subscribe(299, first[-1].hash)
        assert [b.num for b in await client.blocks(1)] == [299]  # (the block it names, first)
        state = {b.num: b.hash for b in first}
        results: list[dict] = []
        branch = gen.reorg(depth, length)
        write_blocks(redis_client, STREAM, branch)
        got = await client.blocks(len(branch), wait_s=4, results=results)
        apply(state, got)
        assert [b.num for b in got] == [b.num for b in branch]
        check_links(state, gen)
        # and the chain goes on from the new head
        more = gen.take(3)
        write_blocks(redis_client, STREAM, more)
        apply(state, await client.blocks(3, wait_s=4))
        check_links(state, gen)


@pytest.mark.parametrize("depth", [100, 250])
async def test_resume_from_a_deeply_replaced_block_starts_at_the_fork(
    settings, serve, connect, redis_client, depth
) -> None:
    gen = SyntheticChain(seed=depth)
    first = gen.take(300)
    write_blocks(redis_client, STREAM, first)
    fork = 300 - depth  # the first replaced height
    branch = gen.reorg(depth, depth + 1)
    write_blocks(redis_client, STREAM, branch)
    async with serve(settings) as (base, _app), connect(base) as client:
        await client.subscribe(299, first[-1].hash)  # the old head, replaced
        got = await client.blocks(len(branch), wait_s=4)
    assert [b.num for b in got] == list(range(fork, fork + depth + 1))
    assert got == branch


async def test_a_block_whose_height_lies_is_set_aside_and_the_chain_goes_on(
    settings, serve, connect, redis_client
) -> None:
    """`sluice produce` once wrote block 273 as the child of 2892: serve sets such a block
    aside (and its descendants), counts it, says so in /healthz, and serves the chain it
    would have extended, to live and catching-up subscribers alike."""
    import aiohttp

    from pipeline.blockcodec import Block

    gen = SyntheticChain(seed=41)
    first = gen.take(40)
    write_blocks(redis_client, STREAM, first[:30])
    liar = Block(num=5, hash=b"\x11" * 32, parent=first[29].hash, weight=10_000)
    child = Block(num=6, hash=b"\x12" * 32, parent=liar.hash, weight=10_001)
    async with serve(settings) as (base, _app), connect(base) as live:
        await live.subscribe(29, first[29].hash)
        assert [b.num for b in await live.blocks(1)] == [29]
        write_blocks(redis_client, STREAM, [liar, child, *first[30:]])
        got = await live.blocks(10, wait_s=4)
        assert got == first[30:40]  # never 5 and 6, no reorg back to them
        async with connect(base) as late:  # a catch-up reads the same entries from the tail
            await late.subscribe(25, first[25].hash)
            assert await late.blocks(15, wait_s=4) == first[25:40]
        async with aiohttp.ClientSession() as session:
            async with session.get(base + "/healthz") as reply:
                health = await reply.json()
                assert reply.status == 200, health  # degraded, still serving
            async with session.get(base + "/metrics") as reply:
                metrics = await reply.text()
        assert health["status"] == "degraded" and "block 5" in health["chain_error"], health
        assert health["blocks_set_aside"] == 2
        assert "sluice_serve_bad_heights_total 2" in metrics


async def test_resume_across_the_seam_when_the_lake_has_not_seen_the_reorg(
    settings, serve, connect, redis_client
) -> None:
    """The lake marked 0..118 canonical; since then Redis got 118' and a shorter, heavier
    branch forking at 104, in the lake only. A subscriber at 118' (replaced) resumes from
    105, not from above the lake's stale head, and ends on the heaviest chain."""
    from tests.integration.chain.conftest import write_lake

    gen = SyntheticChain(seed=2)
    first = gen.take(119)
    write_lake(settings.lake.uri, first)
    again = gen.reorg(1, 1)  # 118'
    write_blocks(redis_client, STREAM, again)
    branch = gen.reorg(14, 6)  # 105'..110', heavier than 118'
    write_blocks(redis_client, STREAM, branch)
    async with serve(settings) as (base, _app), connect(base) as client:
        await client.subscribe(118, again[0].hash)
        got = await client.blocks(6, wait_s=4)
    assert got == branch


async def test_the_library_follows_deep_reorgs_through_a_redial(
    settings, serve, go_run, redis_client
) -> None:
    """cardinal-streams' own consumer, live, through reorgs deeper than the threshold (8 here)
    to shorter and longer branches: Sluice closes its connection (1012), it redials from its
    last block and gets the reorg first, then the new branch; it ends on the heaviest chain."""
    from tests.integration.chain.test_cardinal_go import at_head, go_chain

    gen = SyntheticChain(seed=77)
    write_blocks(redis_client, STREAM, gen.take(200))
    async with serve(settings) as (base, app):
        url = base.replace("http://", "ws://") + "/cardinal"
        head = gen.canonical[-1]
        args = ["-from", str(head.num), "-hash", "0x" + head.hash.hex(), "-weight",
                hex(head.num + 1), "-threshold", "8"]  # fmt: skip
        async with go_run("consumer", "-url", url, *args) as go:
            await go.wait_for(lambda: any(x["event"] == "ready" for x in go.lines), 30, "ready")
            for depth, length in [(40, 3), (30, 31), (9, 9)]:
                write_blocks(redis_client, STREAM, gen.reorg(depth, length))
                write_blocks(redis_client, STREAM, gen.take(1))
                what = f"reorg of {depth} to {length}"
                await go.wait_for(lambda: at_head(go, gen.canonical[-1]), 30, what)
            chain = go_chain(go)  # from its last block down its parents: the heaviest chain
            canonical = {b.num: "0x" + b.hash.hex() for b in gen.canonical}
            assert len(chain) >= 30 and chain[-1]["num"] == gen.canonical[-1].num
            assert all(canonical[b["num"]] == b["hash"] for b in chain)
            reorgs = [line["num"] for line in go.lines if line["event"] == "reorg"]
            assert len(reorgs) >= 3, go.lines[-5:]
    from pipeline.chain.serve.appkeys import METRICS

    assert app[METRICS].values["sluice_serve_reorg_reconnects_total"] >= 3


async def test_sluice_client_follows_a_reorg_below_where_it_started(
    settings, serve, redis_client
) -> None:
    """Sluice's own client (seed dialect) started at 250 remembers nothing below it; a shorter,
    heavier branch forking at 120 must still replace 121..299 (it took the branch's first
    block, below its memory, for a stale duplicate and held the rest forever)."""
    from pipeline.chain.client.consumer import subscribe

    gen = SyntheticChain(seed=78)
    first = gen.take(300)
    write_blocks(redis_client, STREAM, first)
    state: dict[int, bytes] = {250: first[250].hash}  # (the block it has)
    async with serve(settings) as (base, _app):
        url = base.replace("http://", "ws://") + "/ws"
        updates = subscribe(url, 250, first[250].hash)
        try:
            async with asyncio.timeout(10):
                await apply_updates(updates, state, lambda b: b.num == 299)
                write_blocks(redis_client, STREAM, gen.reorg(179, 5))  # 121..125
                head = gen.canonical[-1].hash
                await apply_updates(updates, state, lambda b: b.hash == head)
        finally:
            await updates.aclose()  # type: ignore[attr-defined]
    assert state == {b.num: b.hash for b in gen.canonical if b.num >= 121}


async def test_a_cardinal_subscribe_redis_cannot_answer_closes_the_connection(
    settings, serve, redis_factory
) -> None:
    """cardinal-streams waits for a subscription id forever after an error reply (a consumer
    joining while serve's Redis link was cut stayed silent in a checker seed): the error reply
    is followed by a close (1013), on which the library redials."""
    import dataclasses

    import aiohttp
    import redis

    server = redis_factory()
    with redis.Redis.from_url(server.url) as client:
        write_blocks(client, STREAM, SyntheticChain(seed=80).take(20))
    moved = dataclasses.replace(settings, redis=dataclasses.replace(settings.redis, url=server.url))
    async with serve(moved) as (base, _app):
        server.stop()
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(base.replace("http://", "ws://") + "/cardinal") as ws,
        ):
            params = ["streams", "0x3", "0x" + "77" * 32]
            await ws.send_json({"jsonrpc": "2.0", "id": 1, "method": "cardinal_subscribe",
                                "params": params})  # fmt: skip
            reply = await ws.receive_json(timeout=30)
            assert "error" in reply, reply
            closing = await ws.receive(timeout=10)
            assert closing.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
            assert ws.close_code == 1013, (closing, ws.close_code)
