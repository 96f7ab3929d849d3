"""A subscriber at the head joins the live feed without replaying Redis when the feed covers it."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from pipeline import keys
from pipeline.chain.history.tail import RedisTail, SharedTail
from pipeline.chain.produce.generator import SyntheticChain, write_blocks
from pipeline.chain.serve.appkeys import HUB
from tests.support.poll import until

from .conftest import STREAM


def _count_replays(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every ``RedisTail.after`` call (a replay page read) from now on, by its start id."""
    calls: list[bytes] = []
    real = RedisTail.after

    async def counted(self: RedisTail, last_id: bytes, count: int) -> Any:
        calls.append(last_id)
        return await real(self, last_id, count)

    monkeypatch.setattr(RedisTail, "after", counted)
    return calls


def _count_refreshes(monkeypatch: pytest.MonkeyPatch) -> list[None]:
    """Every refresh of the shared tail index from now on."""
    calls: list[None] = []
    real = SharedTail.refresh

    async def counted(self: SharedTail) -> None:
        calls.append(None)
        await real(self)

    monkeypatch.setattr(SharedTail, "refresh", counted)
    return calls


async def test_a_subscribe_at_the_head_reads_no_replay_and_misses_no_block(
    settings, serve, connect, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    chain = SyntheticChain(seed=11)
    write_blocks(redis_client, STREAM, chain.take(20))
    head_id = redis_client.xrevrange(keys.stream(STREAM), count=1)[0][0]
    async with serve(settings) as (base, app), connect(base) as client:
        hub = app[HUB]
        await until(lambda: hub.read_to == head_id, "the live tailer read up to the head")
        replays, refreshes = _count_replays(monkeypatch), _count_refreshes(monkeypatch)
        await client.subscribe(19, chain.canonical[19].hash)
        got = await client.blocks(1)
        write_blocks(redis_client, STREAM, chain.take(5))
        got += await client.blocks(5)
        assert replays == []  # before: two reads of Redis after the head, both empty
        assert refreshes == []  # before: one, finding nothing new
    assert got == chain.canonical[19:25]
    assert hub.read_to is None  # the tailer ended with the server: nothing is covered


async def test_a_feed_ahead_of_the_subscribers_tail_snapshot_still_replays(
    settings, serve, connect, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    chain = SyntheticChain(seed=12)
    write_blocks(redis_client, STREAM, chain.take(20))
    entries = redis_client.xrange(keys.stream(STREAM))
    async with serve(settings) as (base, app), connect(base) as client:
        hub = app[HUB]
        await until(lambda: hub.read_to == entries[-1][0], "the live tailer read up to the head")
        # as if the feed had published entries the subscriber's tail snapshot will not hold
        hub.read_to = b"%d-0" % (2**62)
        replays = _count_replays(monkeypatch)
        await client.subscribe(19, chain.canonical[19].hash)
        got = await client.blocks(1)
        write_blocks(redis_client, STREAM, chain.take(5))
        got += await client.blocks(5)
        assert replays  # the subscribe read Redis after its tail snapshot
    assert got == chain.canonical[19:25]


async def test_a_block_newer_than_the_tail_index_is_found_by_a_refresh(
    settings, serve, connect, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The index is used as it is only for a block it holds: else it is refreshed first."""
    chain = SyntheticChain(seed=13)
    write_blocks(redis_client, STREAM, chain.take(20))
    indexed = redis_client.xrevrange(keys.stream(STREAM), count=1)[0][0]
    async with serve(settings) as (base, app), connect(base) as client:
        hub = app[HUB]
        await until(lambda: hub.read_to == indexed, "the live tailer read up to the head")
        write_blocks(redis_client, STREAM, chain.take(5))  # not in the tail index yet
        head = redis_client.xrevrange(keys.stream(STREAM), count=1)[0][0]
        await until(lambda: hub.read_to == head, "the live tailer read the new blocks")
        hub.read_to = indexed  # as if the feed had published no further than the index
        refreshes = _count_refreshes(monkeypatch)
        await client.subscribe(24, chain.canonical[24].hash)
        got = await client.blocks(1)
        assert refreshes  # the block was not in the index: looked for again, found
    assert got == chain.canonical[24:25]  # where the subscriber is, not a rewind below it
