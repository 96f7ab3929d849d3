"""Outbox: bounded, refuses what does not fit, keeps the order of texts, wakes its one writer."""

from __future__ import annotations

import asyncio

from pipeline.chain.outbox import FanoutBatch, Outbox


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


async def test_offers_while_a_batch_is_held_wait_for_its_flush_and_go_out_inline() -> None:
    batch = FanoutBatch()
    sent: list[bytes] = []
    box: Outbox

    async def inline() -> None:
        while (text := box.pop()) is not None:
            sent.append(text)

    box = Outbox(4, batch=batch, inline=inline)
    writer = asyncio.create_task(box.wait())
    await asyncio.sleep(0)
    with batch.held():
        assert box.offer([b"a"]) and box.offer([b"b"])
    await batch.flush()  # at once, as the hub's publisher does
    assert sent == [b"a", b"b"] and len(box) == 0
    await asyncio.sleep(0.01)
    assert not writer.done()  # no wake-up: sent inline, and the fallback was cancelled
    writer.cancel()


async def test_what_inline_leaves_wakes_the_writer() -> None:
    batch = FanoutBatch()

    async def inline() -> None:
        return  # e.g. the transport's buffer is not empty: nothing goes out inline

    box = Outbox(4, batch=batch, inline=inline)
    writer = asyncio.create_task(box.wait())
    await asyncio.sleep(0)
    with batch.held():
        box.offer([b"a"])
    await batch.flush()
    await asyncio.wait_for(writer, 1)
    assert box.pop_many(10) == [b"a"]


async def test_a_held_publish_nobody_flushes_still_wakes_the_writer() -> None:
    batch = FanoutBatch()
    box = Outbox(4, batch=batch, inline=None)
    writer = asyncio.create_task(box.wait())
    await asyncio.sleep(0)
    with batch.held():
        box.offer([b"a"])
    await asyncio.wait_for(writer, 1)  # the fallback, one loop iteration later
    assert box.pop_many(10) == [b"a"]


class _Direct:
    """A DirectSender that records what it sends; ``ready`` and ``fail_on`` steer it."""

    def __init__(self, *, ready: bool = True, fail_on: bytes | None = None) -> None:
        self.is_ready = ready
        self.fail_on = fail_on
        self.out: list[bytes] = []
        self.counted = 0
        self.errors: list[Exception] = []

    async def send(self, text: bytes) -> None:
        if text == self.fail_on:
            raise ConnectionResetError("peer gone")
        self.out.append(text)

    def ready(self, size: int) -> bool:
        return self.is_ready

    def sent(self, count: int) -> None:
        self.counted += count

    def failed(self, exc: Exception) -> None:
        self.errors.append(exc)


async def test_an_offer_to_an_empty_outbox_goes_out_directly_at_the_flush() -> None:
    batch = FanoutBatch()
    direct = _Direct()
    box = Outbox(4, batch=batch, direct=direct)
    writer = asyncio.create_task(box.wait())
    await asyncio.sleep(0)
    with batch.held():
        assert box.offer([b"a"]) and box.offer([b"b"])
        assert len(box) == 0  # not queued: the flush sends them
    await batch.flush()
    assert direct.out == [b"a", b"b"] and direct.counted == 2 and len(box) == 0
    await asyncio.sleep(0.01)
    assert not writer.done()  # no writer wake-up, and the fallback was cancelled
    writer.cancel()


async def test_a_direct_text_that_cannot_go_out_now_is_queued_in_order_for_the_writer() -> None:
    batch = FanoutBatch()
    direct = _Direct(ready=False)  # e.g. the transport's write buffer is not empty
    box = Outbox(4, batch=batch, direct=direct)
    writer = asyncio.create_task(box.wait())
    await asyncio.sleep(0)
    with batch.held():
        box.offer([b"a", b"b"])
    await batch.flush()
    await asyncio.wait_for(writer, 1)
    assert direct.out == [] and box.pop_many(10) == [b"a", b"b"]


async def test_offers_behind_an_unflushed_direct_text_keep_their_order() -> None:
    batch = FanoutBatch()
    direct = _Direct()
    box = Outbox(4, batch=batch, direct=direct)
    with batch.held():
        box.offer([b"a"])
    assert box.offer([b"b"])  # not held any more, but "a" still waits for the flush
    await batch.flush()
    assert direct.out == [b"a", b"b"]


async def test_a_publish_nobody_flushes_queues_its_direct_texts_for_the_writer() -> None:
    batch = FanoutBatch()
    box = Outbox(4, batch=batch, direct=_Direct())
    writer = asyncio.create_task(box.wait())
    await asyncio.sleep(0)
    with batch.held():
        box.offer([b"a"])
    await asyncio.wait_for(writer, 1)  # the fallback, one loop iteration later
    assert box.pop_many(10) == [b"a"]


async def test_a_failed_direct_send_is_reported_and_the_others_still_go_out() -> None:
    batch = FanoutBatch()
    gone, fine = _Direct(fail_on=b"x"), _Direct()
    first, second = Outbox(4, batch=batch, direct=gone), Outbox(4, batch=batch, direct=fine)
    with batch.held():
        first.offer([b"x"])
        second.offer([b"y"])
    await batch.flush()
    assert [type(e) for e in gone.errors] == [ConnectionResetError] and gone.counted == 0
    assert fine.out == [b"y"] and fine.counted == 1


def test_a_full_outbox_refuses_before_anything_goes_direct() -> None:
    batch = FanoutBatch()
    box = Outbox(2, batch=batch, direct=_Direct())
    with batch.held():
        assert not box.offer([b"a", b"b", b"c"])  # more than the limit: the slow-reader check
    assert batch.direct == []
