"""archive_interval against a real redis-server and a real local Spark with Delta."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from pipeline import keys
from pipeline.errors import ArchiveError, RedisUnavailable
from pipeline.lake import tables
from pipeline.lake.archive import archive_interval
from pipeline.settings import LakeSettings
from tests.integration.lake.helpers import chain, publish, settings_for

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
