"""Poison messages and dead letters (issue 11): counted, set aside with their reason, requeued.

A message whose handling fails (a bug, a killed process, a hung handler) is
tried ``max_attempts`` times, then set aside in the dead-letter list with why;
an operator lists and requeues what was set aside; a Redis blip counts as no attempt.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time

import pytest
import redis.asyncio as aioredis

from pipeline import keys
from pipeline.bus.envelope import Envelope
from pipeline.bus.queues import QueueHandlers

from .conftest import eventually
from .test_hostile import BOMB, dead_letters
from .test_process import echo, raw_call, seed_request, serve, stop

pytestmark = pytest.mark.timeout(90)


async def test_poison_message_goes_to_dead_letters_after_n_attempts(twins, monkeypatch):
    """A message whose handling raises (a bug, not bad input) is retried N times, then set aside."""
    (a,) = twins(1)
    real = QueueHandlers.local

    async def fragile(self: QueueHandlers, batch: list[bytes], claim_next: int) -> list[bytes]:
        if any(b"poison-ret" in raw for raw in batch):
            raise ZeroDivisionError("poison")
        return await real(self, batch, claim_next)

    monkeypatch.setattr(QueueHandlers, "local", fragile)
    ra = aioredis.Redis.from_url(a.url)
    try:
        docs = [seed_request("echo", [a.id], str(i).encode()) for i in range(5)]
        poison = seed_request("echo", [a.id], b"", ret="poison-ret")
        raws = [json.dumps(d) for d in docs]
        await ra.rpush(keys.BUS_LOCAL, *raws[:2], json.dumps(poison), *raws[2:])
        _, task = serve(a, echo=echo)
        try:
            await a.start_bus(max_attempts=3)  # the six are claimed as one batch
            answers = [await ra.blpop([d["ret"]], timeout=10) for d in docs]
        finally:
            await stop(task)
        assert all(popped is not None for popped in answers)

        async def buried() -> bool:
            return await ra.llen(keys.bus_dead()) == 1

        await eventually(buried)
        [letter] = await dead_letters(ra)
        assert letter.queue == keys.BUS_LOCAL and letter.attempts == 3
        assert "ZeroDivisionError: poison" in letter.reason
        assert letter.body == json.dumps(poison).encode()
        assert await ra.llen(keys.bus_inflight(keys.BUS_LOCAL)) == 0
        assert await ra.hlen(keys.bus_attempts()) == 0
        assert a.bus is not None and all(not t.done() for t in a.bus._tasks)
    finally:
        await ra.aclose()


async def test_attempts_count_across_restarts(twins):
    """A message that killed the process N times (no exception to catch) is set aside at start."""
    (a,) = twins(1)
    ra = aioredis.Redis.from_url(a.url)
    try:
        killer = json.dumps(seed_request("echo", [a.id], b"kills")).encode()
        await ra.rpush(keys.bus_inflight(keys.BUS_LOCAL), killer)
        field = f"{keys.BUS_LOCAL}:{hashlib.blake2b(killer, digest_size=12).hexdigest()}"
        await ra.hset(keys.bus_attempts(), field, 3)
        await a.start_bus(max_attempts=3)

        async def buried() -> bool:
            return await ra.llen(keys.bus_dead()) == 1

        await eventually(buried)
        [letter] = await dead_letters(ra)
        assert "stopped while handling" in letter.reason and letter.body == killer
    finally:
        await ra.aclose()


async def test_corrupt_backlog_entries_are_set_aside_and_the_bus_goes_on(twins):
    (a,) = twins(1)
    ra = aioredis.Redis.from_url(a.url)
    try:
        for uid, junk in (("1002.1", b"[" * 5000), ("1002.2", b'{"ver":1}'), ("1002.3", b"\xff")):
            await ra.hset(keys.BUS_BACKLOG, uid, junk)
            await ra.zadd(keys.bus_expiry(), {uid: time.time() - 1})
        await a.start_bus()

        async def swept() -> bool:
            return await ra.hlen(keys.BUS_BACKLOG) == 0 and await ra.llen(keys.bus_dead()) == 3

        await eventually(swept)
        _, task = serve(a, echo=echo)
        try:
            [answer] = await raw_call(a.url, seed_request("echo", [a.id], b"ok"), 1)
        finally:
            await stop(task)
        assert answer["err"] == ""
        assert all("corrupt backlog" in letter.reason for letter in await dead_letters(ra))
    finally:
        await ra.aclose()


async def test_operator_lists_and_requeues_dead_letters(twins, capsys):
    from pipeline.bus import cli

    (a,) = twins(1)
    await a.start_bus()
    ra = aioredis.Redis.from_url(a.url)
    try:
        await ra.hset("caller-q", "k", "v")  # a ret of the wrong type
        doc = seed_request("echo", [9999], b"", ret="caller-q")
        await ra.rpush(keys.BUS_LOCAL, json.dumps(doc), BOMB)

        async def both_set_aside() -> bool:
            return await ra.llen(keys.bus_dead()) == 2

        await eventually(both_set_aside)
        assert await asyncio.to_thread(cli.main, ["dead", "--redis", a.url]) == 0
        listing = capsys.readouterr().out
        assert "caller-q" in listing and "holds a hash" in listing and "nested deeper" in listing
        await ra.delete("caller-q")  # the operator fixes the key, then requeues the answer
        index = 0 if b"caller-q" in (await ra.lindex(keys.bus_dead(), 0) or b"") else 1
        assert (
            await asyncio.to_thread(cli.main, ["requeue", "--index", str(index), "--redis", a.url])
            == 0
        )
        popped = await ra.blpop(["caller-q"], timeout=5)
        assert popped is not None and json.loads(popped[1])["err"] == "destination not found"
        assert await ra.llen(keys.bus_dead()) == 1
    finally:
        await ra.aclose()


async def test_handler_server_sets_aside_bombs_and_times_out_hung_handlers(twins):
    (a,) = twins(1)
    await a.start_bus()
    release = asyncio.Event()

    async def hang(data: bytes, request: Envelope) -> bytes:
        await release.wait()  # never set: the request's exp must end it
        return b""

    server, task = serve(a, hang=hang, echo=echo)
    ra = aioredis.Redis.from_url(a.url)
    try:
        await ra.rpush("msgbus.echo", BOMB)
        hung = [seed_request("hang", [a.id], b"", exp=1) for _ in range(server.workers)]
        calls = [raw_call(a.url, doc, 1) for doc in hung]
        results = await asyncio.gather(*calls)
        assert all(r[0]["err"] in ("handler timed out", "request expired") for r in results)
        [ok] = await raw_call(a.url, seed_request("echo", [a.id], b"x"), 1)
        assert ok["err"] == ""  # the workers are free again

        async def bomb_set_aside() -> bool:
            return await ra.llen(keys.bus_dead()) == 1

        await eventually(bomb_set_aside)
        [letter] = await dead_letters(ra)
        assert letter.queue == "msgbus.echo" and letter.body == BOMB
    finally:
        await stop(task)
        await ra.aclose()


async def test_redis_errors_while_handling_do_not_count_as_poison(twins, monkeypatch):
    import redis.exceptions

    (a,) = twins(1)
    real = QueueHandlers.local
    blips = [0]

    async def flaky(self: QueueHandlers, batch: list[bytes], claim_next: int) -> list[bytes]:
        if any(b"blip-ret" in raw for raw in batch) and blips[0] < 4:
            blips[0] += 1
            raise redis.exceptions.ConnectionError("connection dropped")
        return await real(self, batch, claim_next)

    monkeypatch.setattr(QueueHandlers, "local", flaky)
    ra = aioredis.Redis.from_url(a.url)
    try:
        doc = seed_request("nobody", [9999], b"", ret="blip-ret")
        await ra.rpush(keys.BUS_LOCAL, json.dumps(doc))
        await a.start_bus(max_attempts=2)
        popped = await ra.blpop(["blip-ret"], timeout=15)
        assert popped is not None and json.loads(popped[1])["err"] == "destination not found"
        assert blips[0] == 4 and await ra.llen(keys.bus_dead()) == 0
    finally:
        await ra.aclose()
