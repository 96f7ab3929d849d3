"""A node's mailboxes are bounded in payload bytes as well as in messages."""

from __future__ import annotations

import asyncio

from pipeline.routing.message import Route, TransportMessage
from pipeline.routing.node import Context, Node, Worker


class Stalled(Worker):
    mailbox_size = 1000
    mailbox_bytes = 1000

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.got: list[bytes] = []

    async def handle(self, ctx: Context) -> None:
        await self.release.wait()
        self.got.append(ctx.payload)


async def test_senders_wait_when_the_mailbox_holds_its_bytes() -> None:
    node = Node("n")
    worker = Stalled()
    await node.add_worker("w", worker)
    try:
        sends = [
            asyncio.create_task(
                node.deliver(TransportMessage(Route(["w"]), Route(), bytes([i]) * 400))
            )
            for i in range(10)
        ]
        async with asyncio.timeout(5):
            while sum(t.done() for t in sends) < 3:  # noqa: ASYNC110 - polls task states
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # more cannot get in while the handler is stalled
        slot = node._slots["w"]
        assert slot.bytes <= Stalled.mailbox_bytes
        assert sum(t.done() for t in sends) == 3  # one in the handler, two queued (800 bytes)
        worker.release.set()
        await asyncio.wait_for(asyncio.gather(*sends), 5)
        async with asyncio.timeout(5):
            while len(worker.got) < 10:  # noqa: ASYNC110 - the handler has no completion event
                await asyncio.sleep(0.01)
        assert sorted(p[0] for p in worker.got) == list(range(10))
    finally:
        await node.stop()


async def test_one_message_bigger_than_the_bound_still_gets_in() -> None:
    node = Node("n")
    worker = Stalled()
    worker.release.set()
    await node.add_worker("w", worker)
    try:
        await asyncio.wait_for(
            node.deliver(TransportMessage(Route(["w"]), Route(), b"x" * 5000)), 5
        )
        async with asyncio.timeout(5):
            while not worker.got:  # noqa: ASYNC110 - the handler has no completion event
                await asyncio.sleep(0.01)
    finally:
        await node.stop()
