"""serve counts its Redis errors by kind (issue 32, item 6).

Before, ``sluice_serve_redis_errors_total`` counted the live tailer's read errors only,
with no kind: it stayed 0 through a 90 s write refusal and 12 stalls while /healthz
said degraded. Here a real private redis-server refuses writes (OOM, READONLY,
MISCONF, NOREPLICAS), stalls (SIGSTOP) and goes away; each time /healthz says why and
``/metrics`` shows the failures under the right ``kind``, every kind listed from 0.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
from collections.abc import Callable
from contextlib import AbstractContextManager

import aiohttp
import pytest
import redis as redis_sync

from pipeline.chain.produce.generator import SyntheticChain, write_blocks
from pipeline.chain.serve.dialogue_feed import subscribe_dialogue
from pipeline.errors import DuplexError
from pipeline.redisio.errorkind import KINDS
from pipeline.runtime.ports import free_port
from tests.support.poll import until
from tests.support.refusal import misconf, noreplicas, refusing, replica

from .conftest import STREAM

pytestmark = pytest.mark.timeout(120)

_SAMPLE = re.compile(r'^sluice_serve_redis_errors_total\{kind="(\w+)"\} (\S+)$', re.M)


async def _get(base: str, path: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(base + path) as resp:
        return resp.status, await resp.text()


async def errors(base: str) -> dict[str, float]:
    """``sluice_serve_redis_errors_total`` of the server at ``base``, by kind."""
    _, text = await _get(base, "/metrics")
    return {kind: float(value) for kind, value in _SAMPLE.findall(text)}


def _refusal(kind: str, url: str, spare: str) -> AbstractContextManager[object]:
    made: dict[str, Callable[[], AbstractContextManager[object]]] = {
        "oom": lambda: refusing(url),
        "readonly": lambda: replica(url, spare),
        "misconf": lambda: misconf(url),
        "noreplicas": lambda: noreplicas(url),
    }
    return made[kind]()


@pytest.mark.parametrize(
    ("kind", "cause"),
    [
        ("oom", "OutOfMemoryError"),
        ("readonly", "ReadOnlyError"),
        ("misconf", "MISCONF"),
        ("noreplicas", "NOREPLICAS"),
    ],
)
async def test_write_refusals_are_counted_by_kind(
    settings, serve, redis_factory, kind, cause
) -> None:
    server, spare = redis_factory(), redis_factory()
    with redis_sync.Redis.from_url(server.url) as client:
        write_blocks(client, STREAM, SyntheticChain(seed=61).take(3))
    async with serve(settings.replace(redis_url=server.url)) as (base, _app):
        await until(lambda: _get(base, "/healthz"), "ok", accept=lambda got: got[0] == 200)
        assert await errors(base) == dict.fromkeys(KINDS, 0.0)  # every kind listed, at 0
        with _refusal(kind, server.url, spare.url):
            status, body = await until(
                lambda: _get(base, "/healthz"), "degraded", accept=lambda got: got[0] == 503
            )
            assert cause in body, body
            counted = await until(
                lambda: errors(base), f"{kind} counted", accept=lambda got: got[kind] >= 1
            )
        assert {k: v for k, v in counted.items() if v and k != kind} == {}, counted
        await until(lambda: _get(base, "/healthz"), "ok again", accept=lambda got: got[0] == 200)


async def test_a_stalled_redis_is_counted_as_timeouts(settings, serve, redis_factory) -> None:
    server = redis_factory()
    async with serve(settings.replace(redis_url=server.url)) as (base, _app):
        await until(lambda: _get(base, "/healthz"), "ok", accept=lambda got: got[0] == 200)
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            status, body = await _get(base, "/healthz")  # its write probe waits 2 s
            assert status == 503 and "timed out" in body, body
            counted = await errors(base)
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        assert counted["timeout"] >= 1, counted
        await until(lambda: _get(base, "/healthz"), "ok again", accept=lambda got: got[0] == 200)


async def test_redis_gone_is_counted_as_connection_errors(
    settings, serve, connect, redis_factory
) -> None:
    server, port = redis_factory(), free_port()
    settings = settings.replace(redis_url=server.url, serve_dialogue_port=port)
    async with serve(settings) as (base, _app):
        await until(lambda: _get(base, "/healthz"), "ok", accept=lambda got: got[0] == 200)
        await asyncio.to_thread(server.stop)
        async with connect(base) as client:
            reply = await client.call(
                "cardinal_subscribe", ["streams", "0x0", "0x" + "00" * 32, []]
            )
        assert reply["error"]["message"] == "redis unavailable, retry later", reply
        with pytest.raises(DuplexError) as ended:  # the same over the Dialogue feed
            await anext(subscribe_dialogue("127.0.0.1", port, 0, None))
        assert json.loads(ended.value.data)["error"]["message"] == "redis unavailable, retry later"
        counted = await until(
            lambda: errors(base), "connection errors", accept=lambda got: got["connection"] >= 2
        )
        assert counted["other"] == 0, counted


async def test_a_dialogue_catch_up_cut_by_redis_ends_with_the_reason(
    settings, serve, redis_factory
) -> None:
    # Before, the catch-up's Redis error escaped the duplex's task group: no end, no count.
    server, port = redis_factory(), free_port()
    with redis_sync.Redis.from_url(server.url) as client:
        pipe = client.pipeline(transaction=False)
        write_blocks(pipe, STREAM, SyntheticChain(seed=62, value_size=1024).take(1500))
        pipe.execute()
    settings = settings.replace(redis_url=server.url, serve_dialogue_port=port)
    async with serve(settings) as (base, _app):
        feed = subscribe_dialogue("127.0.0.1", port, 0, None)
        await anext(feed)  # the catch-up runs, held by the subscriber reading nothing more
        await asyncio.to_thread(server.stop)
        with pytest.raises(DuplexError) as ended:
            async with asyncio.timeout(30):
                async for _result in feed:
                    pass
        assert ended.value.data == b"redis unavailable, resubscribe later"
        counted = await errors(base)
        assert counted["connection"] >= 1, counted
