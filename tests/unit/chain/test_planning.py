"""pipeline.chain.planning, pure: indexing entries, plans and their reasons, the Sender's window."""

from __future__ import annotations

import msgpack
import pytest

from pipeline.blockcodec import ENTRY_FIELD, MAX_BLOCK_NUM, Block, encode_block
from pipeline.chain.forkchoice import Sender
from pipeline.chain.planning import Emit, Plan, Reason, rewind_start
from pipeline.chain.tailindex import TailIndex, decode_servable, index_entry, indexable
from pipeline.errors import BadBatch


def _h(n: int, branch: int = 0) -> bytes:
    return bytes([branch]) + (n % 2**248).to_bytes(31, "big")  # -1: the parent of block 0


def _entry(n: int, *, branch: int = 0, parent_branch: int | None = None) -> dict[bytes, bytes]:
    parent = _h(n - 1, branch if parent_branch is None else parent_branch)
    return {ENTRY_FIELD: encode_block(Block(num=n, hash=_h(n, branch), parent=parent))}


def _fields(body: dict[str, object]) -> dict[bytes, bytes]:
    return {ENTRY_FIELD: msgpack.packb(body, use_bin_type=True)}


def test_index_entry_builds_the_chain_and_shares_parent_strings() -> None:
    tail = TailIndex()
    for n in range(4):
        assert index_entry(tail, f"{n + 1}-0".encode(), _entry(n)) == (n, _h(n).hex())
    assert tail.lo == 0 and tail.hi == 3 and tail.last_id == b"4-0"
    # the parent string of block 3 is the very hash string of block 2 (memory per entry)
    assert tail.chain[3][1] is tail.chain[2][0]


@pytest.mark.parametrize(
    "fields",
    [
        {},  # no entry field
        {ENTRY_FIELD: b"\xc1"},  # not msgpack
        _fields({"num": MAX_BLOCK_NUM + 1, "hash": _h(1), "parent": _h(0)}),
        _fields({"num": -1, "hash": _h(1), "parent": _h(0)}),
        _fields({"num": True, "hash": _h(1), "parent": _h(0)}),
        _fields({"num": 1, "hash": b"short", "parent": _h(0)}),
        _fields({"num": 1, "hash": _h(1), "parent": "not bytes"}),
    ],
)
def test_an_invalid_entry_only_moves_last_id(fields: dict[bytes, bytes]) -> None:
    tail = TailIndex()
    index_entry(tail, b"1-0", _entry(0))
    assert index_entry(tail, b"2-0", fields) is None
    assert tail.last_id == b"2-0" and tail.hi == 0 and len(tail.seen) == 1


def test_indexable_bounds() -> None:
    assert indexable(MAX_BLOCK_NUM, _h(1), _h(0))
    assert not indexable(MAX_BLOCK_NUM + 1, _h(1), _h(0))
    assert not indexable(1.0, _h(1), _h(0))
    assert not indexable(1, _h(1)[:31], _h(0))


def test_decode_servable_refuses_numbers_the_lake_cannot_hold() -> None:
    assert decode_servable(encode_block(Block(num=7, hash=_h(7), parent=_h(6)))).num == 7
    body = {"num": MAX_BLOCK_NUM + 1, "hash": _h(1), "parent": _h(0), "updates": {}}
    with pytest.raises(BadBatch):
        decode_servable(msgpack.packb(body, use_bin_type=True))


def test_rewind_start_clamps_at_zero() -> None:
    assert rewind_start(100, 64) == 36
    assert rewind_start(10, 64) == 0
    assert rewind_start(0, 0) == 0


def test_plan_reasons_are_an_enum_with_the_logged_names() -> None:
    assert {r.value for r in Reason} == {"match", "hash", "fork", "rewind"}
    plan = Plan(start=3, tail=TailIndex(), history=None, reason=Reason.FORK)
    assert plan.reason is Reason.FORK and plan.prefetched is None


def test_sender_forgets_hashes_below_its_window() -> None:
    s = Sender(start=0, window=4)
    for n in range(6):
        assert s.accept(n, f"h{n}") == 0
    assert s.hash_at(1) is None and s.hash_at(2) == "h2" and s.hash_at(5) == "h5"
    # a repeat inside the window is dropped; one below it is a (deep) reorg again
    assert s.accept(3, "h3") is None
    assert s.accept(1, "h1") == 5


def test_sender_links_the_first_block_to_its_parent() -> None:
    s = Sender(start=10)
    first = Emit(10, "a10", "a9", ["x"], 0, 11)
    assert s.take(first) == [first]
    child = Emit(11, "b11", "a10", ["y"], 0, 12)
    assert s.knows(9, "a9") and s.take(child) == [child]


def _run(lo: int, hi: int, tag: str = "a") -> list[Emit]:
    return [Emit(n, f"{tag}{n}", f"{tag}{n - 1}", [f"r{n}"], 0, n + 1) for n in range(lo, hi)]


@pytest.mark.parametrize(
    ("start", "pages", "window"), [(0, [5], 4), (3, [40, 300, 1], 64), (7, [600], 4096)]
)
def test_sender_extend_notes_a_run_as_accept_does_each(
    start: int, pages: list[int], window: int
) -> None:
    one, bulk = Sender(start, window), Sender(start, window)
    pos = start
    for size in pages:
        run = _run(pos, pos + size)
        for emit in run:
            assert one.accept(emit.num, emit.hash, emit.weight, emit) == 0
        bulk.extend(run)
        pos += size
    assert (bulk.head, bulk.head_weight, bulk.sent) == (one.head, one.head_weight, one.sent)
    assert bulk._hashes == one._hashes
    recent = range(max(start, pos - Sender.RETAIN), pos)
    assert all(bulk.knows(n, f"a{n}") and one.knows(n, f"a{n}") for n in recent)
    assert len(bulk._blocks) <= 2 * Sender.RETAIN
    # what follows is decided alike: a repeat, a heavier branch from below the head
    fork = Emit(pos - 2, "b", f"a{pos - 3}", ["f"], 0, pos + 5)
    assert bulk.take(Emit(pos - 1, f"a{pos - 1}", f"a{pos - 2}", [], 0, pos)) == []
    assert bulk.take(fork) == one.take(fork)


def test_sender_extend_refuses_what_is_not_a_run_above_the_head() -> None:
    s = Sender(0)
    s.extend(_run(0, 3))
    with pytest.raises(ValueError, match="consecutive"):
        s.extend(_run(2, 5))  # not above the head
    with pytest.raises(ValueError, match="consecutive"):
        s.extend([*_run(3, 5), *_run(6, 7)])  # a gap


def _emit(num: int, tag: str, parent: str) -> Emit:
    return Emit(num, f"{tag}{num:062x}", parent, [], 0, 10 * num + (5 if tag == "b" else 0))


def test_a_lost_blocks_descendants_are_lost_however_heavy() -> None:
    """Resumption loses a block the lake says lost (its parent trimmed from Redis); its
    children, heavier than the head while that branch led, are never sent, and the
    winning branch is followed as usual. Sent, the lost branch had a gap (CI's
    test_no_gap_no_duplicate_while_producing_archiving_and_trimming)."""
    sender = Sender(0)
    chain = [_emit(0, "c", "p" * 64)]
    for n in range(1, 6):
        chain.append(_emit(n, "c", chain[-1].hash))
    for e in chain:
        assert sender.take(e) == [e]
    lost = _emit(6, "a", chain[-1].hash)
    sender.lose(lost.hash)
    assert sender.knows(6, lost.hash)  # resumption reads no history for its child
    below = lost
    for n in (7, 8):
        child = _emit(n, "a", below.hash)
        assert child.weight > sender.head_weight
        assert sender.take(child) == []
        assert sender.knows(n, child.hash)
        below = child
    won = _emit(6, "b", chain[-1].hash)
    assert sender.take(won) == [won]
    assert sender.head == 6 and sender.hash_at(6) == won.hash


def test_lost_blocks_are_bounded() -> None:
    sender = Sender(0)
    parent = "p" * 64
    for n in range(2000):
        e = _emit(n, "c", parent)
        sender.take(e)
        sender.lose(f"x{n:063x}")
        parent = e.hash
    assert len(sender._lost) <= 2 * Sender.RETAIN
