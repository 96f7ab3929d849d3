"""The pure parts of the status page: header peek, reorg detection, coverage."""

from __future__ import annotations

import msgpack
import pytest

from pipeline.blockcodec import ENTRY_FIELD, Block, encode_block
from pipeline.chain.serve.status import (
    MAX_RUNS,
    Archived,
    Interval,
    StreamBoard,
    coverage,
    peek_header,
    summarize,
)


def _block(num: int, tag: int, parent_tag: int) -> Block:
    return Block(
        num=num,
        hash=bytes([tag]) * 32,
        parent=bytes([parent_tag]) * 32,
        updates={"s/a": b"x" * 100},
        deletes=(),
        batches={},
        subbatches=(),
    )


def test_peek_header_reads_only_num_hash_parent() -> None:
    block = _block(7, 2, 1)
    assert peek_header(encode_block(block)) == (7, block.hash, block.parent)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x92\x01\x02",
        msgpack.packb({"num": 1}),
        msgpack.packb({"num": "1", "hash": b"", "parent": b""}),
        b"\xc1",
    ],
)
def test_peek_header_refuses_non_blocks(data: bytes) -> None:
    with pytest.raises(ValueError):
        peek_header(data)


def test_board_counts_reorgs_and_keeps_bounded_windows() -> None:
    board = StreamBoard("chain:t")
    chain = [(0, 10, 0), (1, 11, 10), (2, 12, 11), (3, 13, 12)]
    # a reorg of depth 2: 2 and 3 replaced by 2' (parent 1) and 3'
    chain += [(2, 22, 11), (3, 23, 22), (4, 24, 23)]
    # a block at head + 1 on another parent: depth 1
    chain += [(5, 35, 99)]
    for i, (num, tag, parent) in enumerate(chain):
        board.see(f"{1000 + i}-0".encode(), {ENTRY_FIELD: encode_block(_block(num, tag, parent))})
    assert board.head is not None and board.head.num == 5
    assert board.reorg_count == 2
    assert [(r.old_head, r.new_num, r.depth) for r in board.reorgs] == [(3, 2, 2), (4, 5, 1)]
    assert [b.reorg for b in board.recent] == [0, 0, 0, 0, 2, 0, 0, 1]
    board.see(b"2000-0", {b"other": b""})
    board.see(b"2001-0", {ENTRY_FIELD: b"junk"})
    assert board.invalid == 2 and board.last_id == b"2001-0"
    for i in range(100):
        board.see(f"{3000 + i}-0".encode(), {ENTRY_FIELD: encode_block(_block(6 + i, i % 250, 0))})
    assert len(board.recent) == 12 and len(board.reorgs) <= 8


def test_coverage_runs_gaps_and_trim() -> None:
    rows = [
        Interval(start_ms=100, end_ms=200, entries=5, blocks=5),
        Interval(start_ms=200, end_ms=300, entries=5, blocks=4),  # adjacent: one run
        Interval(start_ms=400, end_ms=500, entries=1, blocks=1),
    ]
    rows = summarize(rows)
    cov = coverage(rows, first_ms=150, last_ms=900, now_ms=10_000, hot_retention_s=0)
    assert cov["runs"] == [[100, 300], [400, 500]] and cov["gaps"] == [[300, 400]]
    assert (cov["run_count"], cov["gap_count"], cov["blocks"], cov["entries"]) == (2, 1, 10, 11)
    # the oldest entry (150) is in the first run: a trim may go to its end, not past the gap
    assert cov["trimmable_to_ms"] == 300 and cov["trim_point_ms"] == 150
    assert cov["unarchived_from_ms"] == 500
    # hot retention holds the trim back
    held = coverage(rows, first_ms=150, last_ms=900, now_ms=1_200, hot_retention_s=1)
    assert held["trimmable_to_ms"] == 200
    # oldest entry in the gap: nothing may be trimmed
    assert (
        coverage(rows, first_ms=350, last_ms=900, now_ms=10_000, hot_retention_s=0)[
            "trimmable_to_ms"
        ]
        is None
    )
    empty = coverage(Archived(), first_ms=None, last_ms=None, now_ms=1, hot_retention_s=0)
    assert (
        empty["runs"] == []
        and empty["archived_to_ms"] is None
        and empty["unarchived_from_ms"] is None
    )
    assert (
        coverage(Archived(), first_ms=5, last_ms=9, now_ms=10, hot_retention_s=0)[
            "unarchived_from_ms"
        ]
        == 5
    )


def test_coverage_is_bounded_and_finds_the_run_of_the_oldest_entry() -> None:
    # 200 runs of 10 ms with 5 ms holes
    rows = [Interval(start_ms=15 * i, end_ms=15 * i + 10, entries=1, blocks=1) for i in range(200)]
    archived = summarize(rows)
    cov = coverage(archived, first_ms=150, last_ms=4000, now_ms=10**9, hot_retention_s=0)
    assert cov["run_count"] == 200 and cov["gap_count"] == 199
    assert len(cov["runs"]) == MAX_RUNS and len(cov["gaps"]) == MAX_RUNS
    assert cov["gaps"][-1] == [15 * 198 + 10, 15 * 199]
    assert cov["trimmable_to_ms"] == 160  # run [150, 160) holds the oldest entry
    at_end = coverage(archived, first_ms=160, last_ms=4000, now_ms=10**9, hot_retention_s=0)
    assert at_end["trimmable_to_ms"] is None  # 160 is in the hole [160, 165)
