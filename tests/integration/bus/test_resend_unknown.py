"""A request resent from the backlog after a kill -9 of its bus may have run: when no
resend gets through, its caller hears ``delivery unknown``, never ``remote unreachable``
(commit 2881bfc; the bus checker's seed 1011).

The sending bus is a real ``sluice bus`` process, killed -9 while the receiver's handler
holds the request (it has run); the link to the receiver is then cut (Toxiproxy), and
the restarted bus resends its backlog to a peer that refuses every connection.
"""

from __future__ import annotations

import json

import pytest
import redis.asyncio as aioredis

from pipeline import keys
from pipeline.bus.outbound import UNKNOWN_TEXT
from tests.support.toxiproxy import Toxiproxy, toxiproxy, toxiproxy_server

from .conftest import eventually
from .test_answered_retries import _through
from .test_process import seed_request
from .test_standby import buses

__all__ = ["buses", "toxiproxy", "toxiproxy_server"]

pytestmark = pytest.mark.timeout(90)

#: The call's exp: the restarted bus waits up to the lease's TTL (2 s) for its dead self.
EXP_S = 10


async def test_a_request_resent_after_a_kill_9_ends_delivery_unknown(
    twins,
    buses,
    toxiproxy: Toxiproxy,  # noqa: F811
) -> None:
    a, b = twins(2)
    link = toxiproxy.proxy("to-b", b.port)
    _through(str(a.directory_file), b.id, link.port)
    await b.start_bus()
    sender = buses(a, "first")
    ra, rb = aioredis.Redis.from_url(a.url), aioredis.Redis.from_url(b.url)
    try:
        doc = seed_request("work", [b.id], b"x", exp=EXP_S)
        await ra.rpush(keys.BUS_LOCAL, json.dumps(doc))
        # the handler takes the request (it has run) and holds its reply
        assert await rb.blpop([keys.bus_command("work")], timeout=EXP_S) is not None
        assert await ra.hlen(keys.BUS_BACKLOG) == 1  # pending: a restart resends it

        sender.close()  # kill -9
        link.cut()  # the receiver refuses every connection from now on
        buses(a, "again")  # resends its backlog once it holds the lease
        answer = await eventually(
            lambda: ra.lpop(doc["ret"]), "the caller's answer", within_s=EXP_S + 10
        )
        err = json.loads(answer)["err"]
        assert err.startswith(UNKNOWN_TEXT), err
    finally:
        await ra.aclose()
        await rb.aclose()
