"""Batch bodies between buses: one signature per POST, judged per envelope, negotiated.

A peer that follows the seed (one envelope per POST, no ``X-Sluice-Batch``
header) must keep getting single envelopes; a peer that refuses a batch gets
single envelopes again without anything lost.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from aiohttp import web

from pipeline import keys
from pipeline.bus.directory import FileDirectory, Peer
from pipeline.bus.forward import Forwarder
from pipeline.bus.outbound import Kind, Outbound, Outcome
from pipeline.bus.post import BATCH_HEADER, BATCH_TYPE
from pipeline.bus.signing import SIGNATURE_HEADER, TIME_HEADER, TWIN_HEADER
from pipeline.runtime.ports import free_port

from .conftest import eventually
from .test_http import request_body

pytestmark = pytest.mark.timeout(60)


def signed(signer: Any, src: int, dst: int, path: str, body: bytes) -> dict[str, str]:
    sent_ms = int(time.time() * 1000)
    signature = signer.sign_post(src=src, dst=dst, path=path, sent_ms=sent_ms, body=body)
    return {
        TWIN_HEADER: str(src),
        TIME_HEADER: str(sent_ms),
        SIGNATURE_HEADER: signature,
        "Content-Type": BATCH_TYPE,
    }


async def post_batch(
    port: int, path: str, body: bytes, headers: dict[str, str]
) -> tuple[int, Any, dict[str, str]]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"http://127.0.0.1:{port}{path}", data=body, headers=headers) as resp,
    ):
        text = await resp.text()
        return resp.status, json.loads(text), dict(resp.headers)


async def test_a_batch_is_judged_envelope_by_envelope(twins):
    a, b, c = twins(3)
    await b.start_bus()
    good = request_body(a.id, b.id, f"{b.id}.1")
    lines = [
        good,
        good,  # the same uid again in one POST: a replay
        request_body(a.id, c.id, f"{c.id}.2"),  # not for b
        b"{not json",
        request_body(c.id, b.id, f"{b.id}.3"),  # another twin's envelope under a's signature
        request_body(a.id, b.id, f"{b.id}.4"),
    ]
    body = b"\n".join(lines)
    status, doc, headers = await post_batch(
        b.port, "/zbus-remote", body, signed(a.signer, a.id, b.id, "/zbus-remote", body)
    )
    assert status == 200 and headers.get(BATCH_HEADER) == "1"
    assert [code for code, _ in doc["results"]] == [200, 409, 404, 400, 401, 200]
    rb = aioredis.Redis.from_url(b.url)
    try:

        async def both_queued() -> bool:
            return int(await rb.llen("msgbus.echo")) == 2

        await eventually(both_queued)
        uids = sorted(json.loads(raw)["uid"] for raw in await rb.lrange("msgbus.echo", 0, -1))
        assert uids == [f"{b.id}.1", f"{b.id}.4"]
    finally:
        await rb.aclose()


async def test_one_signature_covers_the_whole_batch(twins):
    a, b = twins(2)
    await b.start_bus()
    body = b"\n".join(request_body(a.id, b.id, f"{b.id}.{n}") for n in (1, 2))
    headers = signed(a.signer, a.id, b.id, "/zbus-remote", body)
    tampered = body.replace(f"{b.id}.2".encode(), f"{b.id}.9".encode())
    status, doc, _ = await post_batch(b.port, "/zbus-remote", tampered, headers)
    assert status == 401 and "results" not in doc
    # signed for the other endpoint: refused as a whole too
    status, _, _ = await post_batch(b.port, "/zbus-reply", body, headers)
    assert status == 401
    # a batch must name its sender
    no_twin = {k: v for k, v in headers.items() if k != TWIN_HEADER}
    status, _, _ = await post_batch(b.port, "/zbus-remote", body, no_twin)
    assert status == 400
    rb = aioredis.Redis.from_url(b.url)
    try:
        assert await rb.llen("msgbus.system.remote") == 0
        assert await rb.llen("msgbus.echo") == 0
    finally:
        await rb.aclose()
    status, doc, _ = await post_batch(b.port, "/zbus-remote", body, headers)
    assert status == 200 and doc["results"] == [[200, ""], [200, ""]]


async def test_concurrent_calls_share_posts(twins):
    a, b = twins(2)
    await a.start_bus()
    await b.start_bus()
    server = b.server(workers=4, batch=64)

    @server.handler("bench.echo")
    async def echo(data: bytes, request: Any) -> bytes:
        return data

    task = asyncio.create_task(server.serve())
    client = a.client()
    try:
        calls = 300
        room = asyncio.Semaphore(24)  # the client's pool has 32 connections

        async def call(n: int) -> list[bytes]:
            async with room:
                return await client.call("bench.echo", dst=[b.id], data=f"m{n}")

        results = await asyncio.gather(*(call(n) for n in range(calls)))
        assert [r[0] for r in results] == [f"m{n}".encode() for n in range(calls)]
        assert a.bus is not None and b.bus is not None
        assert a.bus.forwarder.batches_to(b.id) and b.bus.forwarder.batches_to(a.id)
        # every envelope answered, in fewer POSTs than envelopes (requests and replies)
        assert a.bus.forwarder.sent == calls

        async def replies_counted() -> bool:  # b counts a reply when a's 200 reaches it
            return b.bus is not None and b.bus.forwarder.sent == calls

        await eventually(replies_counted)
        assert a.bus.forwarder.posts < calls and b.bus.forwarder.posts < calls
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class FakePeer:
    """A peer written from the seed: one envelope per POST, application/json only."""

    def __init__(self, *, advertise: bool) -> None:
        self.advertise = advertise
        self.bodies: list[bytes] = []
        self.content_types: list[str] = []
        self.batches_refused = 0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.content_types.append(request.content_type)
        headers = {BATCH_HEADER: "1"} if self.advertise else {}
        if request.content_type != "application/json":
            self.batches_refused += 1
            return web.json_response({"error": "unsupported"}, status=415, headers=headers)
        doc = json.loads(body)  # a batch would not parse: the seed peer's 400
        if not isinstance(doc, dict):
            return web.json_response({"error": "bad"}, status=400, headers=headers)
        self.bodies.append(body)
        return web.json_response({"ok": True}, headers=headers)


async def start_fake(port: int, peer: FakePeer) -> web.AppRunner:
    app = web.Application()
    app.router.add_post("/zbus-remote", peer.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


async def push_requests(url: str, dst: int, count: int) -> None:
    """``count`` seed requests in one RPUSH (so the bus takes them in one batch)."""
    client = aioredis.Redis.from_url(url)
    docs = [
        {
            "ver": 1,
            "uid": "",
            "cmd": "x.y",
            "exp": 60,
            "try": 4,
            "dat": "",
            "src": 0,
            "dst": [dst],
            "ret": str(uuid.uuid4()),
            "shm": "",
            "now": int(time.time()),
            "err": "",
        }  # fmt: skip
        for _ in range(count)
    ]
    try:
        await client.rpush(keys.BUS_LOCAL, *(json.dumps(doc) for doc in docs))
    finally:
        await client.aclose()


async def test_a_seed_peer_gets_single_envelopes(twins):
    a, b = twins(2)
    peer = FakePeer(advertise=False)
    runner = await start_fake(b.port, peer)
    try:
        await a.start_bus()
        await push_requests(a.url, b.id, 60)

        async def all_arrived() -> bool:
            return len(peer.bodies) >= 60

        await eventually(all_arrived)
        assert set(peer.content_types) == {"application/json"}
        uids = {json.loads(body)["uid"] for body in peer.bodies}
        assert len(uids) == 60
        assert a.bus is not None and not a.bus.forwarder.batches_to(b.id)
    finally:
        await runner.cleanup()


async def test_a_peer_that_refuses_a_batch_gets_singles_and_loses_nothing(twins):
    a, b = twins(2)
    peer = FakePeer(advertise=True)  # says it takes batches, then refuses them (downgraded)
    runner = await start_fake(b.port, peer)
    try:
        await a.start_bus()
        await push_requests(a.url, b.id, 1)

        async def learned() -> bool:
            return a.bus is not None and a.bus.forwarder.batches_to(b.id)

        await eventually(learned)
        await push_requests(a.url, b.id, 80)

        async def all_arrived() -> bool:
            return len(peer.bodies) >= 81

        await eventually(all_arrived)
        assert peer.batches_refused >= 1
        assert len({json.loads(body)["uid"] for body in peer.bodies}) == 81
        assert a.bus is not None and not a.bus.forwarder.batches_to(b.id)
        ra = aioredis.Redis.from_url(a.url)
        try:  # nothing was answered with an error: all 81 still wait for replies
            assert await ra.hlen(keys.BUS_BACKLOG) == 81
        finally:
            await ra.aclose()
    finally:
        await runner.cleanup()


async def test_hostile_batches_get_a_4xx_or_per_envelope_refusals_never_a_5xx(twins):
    a, b = twins(2)
    await b.start_bus(max_size=8192)
    good = request_body(a.id, b.id, f"{b.id}.1")
    bodies = {
        "too many envelopes": b"\n".join([b"{}"] * 600),
        "too big": good + b"\n" + b" " * 9000,
        "empty": b"",
        "deep": b"[" * 5000 + b"\n" + good,
        "nul and junk": b"\x00\xff\n{}\n[]\n\n",
        "huge int": good.replace(b'"exp":60', b'"exp":' + b"9" * 5000),
    }
    for name, body in bodies.items():
        status, doc, _ = await post_batch(
            b.port, "/zbus-remote", body, signed(a.signer, a.id, b.id, "/zbus-remote", body)
        )
        assert 400 <= status < 500 or status == 200, (name, status)
        if status == 200:
            assert all(400 <= code < 500 or code == 200 for code, _ in doc["results"]), name
    # the bus still takes a good one
    fresh = request_body(a.id, b.id, f"{b.id}.2")
    status, doc, _ = await post_batch(
        b.port, "/zbus-remote", fresh, signed(a.signer, a.id, b.id, "/zbus-remote", fresh)
    )
    assert status == 200 and doc["results"] == [[200, ""]]


class HoldingPeer:
    """A batching peer that answers no POST until released; records envelopes per POST."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.release = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        lines = (await request.read()).split(b"\n")
        self.sizes.append(len(lines))
        if len(self.sizes) > 1:  # the first POST teaches the sender that this peer batches
            await self.release.wait()
        results = [[200, ""] for _ in lines]
        body = {"results": results} if request.content_type == BATCH_TYPE else {"ok": True}
        return web.json_response(body, headers={BATCH_HEADER: "1"})


async def test_a_busy_lane_sends_one_post_at_a_time_unless_a_full_batch_waits():
    port = free_port()
    peer = HoldingPeer()
    app = web.Application()
    app.router.add_post("/zbus-remote", peer.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    finals: list[Any] = []

    async def done(outcomes: list[Any]) -> None:
        finals.extend(outcomes)

    fwd = Forwarder(
        twin=1001,
        directory=FileDirectory({1002: Peer(1002, f"http://127.0.0.1:{port}", "", None)}),
        signer=None,
        done=done,
        max_batch_bytes=250,  # two 100-byte envelopes (and the separator) are a full batch
    )

    def item(n: int) -> Outbound:
        return Outbound(
            due=0.0, id=f"req:1002.{n}", kind=Kind.REQUEST, to=1002,
            body=b'{"n":%d,"pad":"%s"}' % (n, b"x" * 80), deadline=time.time() + 60,
            tries=4, uid=f"1002.{n}",
        )  # fmt: skip

    running = asyncio.create_task(fwd.run())
    try:
        await fwd.submit(item(0))
        await eventually(lambda: len(finals) == 1)
        assert fwd.batches_to(1002)
        await fwd.submit(item(1))  # a POST of one, held by the peer
        await eventually(lambda: len(peer.sizes) == 2)
        for n in (2, 3):  # in separate loop turns: each could have had a POST of its own
            await fwd.submit(item(n))
            for _ in range(3):
                await asyncio.sleep(0)
        # they wait behind the POST in flight (less than a full batch waits) ...
        assert len(peer.sizes) == 2
        for n in (4, 5):
            await fwd.submit(item(n))
        # ... until a full batch waits: it goes at once, beside the one in flight
        await eventually(lambda: len(peer.sizes) == 3)
        peer.release.set()
        await eventually(lambda: len(finals) == 6)
        assert peer.sizes[:3] == [1, 1, 2] and sum(peer.sizes) == 6
        assert all(outcome is Outcome.DELIVERED for _, outcome, _ in finals)
    finally:
        peer.release.set()
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await runner.cleanup()
