"""The twin's lease and its fencing token (issue 31, item 1), and the replay memory's
epoch (item 2), at the level of the Redis steps: what a bus that lost its lease can no
longer write, and what a receiver that lost its data refuses."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis

from pipeline import keys
from pipeline.bus import lease
from pipeline.bus.lease import FENCE, LEASE, Lease
from pipeline.bus.store import SEEN_EPOCH, BusStore
from pipeline.errors import Fenced

pytestmark = pytest.mark.timeout(30)


async def test_a_second_owner_waits_then_takes_the_lapsed_lease_with_a_larger_token(redis_url):
    client = aioredis.Redis.from_url(redis_url)
    try:
        await client.flushall()
        first = Lease(client, ttl_s=0.3, owner="first")
        second = Lease(client, ttl_s=0.3, owner="second")
        assert await first.acquire() == "first" and first.token
        assert await second.acquire() == "first" and second.token == ""
        assert await first.renew()
        token = int(first.token)
        assert token >= int(time.time() * 1e6) - 5e6  # never below the server's clock (µs)
        await asyncio.sleep(0.5)  # first stops renewing: its lease lapses
        assert await second.acquire() == "second" and int(second.token) > token
        assert not await first.renew() and first.token == ""
        assert await first.holder() == "second"
        await second.release()
        assert await client.get(LEASE) is None
    finally:
        await client.aclose()


async def test_a_lost_lease_key_and_token_still_give_one_owner(redis_url):
    """A Redis that lost the keys (wipe; a Sentinel failover to a replica that lagged)."""
    client = aioredis.Redis.from_url(redis_url)
    try:
        await client.flushall()
        first = Lease(client, ttl_s=5, owner="first")
        await first.acquire()
        old = first.token
        await client.flushall()
        second = Lease(client, ttl_s=5, owner="second")
        assert await second.acquire() == "second" and int(second.token) > int(old)
        assert not await first.renew()  # the old owner learns it lost, writes nothing
        store = BusStore(client)
        store.token = old
        with pytest.raises(Fenced):
            async with store.fenced() as pipe:
                pipe.rpush("written", b"x")
                await pipe.execute()
        assert await client.exists("written") == 0
    finally:
        await client.aclose()


async def test_a_fenced_out_bus_writes_nothing_and_the_owner_takes_its_claims(redis_url):
    client = aioredis.Redis.from_url(redis_url)
    try:
        await client.flushall()
        old_lease = Lease(client, ttl_s=0.2, owner="old")
        await old_lease.acquire()
        old = BusStore(client)
        old.token = old_lease.token
        await client.rpush(keys.BUS_LOCAL, b"a", b"b", b"c")
        assert await old.wait_claim(keys.BUS_LOCAL, 1, 1) == [b"a"]  # while it holds it
        await client.hset(keys.BUS_BACKLOG, "1002.1", b'{"ret":"r"}')
        await asyncio.sleep(0.3)
        new_lease = Lease(client, ttl_s=5, owner="new")
        await new_lease.acquire()
        new = BusStore(client)
        new.token = new_lease.token
        runners = [asyncio.create_task(s.coalescer.run()) for s in (old, new)]

        # every write of the old owner is refused, and nothing changes
        with pytest.raises(Fenced):
            await old.wait_claim(keys.BUS_LOCAL, 1, 5)
        assert await client.lrange(keys.bus_inflight(keys.BUS_LOCAL), 0, -1) == [b"a"]
        with pytest.raises(Fenced):
            async with old.fenced() as pipe:
                old.release(pipe, keys.BUS_LOCAL, 1)
                await pipe.execute()
        with pytest.raises(Fenced):
            await old.finish("1002.1", "r", b"answer")
        with pytest.raises(Fenced):
            await old.bury_head(keys.BUS_LOCAL, "d", b"a", "why", 3)
        assert await client.hexists(keys.BUS_BACKLOG, "1002.1")
        assert await client.llen("r") == 0 and await client.llen(keys.bus_dead()) == 0

        # the fenced-out claim (b) stopped in the staging list; the owner's next claim
        # takes it first, in order, then c; the old owner's claims still fail
        assert await client.lrange(lease.staging(keys.BUS_LOCAL), 0, -1) == [b"b"]
        assert await new.wait_claim(keys.BUS_LOCAL, 1, 5) == [b"b", b"c"]
        assert await client.lrange(keys.bus_inflight(keys.BUS_LOCAL), 0, -1) == [b"a", b"b", b"c"]
        with pytest.raises(Fenced):
            await old.wait_claim(keys.BUS_LOCAL, 1, 5)  # (an empty queue: refused all the same)
        assert await new.finish("1002.1", "r", b"answer") is True
        assert await client.get(FENCE) == new.token.encode()
        for runner in runners:
            runner.cancel()
        await asyncio.gather(*runners, return_exceptions=True)
    finally:
        await client.aclose()


async def test_posts_signed_before_the_replay_memorys_epoch_are_refused(redis_url):
    client = aioredis.Redis.from_url(redis_url)
    store = BusStore(client)
    runner = asyncio.create_task(store.coalescer.run())
    try:
        await client.flushall()
        before = str(int(time.time() * 1000) - 1000)
        triple = [("1001:1002.1", "msgbus.echo", b"body")]
        # no epoch yet: it becomes now, and a POST signed a second ago is refused
        assert await store.accept_requests(triple, 9e9, before) == [-2]
        assert int(await client.get(SEEN_EPOCH)) > int(before)
        assert await client.llen("msgbus.echo") == 0 and await client.zcard(keys.bus_seen()) == 0
        await client.hset(keys.BUS_BACKLOG, "1002.5", b'{"dst":[1002],"ret":"r"}')
        reply = [("1002.5", 1002, b"head", b"tail")]
        assert await store.deliver_replies(reply, before) == [-2]
        assert await client.llen("r") == 0 and await client.hexists(keys.BUS_BACKLOG, "1002.5")
        # signed after the epoch: accepted; unsigned (legacy, ''): not checked
        after = str(int(time.time() * 1000) + 10)
        assert await store.accept_requests(triple, 9e9, after) == [1]
        assert await store.deliver_replies(reply, after) == [1]
        assert await store.accept_requests([("1001:1002.2", "msgbus.echo", b"x")], 9e9) == [1]
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        await client.aclose()
