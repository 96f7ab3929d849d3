"""Lake pages into Emits: a block body the archive let through but cannot be encoded is skipped."""

from __future__ import annotations

import logging

import msgpack
import pyarrow as pa
import pytest

from pipeline.blockcodec import Block, encode_block
from pipeline.chain.history.lakepages import byte_pages, next_page, rows_within


def _block(num: int) -> tuple[int, str, str, bytes]:
    block = Block(
        num=num, hash=bytes([num]) * 32, parent=bytes([num - 1 & 255]) * 32, updates={"k": b"v"}
    )
    return num, block.hash.hex(), block.parent.hex(), encode_block(block)


def test_an_undecodable_body_is_skipped_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    rows = [_block(1), _block(2), _block(3)]
    bad_body = msgpack.packb({"updates": {"k": 7}})  # a header-valid block, a value not bytes
    rows[1] = (2, rows[1][1], rows[1][2], bad_body)
    page = pa.table(
        {
            "num": [r[0] for r in rows],
            "hash": [r[1] for r in rows],
            "parent": [r[2] for r in rows],
            "payload": [r[3] for r in rows],
        }
    )
    with caplog.at_level(logging.WARNING, logger="pipeline.chain.history.lakepages"):
        emits = next_page(iter([page]), None)
    assert emits is not None and [e.num for e in emits] == [1, 3]
    assert "skipping lake block 2" in caplog.text
    assert next_page(iter([]), None) is None


def _page(sizes: list[int]) -> pa.Table:
    return pa.table(
        {
            "num": list(range(len(sizes))),
            "hash": ["h"] * len(sizes),
            "parent": ["p"] * len(sizes),
            "payload": [b"x" * n for n in sizes],
        }
    )


def test_rows_within_takes_rows_up_to_the_row_or_the_byte_bound_and_one_at_least() -> None:
    assert rows_within(_page([10] * 600), 512, 1 << 20) == 512  # small rows: the row bound
    assert rows_within(_page([200 << 10] * 10), 512, 512 << 10) == 2  # 400 KiB, not 600
    assert rows_within(_page([100, 200, 300]), 512, 300) == 2  # exactly at the bound
    assert rows_within(_page([2 << 20, 10]), 512, 512 << 10) == 1  # one row over it alone
    assert rows_within(_page([5]), 512, 1) == 1
    assert rows_within(_page([]), 512, 1) == 0


def test_byte_pages_cut_every_page_whole_and_in_order() -> None:
    sizes = [300 << 10, 10, 10, 600 << 10, 5, 200 << 10, 200 << 10, 200 << 10]
    pages = [_page(sizes[:3]), _page(sizes[3:])]
    cut = list(byte_pages(iter(pages), 4, 512 << 10))
    assert [t.num_rows for t in cut] == [3, 1, 3, 1]
    assert [len(p) for t in cut for p in t.column("payload").to_pylist()] == sizes
    for table in cut:
        payloads = sum(map(len, table.column("payload").to_pylist()))
        assert table.num_rows == 1 or payloads <= 512 << 10
