"""The floor of a bus in Python: what two bare forwarders cost, for ``bench_bus.py``.

Same topology as the bus (the client pushes to ``msgbus.system.local`` on Redis A,
a forwarder POSTs to a peer, which pushes to ``msgbus.$cmd`` on Redis B for the same
SDK handler; the reply goes back the same way to the caller's ``ret``), on the same
stack (uvloop, aiohttp, redis-py), batching as the bus does (one BLMPOP of up to 512,
one POST per batch, replies pushed in one pipeline), and nothing else: no signature,
no backlog or outbox, no validation past one JSON decode, no transaction, no retry, no
expiry, no flow control. What the bus costs above this floor is what its reliability
and security cost; what this floor costs is the shape's price in CPython.

    python bus_floor.py a|b REDIS_URL PORT PEER_URL    # one side; prints "ready"
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import msgspec
import redis.asyncio as aioredis
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pipeline.runtime.loops import loop_factory  # noqa: E402

LOCAL, REPLY = "msgbus.system.local", "msgbus.system.reply"
TWIN_A, TWIN_B = 1001, 1002
_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode


async def serve(port: int, path: str, handle: Callable[[bytes], Awaitable[None]]) -> None:
    async def endpoint(request: web.Request) -> web.Response:
        await handle(await request.read())
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post(path, endpoint)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()


async def forward(
    client: aioredis.Redis, queue: str, url: str, batch: Callable[[list[bytes]], bytes]
) -> None:
    """Forever: pop up to 512 entries of ``queue``, POST them as one body (not awaited:
    the next batch is popped while the POST is in flight, as the bus's lanes do)."""
    posts: set[asyncio.Task[None]] = set()
    async with aiohttp.ClientSession() as session:

        async def post(body: bytes) -> None:
            async with session.post(url, data=body) as response:
                await response.read()

        while True:
            popped = await client.blmpop(1, 1, queue, direction="LEFT", count=512)
            if popped:
                task = asyncio.ensure_future(post(batch(popped[1])))
                posts.add(task)
                task.add_done_callback(posts.discard)


async def side_a(client: aioredis.Redis, port: int, peer: str) -> None:
    """Twin A: requests out (a uid each, the caller's ``ret`` kept in memory), replies in."""
    rets: dict[str, str] = {}
    counter = 0

    def requests(raws: list[bytes]) -> bytes:
        nonlocal counter
        out = []
        for raw in raws:
            doc = _decode(raw)
            counter += 1
            uid = f"{TWIN_B}.{counter}"
            rets[uid] = doc["ret"]
            doc.update(uid=uid, src=TWIN_A, ret=REPLY)
            out.append(_encode(doc))
        return b"\n".join(out)

    async def replies(body: bytes) -> None:
        pipe = client.pipeline(transaction=False)
        for line in body.split(b"\n"):
            ret = rets.pop(_decode(line)["uid"], None)
            if ret:
                pipe.rpush(ret, line)
        await pipe.execute()

    await serve(port, "/reply", replies)
    print("ready", flush=True)
    await forward(client, LOCAL, f"{peer}/in", requests)


async def side_b(client: aioredis.Redis, port: int, peer: str) -> None:
    """Twin B: requests in, to the handler's queue (the first one's cmd: the bench sends
    one command); its replies out as they are."""

    async def requests(body: bytes) -> None:
        lines = body.split(b"\n")
        await client.rpush(f"msgbus.{_decode(lines[0])['cmd']}", *lines)

    await serve(port, "/in", requests)
    print("ready", flush=True)
    await forward(client, REPLY, f"{peer}/reply", b"\n".join)


def main() -> None:
    side, url, port, peer = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    run = side_a if side == "a" else side_b
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(run(aioredis.Redis.from_url(url), port, peer))


if __name__ == "__main__":
    main()
