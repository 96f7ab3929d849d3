"""``sluice serve``'s /healthz while Redis refuses writes (``maxmemory``, ``noeviction``).

Serve only reads, but a Redis that refuses writes has stopped the chain's
producer: /healthz says degraded, with Redis's refusal as the cause, and ok
again once memory is freed.
"""

from __future__ import annotations

import aiohttp

from tests.support.poll import until
from tests.support.refusal import refusing


async def _health(base: str) -> tuple[int, dict[str, object]]:
    async with aiohttp.ClientSession() as session, session.get(base + "/healthz") as resp:
        return resp.status, await resp.json()


async def test_healthz_is_degraded_while_redis_refuses_writes(settings, serve, redis_url) -> None:
    async with serve(settings) as (base, _app):
        await until(lambda: _health(base), "ok", accept=lambda got: got[0] == 200)
        with refusing(redis_url):
            status, body = await until(
                lambda: _health(base), "degraded", accept=lambda got: got[0] == 503
            )
            assert body["status"] == "degraded" and body["redis"] == "up"
            assert "OutOfMemoryError" in str(body["redis_write"]), body
        status, body = await until(lambda: _health(base), "ok", accept=lambda got: got[0] == 200)
        assert body["redis_write"] == "ok"
