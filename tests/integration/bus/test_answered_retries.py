"""A request whose reply came is never sent again (issue 31; the bus checker's seed 208).

The sender's POST reached the receiver, whose handler ran and replied, but the POST's
own response was lost: the sender retries it. Once the reply is matched (the caller
has its answer), no copy may leave the sender: a receiver that has lost its seen uids
would take the copy as new and run the handler a second time, after the caller had
its answer. Real buses and Redis; the lost responses are Toxiproxy's.
"""

from __future__ import annotations

import json

import pytest
import redis.asyncio as aioredis

from pipeline import keys
from pipeline.bus.envelope import decode, encode_data
from tests.support.toxiproxy import Toxiproxy, toxiproxy, toxiproxy_server

from .conftest import eventually
from .test_process import seed_request

__all__ = ["toxiproxy", "toxiproxy_server"]

pytestmark = pytest.mark.timeout(60)


def _through(twin_file: str, twin: int, port: int) -> None:
    """Point ``twin``'s address in the directory file at ``port`` (a proxy)."""
    with open(twin_file) as f:
        doc = json.load(f)
    doc[str(twin)]["url"] = f"http://127.0.0.1:{port}"
    with open(twin_file, "w") as f:
        json.dump(doc, f)


async def test_no_copy_of_an_answered_request_leaves_after_its_reply(
    twins,
    toxiproxy: Toxiproxy,  # noqa: F811
) -> None:
    a, b = twins(2)
    link = toxiproxy.proxy("to-b", b.port)  # a -> b's /zbus-remote; b's replies go direct
    _through(str(a.directory_file), b.id, link.port)
    # every response of b on this link is lost: the connection is reset at its first byte
    link.reset_peer(stream="downstream")
    await a.start_bus()
    await b.start_bus()
    ra, rb = aioredis.Redis.from_url(a.url), aioredis.Redis.from_url(b.url)
    try:
        doc = seed_request("work", [b.id], b"x", exp=30)
        await ra.rpush(keys.BUS_LOCAL, json.dumps(doc))
        # the handler: takes the request once and replies (its reply goes straight to a)
        popped = await rb.blpop([keys.bus_command("work")], timeout=10)
        assert popped is not None, "the request never reached the handler"
        request = decode(popped[1])
        reply = request.copy(src=b.id, dst=[request.src], dat=encode_data(b"done"), err="")
        await rb.rpush(keys.BUS_REPLY, reply.encode())
        answer = await ra.blpop([doc["ret"]], timeout=10)
        assert answer is not None and json.loads(answer[1])["err"] == "", answer
        # meanwhile a retries the POST whose response it never got (b says 409, lost too)

        # b loses its seen uids (as after a wipe) and the link heals: a copy sent now
        # would be taken as new, and handed to the handler a second time
        await rb.delete(keys.bus_seen())
        link.clear()
        delivered = ("remote", "delivered")
        await eventually(
            lambda: a.bus is not None and a.bus.forwarder.outcomes.get(delivered, 0) >= 1,
            "the request settled as delivered",
        )
        assert await rb.llen(keys.bus_command("work")) == 0, "a copy ran after the answer"
        assert a.bus is not None and a.bus.forwarder.outcomes.get(delivered) == 1
        assert not a.bus.forwarder._held  # nothing of it left in the sender
        assert await ra.llen(doc["ret"]) == 0  # and the caller was answered once
    finally:
        await ra.aclose()
        await rb.aclose()
