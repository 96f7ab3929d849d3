"""Property: random concurrent mixes of messages, requests, cancellations and duplexes over a
real socketpair always complete correctly and close cleanly."""

from __future__ import annotations

import asyncio
import contextlib
import socket

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.dialogue.connection import Connection
from pipeline.dialogue.duplex import Duplex
from pipeline.dialogue.protocol import Role

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("msg"), st.booleans(), st.integers(0, 300)),
        st.tuples(st.just("req"), st.booleans(), st.integers(0, 3000)),
        st.tuples(st.just("cancel"), st.booleans(), st.integers(0, 3)),
        st.tuples(st.just("duplex"), st.booleans(), st.integers(0, 6)),
    ),
    max_size=25,
)


async def handle_request(data: bytes) -> bytes:
    if data.startswith(b"slow"):
        await asyncio.sleep(10)
    for _ in range(data[-1:] and data[-1] % 3 or 0):
        await asyncio.sleep(0)
    return b"re:" + data


async def handle_duplex(d: Duplex) -> None:
    async for chunk in d:
        await d.send(chunk[::-1])


async def scenario(ops: list[tuple[str, bool, int]], window: int | None) -> None:
    got: dict[bool, list[bytes]] = {True: [], False: []}
    a, b = socket.socketpair()
    ra, wa = await asyncio.open_connection(sock=a)
    rb, wb = await asyncio.open_connection(sock=b)
    common = {
        "on_request": handle_request,
        "on_duplex": handle_duplex,
        "window": window,
        "duplex_queue_bytes": 4096,
    }
    client = Connection.over_streams(ra, wa, Role.CLIENT, on_message=got[True].append, **common)
    server = Connection.over_streams(rb, wb, Role.SERVER, on_message=got[False].append, **common)
    conns = {True: client, False: server}
    sent: dict[bool, list[bytes]] = {True: [], False: []}
    async with client, server:

        async def run(i: int, op: tuple[str, bool, int]) -> None:
            kind, side, n = op
            me = conns[side]
            if kind == "msg":
                data = b"m%d:" % i + b"x" * n
                sent[not side].append(data)  # what the peer should receive
                await me.send_message(data)
            elif kind == "req":
                data = b"q%d:" % i + b"y" * n
                assert await me.request(data, timeout=30) == b"re:" + data
            elif kind == "cancel":
                task = asyncio.create_task(me.request(b"slow%d" % i))
                for _ in range(n):
                    await asyncio.sleep(0)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            else:
                chunks = [b"%d-%d" % (i, k) * (k + 1) * 50 for k in range(n)]
                async with me.duplex() as d:
                    for chunk in chunks:
                        await d.send(chunk)
                    await d.end()
                    assert [c async for c in d] == [c[::-1] for c in chunks]

        async with asyncio.timeout(60):
            await asyncio.gather(*(run(i, op) for i, op in enumerate(ops)))
            await client.request(b"barrier")  # every earlier message is in
            await server.request(b"barrier")
            # Messages sent concurrently interleave, but each side's own order holds.
            for side in (True, False):
                assert sorted(got[not side]) == sorted(sent[not side])
            await client.close(timeout=10)
    assert client.close_reason == "closed" and client.error is None
    assert server.close_reason == "closed" and server.error is None


@settings(max_examples=25, deadline=None)
@given(OPS, st.sampled_from([None, 2048]))
def test_random_concurrent_operations_over_a_socketpair(
    ops: list[tuple[str, bool, int]], window: int | None
) -> None:
    asyncio.run(scenario(ops, window))
