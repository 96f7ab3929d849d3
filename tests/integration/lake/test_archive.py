"""archive_interval against a real redis-server and a real local Spark with Delta."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from pipeline import keys
from pipeline.blockcodec import Block, encode_block
from pipeline.errors import ArchiveError, RedisUnavailable
from pipeline.lake.archive import archive_interval
from pipeline.lake.storage import tables
from pipeline.lake.storage.entries import Entry, read_entries
from pipeline.lake.storage.reader import LakeReader
from pipeline.settings import LakeSettings
from tests.integration.lake.helpers import block_rows, chain, publish, settings_for

pytestmark = pytest.mark.spark


def _snapshot(lake_uri: str, name: str, sort: list[str]) -> list[dict[str, Any]]:
    table = DeltaTable(LakeSettings.from_url(lake_uri).table(name)).to_pyarrow_table()
    rows = table.sort_by([(c, "ascending") for c in sort]).to_pylist()
    for row in rows:
        if isinstance(row.get("fields"), list):
            row["fields"] = sorted(row["fields"])
    return rows


def test_archive_is_idempotent_and_keeps_bad_entries(
    spark: Any, redis_client: Any, redis_url: str, lake_uri: str
) -> None:
    settings = settings_for(redis_url, lake_uri)
    blocks = chain(0, 6)
    publish(redis_client, "c", blocks, first_ms=1000)  # ids 1000..1005
    redis_client.xadd(keys.stream("c"), {b"block": b"\xc1 not msgpack"}, id="1006-0")
    redis_client.xadd(keys.stream("c"), {b"other": b"x"}, id="1007-0")
    publish(redis_client, "c", chain(6, 8), first_ms=1008)  # 1008, 1009 (outside [1000, 1009))
    redis_client.xadd(keys.stream("plain"), {b"a": b"1", b"b": b"2"}, id="1001-0")

    first = archive_interval(spark, settings, "c", 1000, 1009, run_id="r1")
    assert (first.entries, first.blocks, first.invalid) == (9, 7, 2)
    assert first.invalid_ids == ("1006-0", "1007-0")
    assert (first.first_id, first.last_id) == ("1000-0", "1008-0")

    entries = _snapshot(lake_uri, tables.STREAM_ENTRIES, ["entry_ms"])
    block_rows = _snapshot(lake_uri, tables.BLOCKS, ["num"])
    log_rows = _snapshot(lake_uri, tables.ARCHIVE_LOG, ["start_ms"])
    assert [e["entry_id"] for e in entries] == [f"{1000 + i}-0" for i in range(9)]
    bad = [e for e in entries if e["valid_block"] is False]
    assert [dict(e["fields"]) for e in bad] == [{"block": b"\xc1 not msgpack"}, {"other": b"x"}]
    assert all(e["block_error"] for e in bad)
    assert [b["num"] for b in block_rows] == [0, 1, 2, 3, 4, 5, 6]
    assert [b["hash"] for b in block_rows] == [b.hash.hex() for b in chain(0, 7)]
    assert not any(b["canonical"] for b in block_rows)
    assert len(log_rows) == 1 and log_rows[0]["entries"] == 9 and log_rows[0]["run_id"] == "r1"

    # A rerun (skipped: the log proves it) and a forced rerun (re-read and merged)
    # both leave every table exactly as after the first run.
    for force in (False, True):
        again = archive_interval(spark, settings, "c", 1000, 1009, run_id="r2", force=force)
        assert (again.entries, again.blocks, again.invalid) == (9, 7, 2)
        assert again.invalid_ids == first.invalid_ids
        assert _snapshot(lake_uri, tables.STREAM_ENTRIES, ["entry_ms"]) == entries
        assert _snapshot(lake_uri, tables.BLOCKS, ["num"]) == block_rows
        assert _snapshot(lake_uri, tables.ARCHIVE_LOG, ["start_ms"]) == log_rows

    # An overlapping interval (MERGE path) adds only the new entry and block,
    # and an empty interval of an existing stream is a valid empty archive.
    overlap = archive_interval(spark, settings, "c", 1005, 1010)
    assert (overlap.entries, overlap.blocks) == (5, 3)
    assert [b["num"] for b in _snapshot(lake_uri, tables.BLOCKS, ["num"])] == list(range(8))
    empty = archive_interval(spark, settings, "c", 5000, 6000)
    assert (empty.entries, empty.first_id) == (0, None)

    plain = archive_interval(spark, settings, "plain", 1000, 2000)
    assert (plain.entries, plain.blocks, plain.invalid) == (1, 0, 0)
    logged = pa.table(
        DeltaTable(LakeSettings.from_url(lake_uri).table(tables.ARCHIVE_LOG)).to_pyarrow_table()
    )
    assert logged.num_rows == 4


def test_archive_bad_inputs(
    spark: Any, redis_client: Any, redis_url: str, lake_uri: str, redis_factory: Any
) -> None:
    settings = settings_for(redis_url, lake_uri)
    with pytest.raises(ArchiveError, match="does not exist"):
        archive_interval(spark, settings, "c", 0, 1000)
    redis_client.set(keys.stream("c"), b"x")
    with pytest.raises(ArchiveError, match="not a stream"):
        archive_interval(spark, settings, "c", 0, 1000)
    with pytest.raises(ArchiveError, match="bad interval"):
        archive_interval(spark, settings, "c", 10, 10)
    redis_client.delete(keys.stream("c"))
    redis_client.xadd(keys.stream("c"), {b"block": b"x"}, id="5-0")
    with pytest.raises(ArchiveError, match="not closed"):
        archive_interval(spark, settings, "c", 0, 10**15)
    dead = redis_factory()
    url = dead.url
    dead.stop()
    with pytest.raises(RedisUnavailable, match="unavailable"):
        archive_interval(spark, settings.replace(redis_url=url), "c", 0, 1000)
    # Nothing was written by any of the refused runs.
    assert not DeltaTable.is_deltatable(LakeSettings.from_url(lake_uri).table(tables.ARCHIVE_LOG))


def _redis_entries(client: Any, stream: str, start_ms: int, end_ms: int) -> list[Entry]:
    out = []
    for raw_id, fields in client.xrange(keys.stream(stream), f"{start_ms}-0", f"({end_ms}-0"):
        entry_id = raw_id.decode()
        ms, seq = (int(x) for x in entry_id.split("-"))
        out.append(Entry(entry_id, ms, seq, {k.decode(): v for k, v in fields.items()}))
    return out


def test_each_payload_is_stored_once_and_entries_read_back_exactly(
    spark: Any, redis_client: Any, redis_url: str, lake_uri: str
) -> None:
    settings = settings_for(redis_url, lake_uri)
    key = keys.stream("c")
    blocks = chain(0, 6)
    publish(redis_client, "c", blocks, first_ms=1000)  # 1000..1005
    redis_client.xadd(key, {b"block": encode_block(blocks[2])}, id="1006-0")  # same bytes again
    # Block 3's hash again with other bytes (a weight): that entry must keep its own bytes.
    other3 = Block(num=3, hash=blocks[3].hash, parent=blocks[3].parent, weight=99)
    redis_client.xadd(key, {b"block": encode_block(other3)}, id="1007-0")
    six = chain(6, 7)[0]
    redis_client.xadd(key, {b"block": encode_block(six), b"note": b"n"}, id="1008-0")
    redis_client.xadd(key, {b"block": b"\xc1 bad"}, id="1009-0")

    result = archive_interval(spark, settings, "c", 1000, 1010)
    assert (result.entries, result.blocks, result.invalid) == (10, 9, 1)
    lake = LakeSettings.from_url(lake_uri)
    rows = {r["entry_id"]: r for r in _snapshot(lake_uri, tables.STREAM_ENTRIES, ["entry_ms"])}
    flags = {i: (r[tables.PAYLOAD_COLUMN], r["fields"]) for i, r in rows.items()}
    for i in range(6):  # stored once: in blocks
        assert flags[f"{1000 + i}-0"] == (True, [])
    for entry_id in ("1006-0", "1007-0", "1008-0", "1009-0"):  # dup, other bytes, 2 fields, bad
        assert flags[entry_id][0] is False and flags[entry_id][1], entry_id
    block_rows = DeltaTable(lake.table(tables.BLOCKS)).to_pyarrow_table().to_pylist()
    payloads = {(b["num"], b["entry_id"]): b["payload"] for b in block_rows}
    assert payloads == {
        **{(b.num, f"{1000 + b.num}-0"): encode_block(b) for b in blocks},
        (6, "1008-0"): encode_block(six),
    }
    assert {b["num"]: b["weight"] for b in block_rows}[3] is None  # the first entry's block

    expected = _redis_entries(redis_client, "c", 1000, 1010)
    assert list(read_entries(lake_uri, "c", 1000, 1010)) == expected

    # A forced rerun and an overlapping interval keep the layout and the exact entries.
    redis_client.xadd(key, {b"block": encode_block(chain(7, 8)[0])}, id="1010-0")
    snapshot = _snapshot(lake_uri, tables.STREAM_ENTRIES, ["entry_ms"])
    archive_interval(spark, settings, "c", 1000, 1010, force=True)
    assert _snapshot(lake_uri, tables.STREAM_ENTRIES, ["entry_ms"]) == snapshot
    archive_interval(spark, settings, "c", 1005, 1011)
    last = _snapshot(lake_uri, tables.STREAM_ENTRIES, ["entry_ms"])[-1]
    assert (last["entry_id"], last[tables.PAYLOAD_COLUMN]) == ("1010-0", True)
    assert list(read_entries(lake_uri, "c")) == _redis_entries(redis_client, "c", 0, 2000)


def test_a_lake_of_the_old_layout_is_read_and_extended(
    spark: Any, redis_client: Any, redis_url: str, lake_uri: str
) -> None:
    """Tables written before payload_in_blocks (and blocks.weight) existed: whole fields."""
    from deltalake import write_deltalake

    lake = LakeSettings.from_url(lake_uri)
    old_entries = pa.schema(list(tables.STREAM_ENTRIES_ARROW)[:-1])
    old = chain(0, 3)
    publish(redis_client, "c", old, first_ms=1000)
    now = datetime.now(UTC)
    write_deltalake(
        lake.table(tables.STREAM_ENTRIES),
        pa.Table.from_pylist(
            [
                {"stream": "c", "entry_id": f"{1000 + b.num}-0", "entry_ms": 1000 + b.num,
                 "entry_seq": 0, "fields": [("block", encode_block(b))], "valid_block": True,
                 "block_num": b.num, "block_hash": b.hash.hex(), "block_parent": b.parent.hex(),
                 "block_error": None, "archived_at": now}
                for b in old
            ],
            schema=old_entries,
        ),
        partition_by=["stream"],
        configuration=dict(tables.TABLE_PROPERTIES),
    )  # fmt: skip
    write_deltalake(
        lake.table(tables.BLOCKS),
        pa.Table.from_pylist(block_rows("c", old), schema=tables.BLOCKS_ARROW),
        partition_by=["stream"],
        configuration=dict(tables.TABLE_PROPERTIES),
    )
    publish(redis_client, "c", chain(3, 6), first_ms=2000)

    result = archive_interval(spark, settings_for(redis_url, lake_uri), "c", 2000, 2003)
    assert (result.entries, result.blocks) == (3, 3)
    names = DeltaTable(lake.table(tables.STREAM_ENTRIES)).schema().to_arrow().names
    assert names[-1] == tables.PAYLOAD_COLUMN
    assert list(read_entries(lake_uri, "c")) == _redis_entries(redis_client, "c", 0, 3000)
    reader = LakeReader(lake_uri)
    assert [reader.find_hash("c", b.hash).payload for b in chain(0, 6)] == [  # type: ignore[union-attr]
        encode_block(b) for b in chain(0, 6)
    ]
