"""The /zbus-remote and /zbus-reply endpoints refuse what they must: forged, replayed, stray."""

from __future__ import annotations

import json
import time
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from pipeline import keys
from pipeline.bus.envelope import Envelope
from pipeline.bus.signing import SIGNATURE_HEADER, TIME_HEADER, TWIN_HEADER, Signer

from .conftest import eventually

pytestmark = pytest.mark.timeout(60)


def request_body(src: int, dst: int, uid: str, **fields: Any) -> bytes:
    env = Envelope(
        uid=uid, cmd="echo", exp=60, try_=1, src=src, dst=[dst], ret="r-1", now=int(time.time())
    )
    return env.copy(**fields).encode()


def signed_headers(
    signer: Signer, twin: int, path: str, body: bytes, *, to: int | None = None, skew_s: float = 0
) -> dict[str, str]:
    """What a sending bus puts on a POST (see pipeline.bus.signing)."""
    if to is None:
        try:
            dst = json.loads(body)["dst"]
            to = dst[0] if isinstance(dst, list) else dst
        except ValueError:
            to = 0
    sent_ms = int((time.time() + skew_s) * 1000)
    signature = signer.sign_post(src=twin, dst=to, path=path, sent_ms=sent_ms, body=body)
    return {TWIN_HEADER: str(twin), TIME_HEADER: str(sent_ms), SIGNATURE_HEADER: signature}


async def post(
    port: int, path: str, body: bytes, signer: Signer | None, twin: int, **sign: Any
) -> tuple[int, str]:
    headers = {TWIN_HEADER: str(twin)}
    if signer is not None:
        headers = signed_headers(signer, twin, path, body, **sign)
    return await post_raw(port, path, body, headers)


async def post_raw(port: int, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"http://127.0.0.1:{port}{path}", data=body, headers=headers) as resp,
    ):
        return resp.status, await resp.text()


async def test_signed_request_accepted_once_then_replay_refused(twins):
    a, b = twins(2)
    await b.start_bus()
    body = request_body(a.id, b.id, f"{b.id}.7")
    assert (await post(b.port, "/zbus-remote", body, a.signer, a.id))[0] == 200
    status, text = await post(b.port, "/zbus-remote", body, a.signer, a.id)
    assert status == 409 and "replayed" in text
    rb = aioredis.Redis.from_url(b.url)
    try:

        async def moved_on() -> bool:  # the remote loop moved it to msgbus.echo
            return bool(await rb.llen("msgbus.echo"))

        await eventually(moved_on)
        queued = await rb.lrange("msgbus.echo", 0, -1)
        assert len(queued) == 1
        assert json.loads(queued[0])["ret"] == keys.BUS_REPLY
    finally:
        await rb.aclose()


async def test_forged_unsigned_and_unknown_refused(twins):
    a, b, c = twins(3)
    await b.start_bus()
    body = request_body(a.id, b.id, f"{b.id}.1")
    intruder = Signer.generate()
    assert (await post(b.port, "/zbus-remote", body, intruder, a.id))[0] == 401  # forged
    assert (await post(b.port, "/zbus-remote", body, c.signer, a.id))[0] == 401  # c's key, a's name
    assert (await post(b.port, "/zbus-remote", body, None, a.id))[0] == 401  # unsigned
    assert (await post(b.port, "/zbus-remote", body, c.signer, c.id))[0] == 401  # header != src
    tampered = body.replace(b'"cmd":"echo"', b'"cmd":"evil"')
    headers = signed_headers(a.signer, a.id, "/zbus-remote", body)
    assert (await post_raw(b.port, "/zbus-remote", tampered, headers))[0] == 401
    stranger = request_body(9999, b.id, f"{b.id}.2")
    assert (await post(b.port, "/zbus-remote", stranger, intruder, 9999))[0] == 403
    assert (await post(b.port, "/zbus-remote", request_body(a.id, c.id, "x.1"), a.signer, a.id))[
        0
    ] == 404
    assert (await post(b.port, "/zbus-remote", b"{not json", a.signer, a.id))[0] == 400
    expired = request_body(a.id, b.id, f"{b.id}.3", now=int(time.time()) - 120)
    assert (await post(b.port, "/zbus-remote", expired, a.signer, a.id))[0] == 410
    rb = aioredis.Redis.from_url(b.url)
    try:
        assert await rb.llen("msgbus.echo") == 0 and await rb.llen("msgbus.evil") == 0
        assert await rb.llen(keys.BUS_REMOTE) == 0
    finally:
        await rb.aclose()


async def test_legacy_peers_accept_unsigned_but_not_forged(twins):
    a, b = twins(2)
    await b.start_bus(legacy_peers=True)
    body = request_body(a.id, b.id, f"{b.id}.1")
    assert (await post(b.port, "/zbus-remote", body, None, a.id))[0] == 200
    body2 = request_body(a.id, b.id, f"{b.id}.2")
    assert (await post(b.port, "/zbus-remote", body2, Signer.generate(), a.id))[0] == 401


async def test_replies_must_match_the_backlog(twins):
    a, b, c = twins(3)
    await a.start_bus()
    ra = aioredis.Redis.from_url(a.url)
    try:
        # a request a sent to b is pending in a's backlog
        pending = request_body(a.id, b.id, f"{b.id}.5", ret="caller-queue")
        await ra.hset(keys.BUS_BACKLOG, f"{b.id}.5", pending)
        reply = Envelope(uid=f"{b.id}.5", cmd="echo", src=b.id, dst=[a.id], ret=keys.BUS_REPLY)
        # unknown uid
        stray = reply.copy(uid=f"{b.id}.6").encode()
        assert (await post(a.port, "/zbus-reply", stray, b.signer, b.id))[0] == 404
        # c answers in b's place, with its own valid signature
        spoof = reply.copy(src=c.id).encode()
        assert (await post(a.port, "/zbus-reply", spoof, c.signer, c.id))[0] == 403
        # forged signature for b
        assert (await post(a.port, "/zbus-reply", reply.encode(), c.signer, b.id))[0] == 401
        assert await ra.llen("caller-queue") == 0
        # the genuine reply goes through to the caller's ret, exactly once
        assert (await post(a.port, "/zbus-reply", reply.encode(), b.signer, b.id))[0] == 200
        popped = await ra.blpop(["caller-queue"], timeout=5)
        assert popped is not None and json.loads(popped[1])["src"] == b.id
        assert (await post(a.port, "/zbus-reply", reply.encode(), b.signer, b.id))[0] == 404
        assert await ra.hlen(keys.BUS_BACKLOG) == 0
    finally:
        await ra.aclose()


async def test_unknown_path_wrong_method_and_oversized_body_refused(twins):
    a, b = twins(2)
    await b.start_bus(max_size=4096)
    body = request_body(a.id, b.id, f"{b.id}.8")
    assert (await post(b.port, "/zbus-elsewhere", body, a.signer, a.id))[0] == 404
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{b.port}/zbus-remote") as resp,
    ):
        assert resp.status == 405
    big = request_body(a.id, b.id, f"{b.id}.9", dat="QUFB" * 4000)
    assert (await post(b.port, "/zbus-remote", big, a.signer, a.id))[0] == 413
    # the endpoint still works after those
    assert (await post(b.port, "/zbus-remote", body, a.signer, a.id))[0] == 200


async def test_captured_post_is_refused_after_the_envelope_expired(twins):
    """Issue 11: ``now: 0`` made a captured POST fresh again once its seen entry was swept."""
    a, b = twins(2)
    await b.start_bus(replay_window_s=1.5)
    body = request_body(a.id, b.id, f"{b.id}.40", now=0, exp=1)
    captured = signed_headers(a.signer, a.id, "/zbus-remote", body)
    assert (await post_raw(b.port, "/zbus-remote", body, captured))[0] == 200
    assert (await post_raw(b.port, "/zbus-remote", body, captured))[0] == 409
    rb = aioredis.Redis.from_url(b.url)
    try:

        async def forgotten() -> bool:  # exp is over and the scrubber forgot the uid
            return await rb.zcard(keys.bus_seen()) == 0 and await rb.llen("msgbus.echo") == 1

        await eventually(forgotten)
        status, text = await post_raw(b.port, "/zbus-remote", body, captured)
        assert status == 401 and "clock window" in text
        assert await rb.llen("msgbus.echo") == 1  # the handler got it exactly once
    finally:
        await rb.aclose()


async def test_seen_uid_outlives_a_short_deadline_within_the_clock_window(twins):
    a, b = twins(2)
    await b.start_bus(replay_window_s=30)
    body = request_body(a.id, b.id, f"{b.id}.41", now=0, exp=1)
    captured = signed_headers(a.signer, a.id, "/zbus-remote", body)
    assert (await post_raw(b.port, "/zbus-remote", body, captured))[0] == 200
    await b.bus.scrub(time.time() + 5)  # the scrubber after exp: the uid is still remembered
    assert (await post_raw(b.port, "/zbus-remote", body, captured))[0] == 409
    rb = aioredis.Redis.from_url(b.url)
    try:
        [(member, score)] = await rb.zrange(keys.bus_seen(), 0, -1, withscores=True)
        assert member == f"{a.id}:{b.id}.41".encode() and score >= time.time() + 25
    finally:
        await rb.aclose()


async def test_signed_time_outside_the_window_other_twin_or_path_refused(twins):
    a, b, c = twins(3)
    await b.start_bus(replay_window_s=60)
    body = request_body(a.id, b.id, f"{b.id}.42")
    for skew in (-120, 120):
        status, text = await post(b.port, "/zbus-remote", body, a.signer, a.id, skew_s=skew)
        assert status == 401 and "clock window" in text
    # signed for c (or for the reply endpoint), replayed to b's /zbus-remote
    assert (await post(b.port, "/zbus-remote", body, a.signer, a.id, to=c.id))[0] == 401
    headers = signed_headers(a.signer, a.id, "/zbus-reply", body)
    assert (await post_raw(b.port, "/zbus-remote", body, headers))[0] == 401
    # the old layout (signature over the body alone) and a missing time are refused
    old = {TWIN_HEADER: str(a.id), SIGNATURE_HEADER: a.signer.sign(body)}
    assert (await post_raw(b.port, "/zbus-remote", body, old))[0] == 401
    headers = signed_headers(a.signer, a.id, "/zbus-remote", body)
    del headers[TIME_HEADER]
    assert (await post_raw(b.port, "/zbus-remote", body, headers))[0] == 401
    assert (await post(b.port, "/zbus-remote", body, a.signer, a.id, skew_s=30))[0] == 200


async def test_seen_memory_is_bounded(twins):
    a, b = twins(2)
    await b.start_bus(max_seen=3)
    for i in range(3):
        body = request_body(a.id, b.id, f"{b.id}.{50 + i}")
        assert (await post(b.port, "/zbus-remote", body, a.signer, a.id))[0] == 200
    body = request_body(a.id, b.id, f"{b.id}.60")
    assert (await post(b.port, "/zbus-remote", body, a.signer, a.id))[0] == 503


async def test_idle_and_trickling_connections_are_bounded(twins):
    import asyncio
    import contextlib

    a, b = twins(2)
    await b.start_bus(http_idle_s=1.0, http_max_connections=8)
    idle = [await asyncio.open_connection("127.0.0.1", b.port) for _ in range(8)]
    for _, writer in idle[:4]:  # half a request head, then nothing
        writer.write(b"POST /zbus-remote HTTP/1.1\r\nX-Trickle: ")
        await writer.drain()

    async def trickle(writer: asyncio.StreamWriter) -> None:  # a header byte every 0.2 s
        for _ in range(100):
            writer.write(b"x")
            await asyncio.sleep(0.2)
            if writer.is_closing():
                return

    trickling = asyncio.create_task(trickle(idle[0][1]))
    # over the limit: closed on arrival
    reader, writer = await asyncio.open_connection("127.0.0.1", b.port)
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    # the idle ones are closed within the idle time, then real peers get in
    for reader, writer in idle:
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
    trickling.cancel()
    with contextlib.suppress(asyncio.CancelledError, ConnectionError):
        await trickling
    body = request_body(a.id, b.id, f"{b.id}.70")
    assert (await post(b.port, "/zbus-remote", body, a.signer, a.id))[0] == 200


async def test_a_trickled_body_gets_408_within_the_idle_time_and_is_closed(twins):
    """Issue 31, item 4: a body trickled at a byte every few seconds held its connection
    for as long as it trickled (1,023 of 1,100 still open after 90 s)."""
    import asyncio
    import contextlib

    a, b = twins(2)
    bus = await b.start_bus(http_idle_s=1.0)
    body = request_body(a.id, b.id, f"{b.id}.75")
    headers = signed_headers(a.signer, a.id, "/zbus-remote", body)
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    reader, writer = await asyncio.open_connection("127.0.0.1", b.port)
    writer.write(
        f"POST /zbus-remote HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{head}\r\n".encode()
    )

    async def trickle() -> None:  # a body byte every 0.2 s: 20 s for 100 bytes
        for byte in body:
            writer.write(bytes([byte]))
            await asyncio.sleep(0.2)

    trickling = asyncio.create_task(trickle())
    answer = b""
    try:
        # the 408, then the close; or a reset: closing a socket that holds unread bytes
        # resets it, and the reset may overtake the 408
        with contextlib.suppress(ConnectionResetError):
            while chunk := await asyncio.wait_for(reader.read(4096), 5):
                answer += chunk
    finally:
        trickling.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await trickling
        writer.close()
    assert answer == b"" or answer.startswith(b"HTTP/1.1 408 "), answer  # then closed
    assert bus.ingress.counts["slow_bodies"] == 1
    assert (await post(b.port, "/zbus-remote", body, a.signer, a.id))[0] == 200


async def test_fuzzed_bodies_get_a_4xx_never_a_5xx(twins):
    import random

    a, b = twins(2)
    await b.start_bus(max_size=8192)
    rng = random.Random(11)
    base = request_body(a.id, b.id, f"{b.id}.80")
    bombs = [
        b"[" * 100_000,
        b"{" * 1024,
        base.replace(b'"now":', b'"now":' + b"9" * 5000 + b","),
        base.replace(b'"exp":60', b'"exp":' + str(2**256).encode()),
        base.replace(b'"exp":60', b'"exp":' + str(2**63).encode()),
        base.replace(b'"src":1001', b'"src":"1001"'),
        base.replace(b'"dst":[1002]', b'"dst":[' + str(2**64).encode() + b"]"),
        b'{"ver":1,"cmd":"a","dst":[1002],"ret":"r","uid":"' + b"u" * 300 + b'"}',
        b"\xff\xfe\x00",
        b"",
    ]
    bodies = list(bombs)
    for _ in range(60):
        at = rng.randrange(len(base))
        chunk = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 16)))
        bodies.append(base[:at] + chunk + base[at + rng.randrange(4) :])
    async with aiohttp.ClientSession() as session:
        for i, body in enumerate(bodies):
            path = ("/zbus-remote", "/zbus-reply")[i % 2]
            for headers in (signed_headers(a.signer, a.id, path, body, to=b.id), {}):
                async with session.post(
                    f"http://127.0.0.1:{b.port}{path}", data=body, headers=headers
                ) as resp:
                    assert 400 <= resp.status < 500 or resp.status == 200, (body, resp.status)
    assert (await post(b.port, "/zbus-remote", base, a.signer, a.id))[0] == 200
