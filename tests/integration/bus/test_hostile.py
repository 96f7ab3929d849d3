"""Hostile input and faults (issue 11): no message takes the bus down, loops, or starves others."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
import redis.asyncio as aioredis

from pipeline import keys
from pipeline.bus import dead
from pipeline.bus.envelope import Envelope

from .conftest import eventually
from .test_process import echo, raw_call, seed_request, serve, stop

pytestmark = pytest.mark.timeout(90)

BOMB = b"[" * 1024  # the message: about 1 KB of '['


async def dead_letters(client: aioredis.Redis) -> list[dead.DeadLetter]:
    return [dead.parse(raw) for raw in await client.lrange(keys.bus_dead(), 0, -1)]


async def test_bracket_bomb_in_every_queue_child_bus_stays_up_across_restarts(twins):
    """The bomb that crash-looped the bus: in local, its inflight list, and reply."""
    a, b = twins(2)
    ra = aioredis.Redis.from_url(a.url)
    try:
        await ra.rpush(keys.bus_inflight(keys.BUS_LOCAL), BOMB)  # left by the old crash
        await ra.rpush(keys.BUS_LOCAL, BOMB)
        await ra.rpush(keys.BUS_REPLY, BOMB)
        await ra.rpush(keys.BUS_REMOTE, BOMB)
        _, task = serve(a, echo=echo)
        try:
            for restart in range(3):
                proc = a.spawn()

                async def set_aside() -> bool:
                    return await ra.llen(keys.bus_dead()) == 4 and not any(
                        [
                            await ra.llen(q)
                            for q in (keys.BUS_LOCAL, keys.BUS_REPLY, keys.BUS_REMOTE)
                        ]
                    )

                await eventually(set_aside)
                doc = seed_request("echo", [a.id], f"after {restart}".encode())
                [answer] = await raw_call(a.url, doc, 1)
                assert answer["err"] == "" and proc.poll() is None
                assert a.terminate() == 0
        finally:
            await stop(task)
        letters = await dead_letters(ra)
        assert sorted(letter.queue for letter in letters) == sorted(
            [keys.BUS_LOCAL, keys.BUS_LOCAL, keys.BUS_REPLY, keys.BUS_REMOTE]
        )
        assert all(letter.body == BOMB for letter in letters)
        assert all("nested deeper" in letter.reason or "cmd" in letter.reason for letter in letters)
        for queue in (keys.BUS_LOCAL, keys.BUS_REPLY, keys.BUS_REMOTE):
            assert await ra.llen(keys.bus_inflight(queue)) == 0
    finally:
        await ra.aclose()


async def test_wrongtype_ret_does_not_fail_the_batch(twins):
    """Issue 11: one ret naming a hash failed the batched write; five good requests expired."""
    a, b = twins(2)
    ra = aioredis.Redis.from_url(a.url)
    try:
        await ra.hset("not-a-list", "k", "v")
        await ra.hset("hash-too", "k", "v")
        good = [seed_request("echo", [b.id], str(i).encode(), exp=30) for i in range(5)]
        unknown = seed_request("echo", [9999], b"", ret="not-a-list")  # answered by the local loop
        routed = seed_request("echo", [b.id], b"x", ret="hash-too")  # answered by a reply
        raws = [json.dumps(d) for d in [good[0], unknown, *good[1:3], routed, *good[3:]]]
        await ra.rpush(keys.BUS_LOCAL, *raws)
        _, task = serve(b, echo=echo)
        try:
            await b.start_bus()
            await a.start_bus()  # all seven in one batch
            answers = [await ra.blpop([d["ret"]], timeout=10) for d in good]
            assert all(p is not None and json.loads(p[1])["err"] == "" for p in answers)

            async def both_set_aside() -> bool:
                return await ra.llen(keys.bus_dead()) == 2

            await eventually(both_set_aside)
        finally:
            await stop(task)
        letters = await dead_letters(ra)
        assert {letter.queue for letter in letters} == {"not-a-list", "hash-too"}
        assert all("holds a hash, not a list" in letter.reason for letter in letters)
        unknown_answer = next(letter for letter in letters if letter.queue == "not-a-list")
        assert json.loads(unknown_answer.body)["err"] == "destination not found"
        assert await ra.hgetall("not-a-list") == {b"k": b"v"}
    finally:
        await ra.aclose()


async def test_reserved_ret_is_set_aside_not_looped(twins):
    """Issue 11: ret 'msgbus.system.local' turned each error answer into a new request."""
    (a,) = twins(1)
    await a.start_bus()
    ra = aioredis.Redis.from_url(a.url)
    try:
        looping = seed_request("echo", [9999], b"", ret=keys.BUS_LOCAL)
        feeding = seed_request("echo", [a.id], b"", ret="msgbus.echo")
        await ra.rpush(keys.BUS_LOCAL, json.dumps(looping), json.dumps(feeding))
        marker = seed_request("nobody", [9999], b"")
        [answer] = await raw_call(a.url, marker, 1)  # handled after the two above
        assert answer["err"] == "destination not found"
        letters = await dead_letters(ra)
        assert len(letters) == 2 and all("reserved" in letter.reason for letter in letters)
        assert await ra.llen(keys.BUS_LOCAL) == 0 and await ra.hlen(keys.BUS_BACKLOG) == 0
        assert await ra.llen("msgbus.echo") == 0
    finally:
        await ra.aclose()


async def test_ret_over_256_characters_is_set_aside_not_answered_on(twins):
    """Issue 21: an over-long ret was refused as invalid, yet the refusal was pushed to it."""
    (a,) = twins(1)
    await a.start_bus()
    ra = aioredis.Redis.from_url(a.url)
    try:
        ret = "r" * 300
        await ra.rpush(keys.BUS_LOCAL, json.dumps(seed_request("echo", [a.id], b"", ret=ret)))
        marker = seed_request("nobody", [9999], b"")
        [answer] = await raw_call(a.url, marker, 1)  # handled after the one above
        assert answer["err"] == "destination not found"
        assert not await ra.exists(ret)
        [letter] = await dead_letters(ra)
        assert "ret must be" in letter.reason and "no usable ret" in letter.reason
    finally:
        await ra.aclose()


async def test_now_in_milliseconds_still_expires_and_is_answered(twins):
    """Issue 11: a `now` in ms gave a deadline that never came: no answer at all."""
    a, b = twins(2)
    await a.start_bus()
    await b.start_bus()  # and no handler: only expiry can answer
    doc = seed_request("echo", [b.id], b"", now=int(time.time() * 1000), exp=1, **{"try": 50})
    [answer] = await raw_call(a.url, doc, 1, wait=10)
    assert answer["err"] == "request expired"


async def test_absurd_now_is_refused_and_leaves_nothing_behind(twins):
    a, b = twins(2)
    await a.start_bus()
    await b.start_bus()
    [answer] = await raw_call(a.url, seed_request("echo", [b.id], b"", now=10**30), 1)
    assert "now must be" in answer["err"]
    far = seed_request("echo", [b.id], b"", now=10**17, exp=60)  # ms of the year 5138
    _, task = serve(b, echo=echo)
    try:
        [answer] = await raw_call(a.url, far, 1)
    finally:
        await stop(task)
    assert answer["err"] == ""
    rb = aioredis.Redis.from_url(b.url)
    try:
        scores = [s for _, s in await rb.zrange(keys.bus_seen(), 0, -1, withscores=True)]
        assert scores and max(scores) < time.time() + 3600  # swept within the hour
    finally:
        await rb.aclose()


async def test_bus_client_waits_past_the_default_socket_timeout(twins):
    """Issue 11: `call(exp=60)` died after 5 s with redis-py's TimeoutError."""
    (a,) = twins(1)
    await a.start_bus()

    async def slow(data: bytes, request: Envelope) -> bytes:
        await asyncio.sleep(7)
        return b"late"

    _, task = serve(a, slow=slow)
    try:
        assert await a.client().call("slow", dst=[a.id], exp=60) == [b"late"]
    finally:
        await stop(task)


async def test_v_era_js_client_habits_still_work(twins):
    """LPUSH, `exp: 0`, `now` from Date.now() (ms); the handler LPUSHes its reply onto `ret`."""
    a, b = twins(2)
    await a.start_bus()
    await b.start_bus()
    ra = aioredis.Redis.from_url(a.url)
    rb = aioredis.Redis.from_url(b.url)

    async def js_handler() -> None:
        popped = await rb.brpop(["msgbus.wallet.balance"], timeout=10)
        assert popped is not None
        msg = json.loads(popped[1])
        msg["src"], msg["dst"] = msg["dst"], msg["src"]
        msg["dat"] = "MTAw"  # "100"
        msg["now"] = int(time.time() * 1000)
        await rb.lpush(msg["ret"], json.dumps(msg))

    try:
        doc = seed_request("wallet.balance", [b.id], b"GA7O", exp=0, now=int(time.time() * 1000))
        await ra.lpush(keys.BUS_LOCAL, json.dumps(doc))
        handler = asyncio.create_task(js_handler())
        popped = await ra.blpop([doc["ret"]], timeout=10)
        await handler
        assert popped is not None
        answer = json.loads(popped[1])
        assert answer["err"] == "" and answer["dat"] == "MTAw" and answer["src"] == b.id
    finally:
        await ra.aclose()
        await rb.aclose()


async def test_a_failing_directory_lookup_does_not_end_the_forwarder(twins):
    from pipeline.bus.directory import FileDirectory
    from pipeline.bus.process import BusProcess

    a, b = twins(2)
    files = FileDirectory.load(a.directory_file)

    class Flaky:
        """Knows b for the local loop, then fails every lookup the sender makes."""

        calls = 0

        async def lookup(self, twin: int) -> Any:
            Flaky.calls += 1
            if twin == b.id and Flaky.calls % 2 == 0:
                raise RuntimeError("directory exploded")
            return await files.lookup(twin)

    bus = BusProcess(a.config(), redis_url=a.url, directory=Flaky(), signer=a.signer)
    await bus.start()
    try:
        doc = seed_request("echo", [b.id], b"", **{"try": 1, "exp": 3})
        [answer] = await raw_call(a.url, doc, 1)
        assert answer["err"].startswith("remote unreachable")  # retried until exp, never sent
        assert all(not task.done() for task in bus._tasks)
        _, task = serve(a, echo=echo)
        try:
            [ok] = await raw_call(a.url, seed_request("echo", [a.id], b"still"), 1)
        finally:
            await stop(task)
        assert ok["err"] == ""
    finally:
        await bus.stop()


async def test_oversized_requests_are_answered_from_their_head(twins):
    (a,) = twins(1)
    ra = aioredis.Redis.from_url(a.url)
    try:
        big = seed_request("echo", [a.id], b"x" * 300_000)  # ret comes after dat here
        no_ret = b'{"ver":1,"dat":"' + b"A" * 300_000 + b'"}'
        small = seed_request("nobody", [9999], b"")
        await ra.rpush(keys.BUS_LOCAL, json.dumps(big), no_ret, json.dumps(small))
        await a.start_bus(max_size=4096)  # the three are claimed as one batch
        popped = await ra.blpop([big["ret"]], timeout=10)
        assert popped is not None and "larger than 4096" in json.loads(popped[1])["err"]
        popped = await ra.blpop([small["ret"]], timeout=10)
        assert popped is not None and json.loads(popped[1])["err"] == "destination not found"
        [letter] = await dead_letters(ra)
        assert letter.body == no_ret[:4097] + no_ret[-4096:] and "larger than" in letter.reason
        assert await ra.llen(keys.bus_inflight(keys.BUS_LOCAL)) == 0
    finally:
        await ra.aclose()


async def test_a_handler_queue_of_the_wrong_type_is_answered_at_once(twins):
    a, b = twins(2)
    await a.start_bus()
    await b.start_bus()
    rb = aioredis.Redis.from_url(b.url)
    try:
        await rb.set("msgbus.broken.queue", "a string, not a list")
        _, task = serve(b, echo=echo)
        try:
            calls = [
                raw_call(a.url, seed_request("broken.queue", [b.id], b"", exp=60), 1, wait=5),
                raw_call(a.url, seed_request("echo", [b.id], b"fine"), 1, wait=5),
            ]
            [[refused], [ok]] = await asyncio.gather(*calls)
        finally:
            await stop(task)
        assert refused["err"] == "command queue of broken.queue unavailable"
        assert refused["src"] == b.id and ok["err"] == ""
        [letter] = await dead_letters(rb)
        assert letter.queue == "msgbus.broken.queue" and "holds a string" in letter.reason
    finally:
        await rb.aclose()
