"""Pure parts of resumption and subscriptions: Sender, TailIndex, Outbox, params."""

from __future__ import annotations

import asyncio

import pytest

from pipeline.chain.forkchoice import Sender
from pipeline.chain.outbox import Outbox
from pipeline.chain.planning import Emit
from pipeline.chain.serve.subscription import Subscription, parse_subscribe
from pipeline.chain.tailindex import TailIndex
from pipeline.errors import BadParams, BranchUnlinked, SlowConsumer

H = "0x" + "ab" * 32


def test_sender_dedups_and_marks_reorgs() -> None:
    s = Sender(start=10)
    assert s.accept(5, "x") is None  # below the start before anything was sent
    assert [s.accept(n, f"h{n}") for n in range(10, 15)] == [0] * 5
    assert s.accept(12, "h12") is None  # duplicate
    assert s.accept(13, "other") == 2  # replaces 13 and 14
    assert s.head == 13
    assert s.accept(14, "h14") == 0  # 14 was forgotten by the reorg: new again
    assert s.accept(3, "deep") == 12  # below the start once sending: a reorg


def test_tail_index_follows_the_heaviest_chain() -> None:
    t = TailIndex()
    for n in range(5):
        t.add(n, f"a{n}", f"a{n - 1}", f"{n + 1}-0".encode())
    t.add(3, "b3", "a2", b"6-0")  # no weight: 4, lighter than a4 (5)
    t.add(4, "b4", "b3", b"7-0")  # 5: a tie, the first seen (a4) stays
    assert t.lo == 0 and t.hi == 4 and t.head_weight == 5
    assert [t.chain[n][0] for n in range(5)] == ["a0", "a1", "a2", "a3", "a4"]
    t.add(5, "b5", "b4", b"8-0")  # 6: heavier, on the b branch
    assert [t.chain[n][0] for n in range(6)] == ["a0", "a1", "a2", "b3", "b4", "b5"]
    assert [t.chain[n][2] for n in (3, 4, 5)] == [b"6-0", b"7-0", b"8-0"]
    t.add(3, "c3", "a2", b"9-0", weight=100)  # shorter, heavier
    assert t.hi == 3 and sorted(t.chain) == [0, 1, 2, 3] and t.chain[3][0] == "c3"
    assert t.seen["a4"] == (4, "a3", b"5-0", 5) and t.last_id == b"9-0"
    t.add(4, "a4", "a3", b"10-0", weight=999)  # published again: the first entry stands
    assert t.chain[3][0] == "c3" and t.last_id == b"10-0"


def _e(num: int, hash: str, parent: str, weight: int) -> Emit:
    return Emit(num, hash, parent, [hash], 0, weight)


def test_sender_takes_the_heaviest_branch_with_its_held_blocks() -> None:
    s = Sender(start=0)
    for n in range(6):
        assert s.take(_e(n, f"a{n}", f"a{n - 1}", 10 * (n + 1))) == [
            _e(n, f"a{n}", f"a{n - 1}", 10 * (n + 1))
        ]
    assert s.take(_e(3, "a3", "a2", 40)) == []  # duplicate
    assert s.take(_e(3, "b3", "a2", 35)) == []  # lighter: held
    assert s.take(_e(4, "b4", "b3", 60)) == []  # a tie with a5: the first seen stays
    assert s.head == 5 and s.knows(4, "b4") and not s.knows(4, "zz")
    out = s.take(_e(5, "b5", "b4", 61))  # heavier: the whole branch, a reorg above a2
    assert [(e.hash, e.reorg) for e in out] == [("b3", 3), ("b4", 0), ("b5", 0)]
    assert s.head == 5 and s.hash_at(3) == "b3" and s.head_weight == 61
    out = s.take(_e(4, "c4", "a3", 1000))  # back to a3 (sent earlier), shorter and heavier
    assert [(e.hash, e.reorg) for e in out] == [("a3", 3), ("c4", 0)]
    assert s.head == 4 and s.hash_at(5) is None
    with pytest.raises(BranchUnlinked):  # a gap above: the caller plans again from the head
        s.take(_e(9, "x9", "x8", 5))
    assert s.head == 4  # nothing sent
    # offered again (nothing links it anywhere): taken as is
    assert s.take(_e(9, "x9", "x8", 5)) == [_e(9, "x9", "x8", 5)]


def test_sender_raises_for_a_branch_deeper_than_it_holds() -> None:
    """A shorter, heavier branch forking below the window of sent hashes: its first blocks
    are dropped (not linked), and its heavier tip raises instead of a reorg from its own
    height; within the window, the held branch goes out whole above the ancestor."""
    s = Sender(start=0, window=256)
    for n in range(400):
        s.take(_e(n, f"a{n}", f"a{n - 1}", n + 1))
    assert s.take(_e(101, "b101", "a100", 101)) == []
    assert s.take(_e(102, "b102", "b101", 102)) == []
    with pytest.raises(BranchUnlinked) as caught:
        s.take(_e(103, "b103", "b102", 1000))
    assert caught.value.num == 103 and s.head == 399
    assert s.take(_e(301, "c301", "a300", 301)) == []  # held
    out = s.take(_e(302, "c302", "c301", 2000))
    assert [(e.hash, e.reorg) for e in out] == [("c301", 99), ("c302", 0)]


def test_a_canonical_block_that_replaces_sent_ones_must_link_below() -> None:
    """A canonical source (the lake, the tail) replacing sent blocks with a block whose
    parent is not the block sent below it forks deeper than that block: raised once so
    resumption plans again and finds the fork point, never sent as a reorg from its own
    height on the old branch (history checker seed 1591: a replay's fill from the lake,
    which reads a few heights below the head, sent a deep reorg's 116 on the old 115)."""
    s = Sender(start=0)
    for n in range(125):
        s.take(_e(n, f"a{n}", f"a{n - 1}", n + 1))
    deep = [_e(n, f"b{n}", f"b{n - 1}" if n > 14 else "a13", n + 2) for n in range(14, 126)]
    with pytest.raises(BranchUnlinked) as caught:
        s.accepted(deep[116 - 14 :])  # from 116: the fork (at 14) is below what it reads
    assert (caught.value.num, s.head, s.hash_at(115)) == (116, 124, "a115")
    # planned again from the fork point: the branch goes out whole, one reorg above a13
    out = s.accepted(deep)
    assert (out[0].num, out[0].hash, out[0].reorg, len(out)) == (14, "b14", 111, 112)
    assert s.head == 125 and s.hash_at(115) == "b115"
    # a replacement that links below is sent as before, its depth from its own height
    r = Sender(start=0)
    for n in range(10):
        r.take(_e(n, f"a{n}", f"a{n - 1}", n + 1))
    assert [(e.hash, e.reorg) for e in r.accepted([_e(8, "c8", "a7", 20)])] == [("c8", 2)]
    # and the same unlinked block offered again (nothing links it anywhere) is taken as is
    q = Sender(start=0)
    for n in range(10):
        q.take(_e(n, f"a{n}", f"a{n - 1}", n + 1))
    with pytest.raises(BranchUnlinked):
        q.accepted([_e(8, "d8", "d7", 20)])
    assert [(e.hash, e.reorg) for e in q.accepted([_e(8, "d8", "d7", 20)])] == [("d8", 2)]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({}, "params must be"),
        (["streams"], "params must be"),
        (["blocks", "0x1", H, []], "unknown subscription kind"),
        (["streams", "12", H, []], "block number"),
        (["streams", "0xZZ", H, []], "block number"),
        (["streams", "0x1", "0x1234", []], "block hash"),
        (["streams", "0x1", H, ["(("]], "does not compile"),
        (["streams", "0x1", H, [], {"nope": True}], "unknown options"),
        (["streams", "0x1", H, [], {"ready": 1}], "true or false"),
        (["streams", "0x1", H, [], []], "must be an object"),
    ],
)
def test_bad_subscribe_params(params, message) -> None:
    with pytest.raises(BadParams, match=message):
        parse_subscribe(params)


def test_good_subscribe_params() -> None:
    p = parse_subscribe(["streams", "0x10", H, ["s/"], {"ready": True}])
    assert p.num == 16 and p.hash == bytes.fromhex("ab" * 32) and p.ready and not p.reorgs
    assert p.keep is not None and p.keep("s/x")


async def test_outbox_bounds_and_waits() -> None:
    box = Outbox(4)
    assert box.offer([b"a", b"b", b"c"])
    assert not box.offer([b"d", b"e"])  # nothing queued when it does not fit
    assert len(box) == 3
    put = asyncio.create_task(box.put([b"d", b"e"]))
    await asyncio.sleep(0)
    assert not put.done()
    assert [box.pop(), box.pop()] == [b"a", b"b"]
    await asyncio.wait_for(put, 1)
    assert [box.pop() for _ in range(4)] == [b"c", b"d", b"e", None]


async def test_subscription_live_overflow_raises_slow_consumer() -> None:
    box = Outbox(2)
    sub = Subscription("0x1", parse_subscribe(["streams", "0x0", H, []]), box)
    sub.put_nowait([Emit(1, "aa", "bb", ['{"type":"batch"}'])])
    with pytest.raises(SlowConsumer, match="send buffer of 2"):
        sub.put_nowait([Emit(2, "aa", "bb", ["{}", "{}"])])
