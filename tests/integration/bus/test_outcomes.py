"""Every outcome counted by what happened, and logged once per condition (issue 31, items
3 and 4): the answers a bus gives its callers in ``/metrics`` (answered, handler failed,
unreachable, unknown, refused, expired, the scrubber's expiry answers included), and the
"redis unavailable, answering 503" line of the endpoints through the one log gate."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import pytest
import redis.asyncio as aioredis

from pipeline import keys
from pipeline.bus import cli as buscli
from pipeline.bus.backlog import EXPIRED_TEXT
from pipeline.bus.envelope import Envelope
from pipeline.errors import HandlerError, RemoteError
from tests.support.refusal import noreplicas

from .test_http import post, request_body
from .test_process import seed_request, serve, stop

pytestmark = pytest.mark.timeout(60)


async def test_expiry_answers_are_counted_and_logged_once(
    twins, caplog: pytest.LogCaptureFixture
) -> None:
    """Requests the peer took and never answered: the scrubber answers each "request
    expired"; they are counted as ``expired`` (not ``refused``) and logged in one line."""
    caplog.set_level(logging.WARNING, logger="pipeline.bus")
    a, b = twins(2)
    await a.start_bus()
    await b.start_bus()  # no handler on b: its requests wait on msgbus.work
    ra = aioredis.Redis.from_url(a.url)
    try:
        # exp 2 s from a whole-second now: not expired when taken (1 s at least to live)
        docs = [seed_request("work", [b.id], b"x", exp=2) for _ in range(3)]
        stale = seed_request("work", [b.id], b"x", exp=1, now=int(time.time()) - 10)
        docs.append(stale)  # expired when taken: answered at once, counted the same
        await ra.rpush(keys.BUS_LOCAL, *(json.dumps(doc) for doc in docs))
        for doc in docs:
            answer = await ra.blpop([doc["ret"]], timeout=10)
            assert answer is not None and json.loads(answer[1])["err"] == EXPIRED_TEXT
    finally:
        await ra.aclose()
    assert a.bus is not None
    counts = buscli.answer_counts(a.bus)
    assert counts["expired"] == 4 and counts["refused"] == 0, counts
    assert a.bus.expired == 3  # the scrubber's
    lines = [r for r in caplog.records if "answered 'request expired'" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    samples = {
        s.labels["outcome"]: s.value
        for s in await buscli._samples(a.bus)
        if s.name == "sluice_bus_answers_total"
    }
    assert samples["expired"] == 4
    assert set(samples) == set(buscli.ANSWER_OUTCOMES)


async def test_answers_and_handler_failures_are_counted_apart(twins) -> None:
    a, b = twins(2)
    await a.start_bus()
    await b.start_bus()

    async def work(data: bytes, request: Envelope) -> bytes:
        if data == b"bad":
            raise HandlerError("no such wallet")
        return data

    _, task = serve(b, work=work)
    try:
        client = a.client()
        assert await client.call("work", dst=[b.id], data="ok") == [b"ok"]
        with pytest.raises(RemoteError, match="no such wallet"):
            await client.call("work", dst=[b.id], data="bad")
    finally:
        await stop(task)
    assert a.bus is not None
    # the bus counts an answer just after delivering it: the caller may read it first
    for _ in range(100):
        counts = buscli.answer_counts(a.bus)
        if counts["answered"] + counts["handler_failed"] >= 2:
            break
        await asyncio.sleep(0.05)
    assert counts["answered"] == 1 and counts["handler_failed"] == 1, counts
    assert counts["unreachable"] == counts["unknown"] == counts["refused"] == 0, counts


async def test_redis_unavailable_503_is_logged_once(twins, caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.WARNING, logger="pipeline.bus.http")
    a, b = twins(2)
    await b.start_bus()
    with noreplicas(b.url):
        for n in range(5):
            body = request_body(a.id, b.id, f"{b.id}.{n + 1}")
            status, _ = await post(b.port, "/zbus-remote", body, a.signer, a.id)
            assert status == 503
    body = request_body(a.id, b.id, f"{b.id}.9")
    assert (await post(b.port, "/zbus-remote", body, a.signer, a.id))[0] == 200
    said = [r.getMessage() for r in caplog.records if r.name == "pipeline.bus.http"]
    assert len([m for m in said if "answering 503" in m]) == 1, said
    assert len([m for m in said if "redis works again" in m]) == 1, said
    assert b.bus is not None and b.bus.ingress.counts["redis_errors"] == 5
