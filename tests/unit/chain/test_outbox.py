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
    """A ``direct`` writer that writes (keeps) what it is given while ``open``."""

    def __init__(self) -> None:
        self.open = True
        self.written: list[tuple[bytes, int]] = []

    def __call__(self, wire: bytes, count: int) -> bool:
        if self.open:
            self.written.append((wire, count))
        return self.open


def test_an_offer_with_wire_goes_to_the_direct_writer_only_while_nothing_is_queued() -> None:
    direct = _Direct()
    box = Outbox(8, direct=direct)
    assert box.offer([b"a", b"b"], b"AB") and len(box) == 0
    assert direct.written == [(b"AB", 2)]
    direct.open = False  # e.g. the transport's buffer holds bytes: queued instead
    assert box.offer([b"c"], b"C") and box.peek() == b"c"
    direct.open = True
    assert box.offer([b"d"], b"D")  # something queued: behind it, never before it
    assert box.offer([b"e"])  # no wire (a reply, a catch-up text): always queued
    assert direct.written == [(b"AB", 2)]
    assert box.pop_many(10) == [b"c", b"d", b"e"]
    assert box.offer([b"f"], b"F") and direct.written[-1] == (b"F", 1) and len(box) == 0


def test_a_direct_write_does_not_bypass_the_limit_of_what_is_queued() -> None:
    direct = _Direct()
    direct.open = False
    box = Outbox(2, direct=direct)
    assert box.offer([b"a", b"b"], b"AB")
    assert not box.offer([b"c"], b"C")  # full: the slow subscriber's refusal, as before
    direct.open = True
    assert not box.offer([b"c"], b"C") and direct.written == []


def test_clear_drops_what_is_queued_and_the_outbox_takes_more() -> None:
    box = Outbox(3)
    assert box.offer([b"a", b"b", b"c"]) and not box.offer([b"d"])
    assert box.clear() == 3 and len(box) == 0 and box.peek() is None
    assert box.clear() == 0
    assert box.offer([b"d"]) and box.pop_many(5) == [b"d"]


def test_outboxes_sharing_a_budget_take_only_what_fits_in_both() -> None:
    from pipeline.chain.outbox import Budget

    budget = Budget(max_messages=3, max_bytes=10)
    a, b = Outbox(4, budget=budget), Outbox(4, budget=budget)
    assert a.offer([b"12345"]) and b.offer([b"1234"])
    assert not a.offer([b"12"])  # 11 bytes: over the budget, though a has room
    assert b.offer([b"1"]) and not a.offer([b"x"])  # 3 messages: full
    assert (budget.messages, budget.nbytes, budget.peak_bytes) == (3, 10, 10)
    assert a.pop() == b"12345" and b.clear() == 2
    assert (budget.messages, budget.nbytes) == (0, 0)
    assert a.offer([b"x" * 40])  # an empty budget takes anything, as an empty outbox does


async def test_a_put_waits_for_its_budget_and_gives_up_after_the_stall() -> None:
    import pytest

    from pipeline.chain.outbox import Budget
    from pipeline.errors import SlowConsumer

    budget = Budget(max_messages=100, max_bytes=8)
    held, waiting = Outbox(4, budget=budget), Outbox(4, budget=budget, stall_s=0.05)
    assert held.offer([b"12345678"])
    put = asyncio.create_task(waiting.put([b"ab"]))
    await asyncio.sleep(0)
    assert not put.done()
    assert held.pop_many(4) == [b"12345678"]  # room: the put goes in
    await put
    assert (budget.messages, budget.nbytes) == (1, 2)
    assert held.offer([b"123456"])
    with pytest.raises(SlowConsumer):
        await waiting.put([b"cd"])  # nothing drains the budget: too slow


async def test_a_put_whose_room_others_keep_taking_still_stops_at_its_stall() -> None:
    """Each time the budget falls to half, another outbox of it fills it again first: the
    wait's clock is not started again at each wake-up (it was, so the put waited for ever
    while the connection's other duplexes kept the budget busy)."""
    import pytest

    from pipeline.chain.outbox import Budget
    from pipeline.errors import SlowConsumer

    budget = Budget(max_messages=100, max_bytes=8)
    busy, waiting = Outbox(100, budget=budget), Outbox(4, budget=budget, stall_s=0.3)
    assert busy.offer([b"12345678"])
    put = asyncio.create_task(waiting.put([b"abcdefgh"]))
    loop = asyncio.get_running_loop()
    began = loop.time()
    while not put.done() and loop.time() - began < 2.0:
        await asyncio.sleep(0.1)  # under the stall: each wake-up alone would restart it
        busy.pop_many(100)  # room: the waiting put is woken ...
        assert busy.offer([b"12345678"])  # ... and finds it taken again
    with pytest.raises(SlowConsumer):
        await put
    assert loop.time() - began < 1.0
