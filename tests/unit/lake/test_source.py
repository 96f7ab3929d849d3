from __future__ import annotations

import pytest

from pipeline.blockcodec import Block, encode_block
from pipeline.errors import ArchiveError
from pipeline.lake.intake.arrowpage import ARROW_SCHEMA, entries_to_batch
from pipeline.lake.spark.source import Options


def test_entries_to_batch_decodes_blocks_and_keeps_bad_ones() -> None:
    block = Block(num=7, hash=b"\x01" * 32, parent=b"\x02" * 32, updates={"k": b"v"})
    entries = [
        (b"10-0", {b"block": encode_block(block)}),
        (b"10-1", {b"block": b"\xc1garbage"}),
        (b"11-0", {b"x": b"1", b"\xff": b"2"}),
    ]
    batch = entries_to_batch(entries, chain=True)
    assert batch.schema == ARROW_SCHEMA
    rows = batch.to_pylist()
    assert [r["entry_id"] for r in rows] == ["10-0", "10-1", "11-0"]
    assert [(r["entry_ms"], r["entry_seq"]) for r in rows] == [(10, 0), (10, 1), (11, 0)]
    assert [r["valid_block"] for r in rows] == [True, False, False]
    assert rows[0]["block_num"] == 7 and rows[0]["block_hash"] == "01" * 32
    assert rows[0]["block_parent"] == "02" * 32 and rows[0]["block_error"] is None
    assert "msgpack" in rows[1]["block_error"] and rows[1]["fields"] == [("block", b"\xc1garbage")]
    assert "no 'block' field" in rows[2]["block_error"]
    assert dict(rows[2]["fields"]) == {"x": b"1", "\\xff": b"2"}


def test_entries_to_batch_plain_stream() -> None:
    rows = entries_to_batch([(b"1-0", {b"a": b"b"})], chain=False, split=True).to_pylist()
    assert rows[0]["valid_block"] is None and rows[0]["block_num"] is None
    assert rows[0]["payload"] is None and rows[0]["fields"] == [("a", b"b")]


def test_entries_to_batch_payload_split() -> None:
    heavy = Block(num=3, hash=b"\x01" * 32, parent=b"\x02" * 32, weight=2**70)
    light = Block(num=4, hash=b"\x03" * 32, parent=b"\x01" * 32)
    entries = [
        (b"10-0", {b"block": encode_block(heavy)}),
        (b"10-1", {b"block": encode_block(light), b"note": b"x"}),
        (b"11-0", {b"block": b"\xc1garbage"}),
    ]
    whole = entries_to_batch(entries, chain=True).to_pylist()
    split = entries_to_batch(entries, chain=True, split=True).to_pylist()
    assert [r["payload"] for r in split] == [encode_block(heavy), encode_block(light), None]
    assert split[0]["weight"] == (2**70).to_bytes(32, "big") and split[1]["weight"] is None
    # Only an entry whose one field is its valid block loses the field; the rest stay whole.
    assert [r["fields"] for r in split] == [[], whole[1]["fields"], whole[2]["fields"]]
    assert whole[0]["fields"] == [("block", encode_block(heavy))]
    assert [(r["valid_block"], r["block_num"]) for r in split] == [
        (True, 3),
        (True, 4),
        (False, None),
    ]


def test_options() -> None:
    opts = Options.parse(
        {"url": "redis://x", "key": "k", "start": "5", "end": "10", "chain": "true"}
    )
    assert (opts.start, opts.end_incl, opts.chain, opts.partitions) == (
        (5, 0),
        (9, 2**64 - 1),
        True,
        4,
    )
    assert Options.parse({"url": "u", "key": "k", "end": "0-0"}).end_incl is None
    with pytest.raises(ArchiveError, match="'end' is required"):
        Options.parse({"url": "u", "key": "k"})
    with pytest.raises(ArchiveError, match="bad option"):
        Options.parse({"url": "u", "key": "k", "end": "x"})
    with pytest.raises(ArchiveError, match="partitions"):
        Options.parse({"url": "u", "key": "k", "end": "9", "partitions": "0"})
    with pytest.raises(ArchiveError, match="pageSize"):
        Options.parse({"url": "u", "key": "k", "end": "9", "pageSize": "0"})
