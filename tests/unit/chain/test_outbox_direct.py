"""Outbox: bounded, refuses what does not fit; its direct path keeps the order of texts."""

from __future__ import annotations

import asyncio

import pytest

from pipeline.chain.subscription import Outbox
from pipeline.chain.wsconn import _Rest


def test_full_outbox_still_refuses() -> None:
    box = Outbox(2)
    assert box.offer([b"a", b"b"])
    assert not box.offer([b"c"]) and len(box) == 2


class _Direct:
    """A direct path that sends ``room`` texts at most, then refuses until reopened."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.sent: list[bytes] = []

    def __call__(self, texts: list[bytes]) -> int:
        n = min(self.room, len(texts))
        self.room -= n
        self.sent += texts[:n]
        return n


def test_direct_takes_texts_only_while_nothing_is_queued() -> None:
    direct = _Direct(room=3)
    box = Outbox(4, direct=direct)
    assert box.offer([b"a", b"b"])
    assert direct.sent == [b"a", b"b"] and len(box) == 0
    assert box.offer([b"c", b"d", b"e"])  # one goes out, the rest queue in order
    assert direct.sent == [b"a", b"b", b"c"] and box.pop_many(10) == [b"d", b"e"]
    direct.room = 10
    assert box.offer([b"f"]) and box.offer([b"g"])
    assert direct.sent[-2:] == [b"f", b"g"]
    direct.room = 0
    assert box.offer([b"h"])
    direct.room = 10
    assert box.offer([b"i"])  # "h" is queued: "i" must not overtake it
    assert direct.sent[-1] == b"g" and box.pop_many(10) == [b"h", b"i"]


def test_direct_is_not_asked_for_what_does_not_fit() -> None:
    direct = _Direct(room=10)
    box = Outbox(2, direct=direct)
    assert not box.offer([b"a", b"b", b"c"])
    assert direct.sent == [] and len(box) == 0


async def _send(gate: asyncio.Future[None], log: list[str]) -> None:
    log.append("written")
    await gate  # what aiohttp's send_frame does when the transport is paused
    log.append("drained")


async def test_the_rest_of_a_started_send_runs_to_its_end_when_awaited() -> None:
    log: list[str] = []
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    step = _send(gate, log)
    first = step.send(None)  # the direct path's first step: written, then suspended
    assert log == ["written"]
    waiter = asyncio.create_task(_await(_Rest(step, first)))
    await asyncio.sleep(0)
    assert not waiter.done()
    gate.set_result(None)
    await asyncio.wait_for(waiter, 1)
    assert log == ["written", "drained"]


async def test_cancelling_the_awaiting_task_cancels_the_send() -> None:
    log: list[str] = []
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    step = _send(gate, log)
    waiter = asyncio.create_task(_await(_Rest(step, step.send(None))))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert log == ["written"] and gate.cancelled()


def test_closing_an_unfinished_send_closes_its_coroutine() -> None:
    loop = asyncio.new_event_loop()
    try:
        log: list[str] = []
        gate: asyncio.Future[None] = loop.create_future()
        step = _send(gate, log)
        rest = _Rest(step, step.send(None))
        rest.close()
        assert step.cr_frame is None  # finished: no "never awaited" or leaked frame
    finally:
        loop.close()


async def _await(rest: _Rest) -> None:
    await rest
