"""Outbox: bounded, refuses what does not fit, keeps the order of texts, wakes its one writer."""

from __future__ import annotations

import asyncio

from pipeline.chain.outbox import Outbox


def test_full_outbox_still_refuses() -> None:
    box = Outbox(2)
    assert box.offer([b"a", b"b"])
    assert not box.offer([b"c"]) and len(box) == 2


def test_offers_come_out_in_order_and_whole() -> None:
    box = Outbox(4)
    assert box.offer((b"a",)) and box.offer([b"b", b"c"])
    assert not box.offer([b"d", b"e"])  # all or nothing
    assert box.pop_many(2) == [b"a", b"b"]
    assert box.offer([b"d", b"e"])
    assert box.pop_many(10) == [b"c", b"d", b"e"] and box.pop_many(10) == []


async def test_a_waiting_writer_wakes_for_an_offer() -> None:
    box = Outbox(4)
    writer = asyncio.create_task(box.wait())
    await asyncio.sleep(0)
    assert not writer.done()
    assert box.offer([b"a"])
    await asyncio.wait_for(writer, 1)
    await asyncio.wait_for(box.wait(), 1)  # something queued: returns at once
    assert box.pop_many(10) == [b"a"]


async def test_a_cancelled_wait_leaves_the_outbox_usable() -> None:
    box = Outbox(4)
    writer = asyncio.create_task(box.wait())
    await asyncio.sleep(0)
    writer.cancel()
    await asyncio.gather(writer, return_exceptions=True)
    again = asyncio.create_task(box.wait())
    await asyncio.sleep(0)
    box.offer([b"a"])
    await asyncio.wait_for(again, 1)


async def test_put_waits_for_room_below_half() -> None:
    box = Outbox(4)
    assert box.offer([b"a", b"b", b"c", b"d"])
    put = asyncio.create_task(box.put([b"e"]))
    await asyncio.sleep(0)
    assert box.pop_many(1) == [b"a"]  # 3 left: more than half, still no room
    await asyncio.sleep(0)
    assert not put.done()
    assert box.pop_many(1) == [b"b"]
    await asyncio.wait_for(put, 1)
    assert box.pop_many(10) == [b"c", b"d", b"e"]
