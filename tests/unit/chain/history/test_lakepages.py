"""Lake pages into Emits: a block body the archive let through but cannot be encoded is skipped."""

from __future__ import annotations

import logging

import msgpack
import pyarrow as pa
import pytest

from pipeline.blockcodec import Block, encode_block
from pipeline.chain.history.lakepages import next_page


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
