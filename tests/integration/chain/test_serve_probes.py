"""Probes answer while the connection cap is full and a storm of websockets opens (issue 32, 3).

The server runs as ``sluice serve`` runs it (behind :meth:`ConnectionGuard.listen`)
with its cap lowered to 50: 50 websockets hold it, then 300 upgrade requests
come at once. ``/healthz`` and ``/metrics`` are still answered (on the probe
slots past the cap), and every upgrade past the cap gets the documented 503,
nothing else (before, a probe got the same 503 and an orchestrator restarted a
server that worked).
"""

from __future__ import annotations

import asyncio
import time

import aiohttp

from pipeline.chain.produce.generator import SyntheticChain, write_blocks
from pipeline.chain.serve.appkeys import GUARD, METRICS
from tests.support.poll import until

from .conftest import STREAM
from .test_admission import UPGRADE, guarded

CAP = 50
STORM = 300


async def _ask(port: int, head: bytes) -> bytes:
    """Send ``head`` at once on a fresh connection; everything the server answers, to its close."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head)
        return await reader.read()
    finally:
        writer.close()


async def _probe(port: int, path: str) -> tuple[bytes, float]:
    began = time.monotonic()
    answer = await _ask(port, b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path.encode())
    return answer, time.monotonic() - began


async def test_probes_are_answered_while_the_cap_is_full_and_a_storm_opens(
    settings, redis_client
) -> None:
    write_blocks(redis_client, STREAM, SyntheticChain(seed=321).take(5))
    settings = settings.replace(serve_max_connections=CAP, serve_header_timeout_s=30.0)
    async with guarded(settings) as (base, port, app), aiohttp.ClientSession() as http:
        held = [await http.ws_connect(base + "/ws") for _ in range(CAP)]
        try:
            await until(lambda: len(app[GUARD]) == CAP, "the cap held by websockets")
            storm = [asyncio.create_task(_ask(port, UPGRADE + b"\r\n")) for _ in range(STORM)]
            probes = [await _probe(port, p) for _ in range(5) for p in ("/healthz", "/metrics")]
            answers = await asyncio.gather(*storm)
        finally:
            for ws in held:
                await ws.close()
        for (answer, _s), path in zip(probes, ["/healthz", "/metrics"] * 5, strict=True):
            assert b"too many connections" not in answer, (path, answer[:200])
            head, _, body = answer.partition(b"\r\n\r\n")
            if path == "/metrics":
                assert head.startswith(b"HTTP/1.1 200"), head
                assert b"sluice_serve_connections_refused_total" in body
            else:  # 200 or 503 (degraded: no lake here), the health document either way
                assert body.startswith(b"{") and b'"status"' in body, answer[:300]
            assert b"Connection: close" in head  # a probe slot is given back after each
        # every upgrade past the cap: the documented 503, read whole (no reset, no 408)
        refused = [a for a in answers if a.startswith(b"HTTP/1.1 503")]
        assert len(refused) == STORM, [a[:60] for a in answers if a not in refused][:5]
        assert all(a.endswith(b"too many connections: try later") for a in refused)
        assert app[METRICS].values["sluice_serve_connections_refused_total"] == STORM
        assert app[METRICS].values["sluice_serve_header_timeouts_total"] == 0
        assert app[GUARD].probes == 0


async def test_a_probe_slot_serves_nothing_but_probes(settings, redis_client) -> None:
    """A connection let in as a probe that asks for more gets the 503 and is closed."""
    settings = settings.replace(serve_max_connections=1, serve_header_timeout_s=30.0)
    async with (
        guarded(settings) as (base, port, app),
        aiohttp.ClientSession() as http,
        http.ws_connect(base + "/ws"),
    ):
        await until(lambda: len(app[GUARD]) == 1, "the cap held")
        pipelined = (
            b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\nGET /status.json HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        answer = await _ask(port, pipelined)
        assert answer.startswith(b"HTTP/1.1 200")
        assert b"HTTP/1.1 503" not in answer  # closed after the probe's answer
        assert await _ask(port, b"POST /healthz HTTP/1.1\r\nHost: x\r\n\r\n") == (
            b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n"
            b"Content-Type: text/plain\r\nContent-Length: 31\r\n\r\n"
            b"too many connections: try later"
        )


async def test_the_door_is_bounded_and_timed(settings, redis_client, monkeypatch) -> None:
    """Past the cap, a head must come in time too (408), and the door holds DOOR_SLOTS at most:
    a newcomer makes room by refusing the one that waited longest (503)."""
    from pipeline.chain.serve import admission

    monkeypatch.setattr(admission, "DOOR_SLOTS", 2)
    settings = settings.replace(serve_max_connections=1, serve_header_timeout_s=1.0)
    async with (
        guarded(settings) as (base, port, app),
        aiohttp.ClientSession() as http,
        http.ws_connect(base + "/ws"),
    ):
        await until(lambda: len(app[GUARD]) == 1, "the cap held")
        waiting = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        for _reader, writer in waiting:
            writer.write(b"GET /healthz HTTP/1.1\r\n")  # never ends
        answers = await asyncio.gather(*(r.read() for r, _w in waiting))
        for _r, w in waiting:
            w.close()
        assert answers[0].startswith(b"HTTP/1.1 503")  # made room for the third
        assert [a[:12] for a in answers[1:]] == [b"HTTP/1.1 408"] * 2
        values = app[METRICS].values
        assert values["sluice_serve_header_timeouts_total"] == 2
        assert values["sluice_serve_connections_refused_total"] == 1
