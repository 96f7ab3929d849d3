"""Replay protection that survives the receiver's data loss (issue 31, item 2): a POST
recorded before the receiver's Redis was wiped is refused after it, and its handler does
not run a second time; traffic signed after the wipe goes on."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from pipeline.bus.envelope import Envelope

from .conftest import eventually
from .test_http import post_raw, request_body, signed_headers
from .test_process import serve, stop

pytestmark = pytest.mark.timeout(60)


async def test_a_recorded_post_is_refused_after_the_receiver_lost_its_data(twins):
    a, b = twins(2)
    await b.start_bus()
    ran: list[str] = []

    async def echo(data: bytes, request: Envelope) -> bytes:
        ran.append(request.uid)
        return data

    _, task = serve(b, echo=echo)
    rb = aioredis.Redis.from_url(b.url)
    try:
        # a real signed POST, recorded on the wire
        body = request_body(a.id, b.id, f"{b.id}.7")
        headers = signed_headers(a.signer, a.id, "/zbus-remote", body)
        assert (await post_raw(b.port, "/zbus-remote", body, headers))[0] == 200
        await eventually(lambda: ran == [f"{b.id}.7"])
        assert (await post_raw(b.port, "/zbus-remote", body, headers))[0] == 409

        await rb.flushall()  # the receiver's Redis loses everything (no persistence)
        status, text = await post_raw(b.port, "/zbus-remote", body, headers)
        assert status == 503 and "signed before" in text, (status, text)
        await asyncio.sleep(0.5)
        assert ran == [f"{b.id}.7"]  # the handler did not run a second time

        # what is signed after the wipe goes through, requests and calls alike
        await asyncio.sleep(0.01)
        fresh = request_body(a.id, b.id, f"{b.id}.8")
        headers = signed_headers(a.signer, a.id, "/zbus-remote", fresh)
        assert (await post_raw(b.port, "/zbus-remote", fresh, headers))[0] == 200
        await eventually(lambda: ran[-1:] == [f"{b.id}.8"])
        await a.start_bus()
        assert await a.client().call("echo", dst=[b.id], data="after") == [b"after"]
    finally:
        await stop(task)
        await rb.aclose()
    assert len(ran) == 3
