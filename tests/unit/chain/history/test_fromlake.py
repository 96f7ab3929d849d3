"""The lake catch-up's ordering rule (pure: a Sender and Emit lists) and its slices of pages."""

from __future__ import annotations

import pyarrow as pa
import pytest

from pipeline.chain.forkchoice import Sender
from pipeline.chain.history.fromlake import _in_order, _PagesAhead
from pipeline.chain.planning import Emit
from pipeline.errors import ResumptionError


def emits(lo: int, hi: int, tag: str) -> list[Emit]:
    return [Emit(n, f"{tag}{n}", f"{tag}{n - 1}", [f"r{n}"], 0, n + 1) for n in range(lo, hi + 1)]


def sent(lo: int, hi: int) -> Sender:
    sender = Sender(lo)
    sender.extend(emits(lo, hi, "a"))
    return sender


def test_a_catch_up_below_what_was_sent_carries_the_reorg_depth() -> None:
    """Planned again at 15 with 10..20 sent (seed 1156): 15'..22' go out, 15' as a reorg of 6
    (before, none was marked, and a cardinal subscriber held the new branch for ever)."""
    sender = sent(10, 20)
    branch = emits(15, 22, "b")
    branch[0] = Emit(15, "b15", "a14", ["r15"], 0, 16)  # the fork: on the block sent at 14
    out = _in_order(branch, 15, sender)
    assert [(e.num, e.reorg) for e in out] == [(n, 6 if n == 15 else 0) for n in range(15, 23)]
    assert sender.head == 22 and sender.hash_at(15) == "b15"


def test_blocks_sent_already_are_not_sent_again() -> None:
    sender = sent(10, 20)
    assert _in_order(emits(18, 20, "a"), 18, sender) == []
    out = _in_order(emits(18, 23, "a"), 18, sender)
    assert [(e.num, e.reorg) for e in out] == [(21, 0), (22, 0), (23, 0)]


def test_a_slice_past_a_hole_is_a_history_gap() -> None:
    sender = sent(10, 20)
    with pytest.raises(ResumptionError, match="history gap"):
        _in_order(emits(23, 25, "a"), 21, sender)


def test_a_first_slice_is_taken_whole() -> None:
    sender = Sender(5)
    out = _in_order(emits(5, 9, "a"), 5, sender)
    assert [e.num for e in out] == [5, 6, 7, 8, 9] and sender.head == 9


async def test_big_blocks_are_handed_out_a_few_at_a_time() -> None:
    """A page of 200 KiB blocks goes to the encoder 2 at a time (ENCODE_BYTES, 512 KiB), not
    512 (ENCODE_ROWS): the encoded slice is held while the subscriber has no room for it."""
    page = pa.table(
        {
            "num": list(range(10)),
            "hash": ["h"] * 10,
            "parent": ["p"] * 10,
            "payload": [bytes(200 << 10)] * 10,
        }
    )
    small = page.slice(0, 3).set_column(3, "payload", pa.array([b"x"] * 3))
    ahead = _PagesAhead(iter([page, small]))
    ahead.start()
    taken = []
    while (rows := await ahead.next_rows()) is not None:
        taken.append(rows.num_rows)
    ahead.close()
    assert taken == [2, 2, 2, 2, 2, 3]
