"""Bad input on msgbus.system.local, a bus killed mid-flight, a graceful stop."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import pytest
import redis.asyncio as aioredis

from pipeline import keys
from pipeline.bus.envelope import Envelope

from .conftest import eventually
from .test_process import raw_call, seed_request, serve, stop

pytestmark = pytest.mark.timeout(90)
log = logging.getLogger(__name__)


async def test_malformed_requests_answered_or_logged(twins, caplog):
    (a,) = twins(1)
    await a.start_bus()
    ra = aioredis.Redis.from_url(a.url)
    try:
        cases = [  # (raw, ret, expected text in err)
            (b'{"ver": 1, "cmd": "x", "ret": "q-trunc", "dst": [1', "q-trunc", "not valid JSON"),
            (_doc(a, ret="q-ver", ver=2), "q-ver", "ver must be 1"),
            (_doc(a, ret="q-dst", dst=[]), "q-dst", "dst must be"),
            (_doc(a, ret="q-dat", dat="***"), "q-dat", "base64"),
            (_doc(a, ret="q-sys", cmd="system.local"), "q-sys", "reserved"),
            (_doc(a, ret="q-exp", exp=-1), "q-exp", "exp must be"),
            (_doc(a, ret="q-str", dst=["1002"]), "q-str", "dst must be"),
            (_doc(a, ret="q-try", **{"try": 1.5}), "q-try", "try must be"),
        ]
        caplog.set_level(logging.WARNING, logger="pipeline.bus.process")
        await ra.rpush(keys.BUS_LOCAL, b"\xff\xfe not even text", b"[1, 2]", *[c[0] for c in cases])
        for _, ret, text in cases:
            popped = await ra.blpop([ret], timeout=5)
            assert popped is not None, ret
            answer = json.loads(popped[1])
            assert answer["err"].startswith("invalid envelope") and text in answer["err"], answer
        # the bus is still serving, and nothing is left in flight
        _, task = serve(a, echo=_echo)
        try:
            [ok] = await raw_call(a.url, seed_request("echo", [a.id], b"still"), 1)
        finally:
            await stop(task)
        assert ok["err"] == ""
        assert await ra.llen(keys.bus_inflight(keys.BUS_LOCAL)) == 0
        assert sum("no ret" in r.getMessage() for r in caplog.records) == 2
    finally:
        await ra.aclose()


def _doc(twin: Any, **fields: Any) -> bytes:
    doc = seed_request("x", [twin.id], b"")
    doc.update(fields)
    return json.dumps(doc).encode()


async def _echo(data: bytes, request: Envelope) -> bytes:
    return data


async def _collect(url: str, rets: list[str], wait: float) -> dict[str, dict[str, Any]]:
    client = aioredis.Redis.from_url(url)
    answers: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + wait
    try:
        pending = set(rets)
        while pending and time.monotonic() < deadline:
            popped = await client.blpop(list(pending)[:200], timeout=1)
            if popped is None:
                continue
            ret = popped[0].decode()
            answers[ret] = json.loads(popped[1])
            pending.discard(ret)
        # exactly one answer each: nothing else arrives
        await asyncio.sleep(0.3)
        extra = sum([await client.llen(r) for r in rets])
        assert extra == 0, f"{extra} duplicate answers"
    finally:
        await client.aclose()
    return answers


async def test_bus_killed_mid_flight_leaves_no_request_unanswered(twins):
    a, b = twins(2)
    a.spawn()
    b.spawn()

    killed = asyncio.Event()
    handled = 0

    async def slow(data: bytes, request: Envelope) -> bytes:
        # the first 20 calls to reach the handler answer quickly, in whatever order
        # the buses delivered them; the rest are held until both buses were killed,
        # so work is mid-flight at the kill however fast or loaded the machine is
        nonlocal handled
        handled += 1
        if handled > 20:
            await killed.wait()
        await asyncio.sleep(0.01)
        return b"done:" + data

    _, task = serve(b, slow=slow)
    ra = aioredis.Redis.from_url(a.url)
    try:
        docs = [seed_request("slow", [b.id], str(i).encode(), exp=30) for i in range(300)]
        await ra.rpush(keys.BUS_LOCAL, *[json.dumps(d) for d in docs])
        rets = [d["ret"] for d in docs]

        # let some calls finish, then crash both buses with work in every stage
        async def some_answered() -> bool:
            return sum([await ra.exists(r) for r in rets]) >= 5

        await eventually(some_answered)
        a.kill()
        b.kill()
        killed.set()
        in_flight = await ra.hlen(keys.BUS_BACKLOG)
        assert in_flight > 0  # requests were mid-flight when the buses died
        b.spawn()
        a.spawn()
        answers = await _collect(a.url, rets, wait=30)
    finally:
        await stop(task)
        await ra.aclose()
    assert len(answers) == len(docs), f"{len(docs) - len(answers)} requests never answered"
    ok = [r for r, ans in answers.items() if not ans["err"]]
    assert len(ok) > 0
    log.info(
        f"in flight at kill: {in_flight}, answered ok: {len(ok)}, expired: {len(docs) - len(ok)}"
    )
    for doc in docs:
        ans = answers[doc["ret"]]
        assert ans["err"] in ("", "request expired"), ans["err"]
        if not ans["err"]:
            assert ans["dat"] != doc["dat"]  # the handler's payload, not the request's


async def test_graceful_stop_keeps_queued_work(twins):
    a, b = twins(2)
    a.spawn()
    ra = aioredis.Redis.from_url(a.url)
    try:
        docs = [seed_request("echo", [b.id], b"q", exp=30, **{"try": 50}) for _ in range(20)]
        await ra.rpush(keys.BUS_LOCAL, *[json.dumps(d) for d in docs])

        async def all_pending() -> bool:  # b is down: all 20 wait in the backlog, retrying
            return await ra.llen(keys.BUS_LOCAL) == 0 and await ra.hlen(keys.BUS_BACKLOG) == 20

        await eventually(all_pending)
        assert a.terminate() == 0
        assert await ra.hlen(keys.BUS_BACKLOG) == 20
        _, task = serve(b, echo=_echo)
        try:
            b.spawn()
            a.spawn()
            answers = await _collect(a.url, [d["ret"] for d in docs], wait=20)
        finally:
            await stop(task)
        assert [ans["err"] for ans in answers.values()] == [""] * 20
        assert await ra.hlen(keys.bus_outbox()) == 0 and await ra.hlen(keys.BUS_BACKLOG) == 0
    finally:
        await ra.aclose()


async def test_invalid_reply_from_a_handler_reaches_the_caller_as_err(twins):
    a, b = twins(2)
    await a.start_bus()
    await b.start_bus()
    rb = aioredis.Redis.from_url(b.url)

    async def broken_handler() -> None:
        popped = await rb.blpop(["msgbus.broken"], timeout=10)
        assert popped is not None
        msg = json.loads(popped[1])
        msg["src"], msg["dst"] = msg["dst"], msg["src"]
        msg["dat"] = "*** not base64 ***"
        await rb.rpush(keys.BUS_REPLY, json.dumps(msg))
        await rb.rpush(keys.BUS_REPLY, b"not even json")  # no uid: logged and dropped

    try:
        _, answers = await asyncio.gather(
            broken_handler(), raw_call(a.url, seed_request("broken", [b.id], b""), 1)
        )
        [answer] = answers
        assert answer["err"] == "invalid reply: invalid envelope: dat must be valid base64"
        assert answer["src"] == b.id and answer["dst"] == [a.id]
        assert await rb.llen(keys.bus_inflight(keys.BUS_REPLY)) == 0
    finally:
        await rb.aclose()
