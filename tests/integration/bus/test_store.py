"""BusStore's coalesced scripts against a real redis-server."""

from __future__ import annotations

import asyncio
import json

import pytest
import redis.asyncio as aioredis
import redis.exceptions

from pipeline import keys
from pipeline.bus.answers import answer_parts
from pipeline.bus.coalesce import Coalescer
from pipeline.bus.envelope import Envelope
from pipeline.bus.store import BusStore

pytestmark = pytest.mark.timeout(30)


async def test_coalesced_scripts_survive_a_flushed_script_cache(redis_url):
    client = aioredis.Redis.from_url(redis_url)
    store = BusStore(client)
    runner = asyncio.create_task(store.coalescer.run())
    try:
        request = Envelope(uid="1002.1", cmd="c.d", src=1001, dst=[1002], ret="caller")
        await client.hset(keys.BUS_BACKLOG, mapping={"1002.1": request.encode()})
        await client.hset(keys.BUS_BACKLOG, mapping={"1002.2": request.copy(uid="1002.2").encode()})
        await client.script_flush()  # what a Redis restart does to the script cache
        reply = Envelope(uid="1002.1", cmd="c.d", src=1002, dst=[1001], ret=keys.BUS_REPLY)
        results = await asyncio.gather(
            store.deliver_reply("1002.1", 1002, *answer_parts(reply)),
            store.deliver_reply("1002.9", 1002, *answer_parts(reply.copy(uid="1002.9"))),
            store.deliver_reply("1002.2", 1003, *answer_parts(reply.copy(uid="1002.2"))),
            store.accept_request("1001:1002.1", 9e9, "msgbus.c.d", b"queued"),
        )
        assert results == [1, 0, -1, True]
        assert await client.lrange("caller", 0, -1) == [reply.copy(ret="caller").encode()]
        assert await client.lrange("msgbus.c.d", 0, -1) == [b"queued"]
        await client.script_flush()
        assert await store.finish("1002.2", "caller", b"late") is True
        assert await store.finish("1002.2", "caller", b"twice") is False
        assert await client.hlen(keys.BUS_BACKLOG) == 0
    finally:
        runner.cancel()
        with pytest.raises(asyncio.CancelledError):
            await runner
        await client.aclose()


async def test_requests_of_one_post_are_accepted_in_one_step(redis_url):
    client = aioredis.Redis.from_url(redis_url)
    store = BusStore(client, max_seen=3)
    runner = asyncio.create_task(store.coalescer.run())
    try:
        assert await store.accept_requests([], 9e9) == []
        q = "msgbus.c.d"
        results = await store.accept_requests(
            [("1001:1002.1", q, b"a"), ("1001:1002.1", q, b"a-again"), ("1001:1002.2", q, b"b")],
            9e9,
        )
        assert results == [1, 0, 1]  # a copy in the same POST is a replay too
        # the seen set holds at most 3: the fourth new id waits (the sender retries)
        results = await store.accept_requests(
            [("1001:1002.3", q, b"c"), ("1001:1002.4", q, b"d"), ("1001:1002.2", q, b"b")], 9e9
        )
        assert results == [1, -1, 0]
        assert await client.lrange(q, 0, -1) == [b"a", b"b", b"c"]
        assert await client.llen(keys.BUS_REMOTE) == 0  # straight to the handler's queue
    finally:
        runner.cancel()
        with pytest.raises(asyncio.CancelledError):
            await runner
        await client.aclose()


async def test_replies_of_one_post_are_delivered_in_one_step(redis_url):
    client = aioredis.Redis.from_url(redis_url)
    store = BusStore(client)
    runner = asyncio.create_task(store.coalescer.run())
    try:
        request = Envelope(uid="1002.1", cmd="c.d", src=1001, dst=[1002], ret="caller")
        await client.hset(
            keys.BUS_BACKLOG,
            mapping={"1002.1": request.encode(), "1002.2": request.copy(uid="1002.2").encode()},
        )
        reply = Envelope(uid="1002.1", cmd="c.d", src=1002, dst=[1001], ret=keys.BUS_REPLY)
        results = await store.deliver_replies(
            [
                ("1002.1", 1002, *answer_parts(reply)),
                ("1002.1", 1002, *answer_parts(reply)),  # the same reply twice: once
                ("1002.9", 1002, *answer_parts(reply.copy(uid="1002.9"))),
                ("1002.2", 1003, *answer_parts(reply.copy(uid="1002.2"))),
            ]
        )
        assert results == [1, 0, 0, -1]
        assert await client.lrange("caller", 0, -1) == [reply.copy(ret="caller").encode()]
        assert await client.hkeys(keys.BUS_BACKLOG) == [b"1002.2"]
        assert await store.deliver_replies([]) == []
    finally:
        runner.cancel()
        with pytest.raises(asyncio.CancelledError):
            await runner
        await client.aclose()


async def test_a_request_for_a_queue_that_is_not_a_list_is_set_aside_and_remembered(redis_url):
    client = aioredis.Redis.from_url(redis_url)
    store = BusStore(client)
    runner = asyncio.create_task(store.coalescer.run())
    try:
        await client.set("msgbus.broken", "a string")
        requests = [("1001:1002.1", "msgbus.broken", b"lost"), ("1001:1002.2", "msgbus.ok", b"x")]
        assert await store.accept_requests(requests, 9e9) == [2, 1]
        assert await store.accept_request("1001:1002.1", 9e9, "msgbus.broken", b"lost") == 0
        [letter] = await client.lrange(keys.bus_dead(), 0, -1)
        assert b"msgbus.broken holds a string" in letter and letter.endswith(b"\nlost")
        assert await client.lrange("msgbus.ok", 0, -1) == [b"x"]
    finally:
        runner.cancel()
        with pytest.raises(asyncio.CancelledError):
            await runner
        await client.aclose()


async def test_coalescer_stops_when_redis_turns_its_cancel_into_a_connection_error(redis_url):
    client = aioredis.Redis.from_url(redis_url)
    coalescer = Coalescer(client)
    runner = asyncio.create_task(coalescer.run())
    started = asyncio.Event()

    async def stuck(pipe: object) -> None:  # as redis-py may do when cancelled mid-command
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            raise redis.exceptions.ConnectionError("Connection closed by server.") from None

    caller = asyncio.create_task(coalescer.call(stuck))
    try:
        await asyncio.wait_for(started.wait(), 5)
        runner.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(runner, 2)  # not back to waiting on its queue
        with pytest.raises(asyncio.CancelledError):  # its caller is told, as on any stop
            await asyncio.wait_for(caller, 2)
    finally:
        runner.cancel()
        caller.cancel()
        await client.aclose()


async def test_a_wait_claims_what_queued_with_the_first_item(redis_url):
    client = aioredis.Redis.from_url(redis_url)
    store = BusStore(client)
    queue, inflight = keys.BUS_LOCAL, keys.bus_inflight(keys.BUS_LOCAL)
    try:
        waiting = asyncio.create_task(store.wait_claim(queue, 10, 8))
        await asyncio.sleep(0)  # (no timing assumed: pushed before or during the wait)
        await client.rpush(queue, b"a", b"b", b"c")
        assert await waiting == [b"a", b"b", b"c"]
        assert await client.lrange(inflight, 0, -1) == [b"a", b"b", b"c"]
        assert await client.llen(queue) == 0
        # at most count, the rest stays queued
        await client.rpush(queue, b"d", b"e", b"f")
        assert await store.wait_claim(queue, 10, 2) == [b"d", b"e"]
        assert await client.lrange(queue, 0, -1) == [b"f"]
        assert await store.wait_claim(queue, 10, 1) == [b"f"]
        # a Redis that lost its scripts (a restart) still hands over everything queued
        await client.script_flush()
        await client.rpush(queue, b"g", b"h")
        assert await store.wait_claim(queue, 10, 8) == [b"g", b"h"]
        assert await client.llen(inflight) == 8
        assert await store.wait_claim(queue, 1, 8) == []  # nothing came
    finally:
        await client.aclose()


async def test_a_batch_transaction_claims_the_next_batch(redis_url):
    client = aioredis.Redis.from_url(redis_url)
    store = BusStore(client)
    queue, inflight = keys.BUS_REPLY, keys.bus_inflight(keys.BUS_REPLY)

    async def outcome(count: int, claim_next: int) -> list[bytes]:
        async with client.pipeline(transaction=True) as pipe:
            pipe.incr("outcomes")
            store.release(pipe, queue, count, claim_next)
            return (await pipe.execute())[-1] if claim_next else []

    try:
        await client.script_flush()  # (no script cache needed inside the transaction)
        await client.rpush(queue, b"a", b"b", b"c", b"d", b"e")
        assert await store.claim(queue, 2) == [b"a", b"b"]
        assert await outcome(2, 2) == [b"c", b"d"]  # a, b released; c, d claimed
        assert await client.lrange(inflight, 0, -1) == [b"c", b"d"]
        assert await outcome(2, 8) == [b"e"]
        assert await client.lrange(inflight, 0, -1) == [b"e"]
        assert await outcome(1, 8) == []
        assert await client.llen(inflight) == 0
        assert await client.get("outcomes") == b"3"
    finally:
        await client.aclose()


async def test_the_envelopes_of_one_post_go_to_redis_as_one_argument(redis_url):
    """redis-py packs each argument in Python (microseconds each): a POST's envelopes
    travel packed, so its script call has the same few arguments however many it holds."""
    client = aioredis.Redis.from_url(redis_url)
    watcher = aioredis.Redis.from_url(redis_url)
    store = BusStore(client)
    runner = asyncio.create_task(store.coalescer.run())
    seen: list[int] = []
    try:
        async with watcher.monitor() as monitor:

            async def watch() -> None:
                while len(seen) < 2:
                    command = await monitor.next_command()
                    if command["command"].startswith("EVALSHA"):
                        seen.append(len(command["command"].split(" ")))

            watching = asyncio.create_task(watch())
            await asyncio.sleep(0)
            bodies = [Envelope(uid=f"1002.{n}", cmd="c.d", src=1001, dst=[1002], ret="r")
                      for n in range(100)]  # fmt: skip
            await client.hset(
                keys.BUS_BACKLOG,
                mapping={b.uid: b.encode() for b in bodies},  # type: ignore[misc]
            )
            accepted = await store.accept_requests(
                [(f"1001:{b.uid}", "msgbus.c.d", b.encode()) for b in bodies], 9e9
            )
            assert accepted == [1] * 100
            replies = [b.copy(src=1002, dst=[1001], ret=keys.BUS_REPLY) for b in bodies]
            answered = await store.deliver_replies(
                [(r.uid, 1002, *answer_parts(r)) for r in replies]
            )
            assert answered == [1] * 100
            await asyncio.wait_for(watching, 10)
        assert await client.lrange("r", 0, -1) == [r.copy(ret="r").encode() for r in replies]
        assert await client.llen("msgbus.c.d") == 100
        # EVALSHA sha numkeys key(s) and three arguments (MONITOR's text splits on spaces;
        # one argument per field would be 300 or 400 here)
        assert max(seen) < 20
    finally:
        runner.cancel()
        with pytest.raises(asyncio.CancelledError):
            await runner
        await client.aclose()
        await watcher.aclose()


async def _commands(client: aioredis.Redis) -> dict[str, int]:
    """Commands Redis ran since its last CONFIG RESETSTAT (those of scripts included)."""
    stats = await client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


async def test_a_post_costs_redis_no_check_per_envelope(redis_url):
    """A POST's requests: one ZCARD per POST, not one per request, and one ZADD NX per
    request tells a replay (no ZSCORE first); pushes to lists need no TYPE check first
    (the push is tried, WRONGTYPE sets it aside); replies: no TYPE either, and a ret is
    read from its backlog entry without decoding the whole entry (the same answer; a
    ret with escapes still decoded)."""
    client = aioredis.Redis.from_url(redis_url)
    store = BusStore(client)
    runner = asyncio.create_task(store.coalescer.run())
    try:
        await store.accept_requests([("warm:1", "msgbus.c.d", b"w")], 9e9)  # scripts loaded
        await store.deliver_replies([("1002.0", 1002, b"", b"")])
        await client.config_resetstat()
        requests = [(f"1001:1002.{i}", "msgbus.c.d", b"r%d" % i) for i in range(20)]
        assert await store.accept_requests(requests, 9e9) == [1] * 20
        rets = [f"caller-{i}/x" for i in range(19)] + ['odd "ret" \u00e9\\']
        backlog = {
            f"1002.{i}": Envelope(uid=f"1002.{i}", cmd="c.d", src=1001, dst=[1002], ret=ret)
            for i, ret in enumerate(rets)
        }
        await client.hset(keys.BUS_BACKLOG, mapping={u: e.encode() for u, e in backlog.items()})
        reply = Envelope(cmd="c.d", src=1002, dst=[1001], ret=keys.BUS_REPLY, dat="eA==")
        replies = [(uid, 1002, *answer_parts(reply.copy(uid=uid))) for uid in backlog]
        assert await store.deliver_replies(replies) == [1] * 20
        ran = await _commands(client)
        assert ran.get("zcard") == 1 and "type" not in ran and "zscore" not in ran, ran
        assert ran["zadd"] == 20  # each id remembered by the ZADD that tells a replay
        assert ran["rpush"] == 40
        for uid, request in backlog.items():
            [answer] = await client.lrange(request.ret, 0, -1)
            assert json.loads(answer) == {
                **json.loads(reply.copy(uid=uid).encode()),
                "ret": request.ret,
            }
        # a push Redis refuses for another reason than the type fails the step, as before
        await client.config_set("maxmemory", "1")
        try:
            async with client.pipeline(transaction=False) as pipe:
                await store.push_in(pipe, "answer not delivered", [("caller-oom", b"x")])
                [refused] = await pipe.execute(raise_on_error=False)
            assert isinstance(refused, redis.exceptions.OutOfMemoryError)
            assert await client.llen(keys.bus_dead()) == 0 and not await client.exists("caller-oom")
        finally:
            await client.config_set("maxmemory", "0")
    finally:
        runner.cancel()
        with pytest.raises(asyncio.CancelledError):
            await runner
        await client.aclose()
