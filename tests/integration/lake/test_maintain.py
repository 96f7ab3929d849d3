"""Maintenance only ever shrinks or keeps each table's files and bytes, and a rerun rewrites nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from pipeline.lake.archive import archive_interval
from pipeline.lake.maintain import live_files, maintain
from pipeline.lake.storage import tables
from tests.integration.lake.helpers import chain, publish, settings_for

pytestmark = [pytest.mark.spark]


def _live_paths(root: str, name: str) -> set[str]:
    return set(DeltaTable(f"{root}/{name}").file_uris())


def _on_disk(root: str) -> tuple[int, int]:
    files = [p for p in Path(root).rglob("*.parquet")]
    return len(files), sum(p.stat().st_size for p in files)


def test_maintenance_never_grows_the_lake(
    spark: Any, redis_client: Any, redis_url: str, lake_uri: str
) -> None:
    blocks = chain(0, 400)
    for i in range(4):  # four intervals: several small files per table
        publish(redis_client, "c", blocks[i * 100 : (i + 1) * 100], first_ms=1000 + i * 1000)
    settings = settings_for(redis_url, lake_uri)
    for i in range(4):
        archive_interval(spark, settings, "c", 1000 + i * 1000, 2000 + i * 1000)
    lake = settings.lake
    before = {name: live_files(lake, name)[:2] for name in tables.LAYOUT}
    paths = {name: _live_paths(lake_uri, name) for name in tables.LAYOUT}
    assert before[tables.BLOCKS][0] >= 2 and before[tables.ARCHIVE_LOG][0] >= 1

    first = maintain(spark, settings, retain_hours=0)
    for t in first.tables:
        assert t.files_after <= t.files_before and t.bytes_after <= t.bytes_before, t
        assert (t.files_before, t.bytes_before) == before[t.table]
    blocks_done = next(t for t in first.tables if t.table == tables.BLOCKS)
    assert blocks_done.compacted and blocks_done.files_after == 1
    # No property rewrite: column mapping stays unset, deletion vectors off, readable by delta-rs.
    for name in tables.LAYOUT:
        config = DeltaTable(lake.table(name)).metadata().configuration
        assert config.get("delta.columnMapping.mode", "none") == "none"
        assert DeltaTable(lake.table(name)).protocol().reader_features is None
    on_disk = _on_disk(lake_uri)
    after_first = {name: _live_paths(lake_uri, name) for name in tables.LAYOUT}
    for t in first.tables:  # only compaction rewrites: a table that needed none keeps its files
        assert (after_first[t.table] != paths[t.table]) == t.compacted, t

    # A second run finds nothing to do: the same live files, not one data byte written
    # (delta-rs' VACUUM still records itself in the log: metadata only).
    second = maintain(spark, settings, retain_hours=0)
    assert not any(t.compacted for t in second.tables)
    assert {n: _live_paths(lake_uri, n) for n in tables.LAYOUT} == after_first
    assert _on_disk(lake_uri) == on_disk
    rows = DeltaTable(lake.table(tables.BLOCKS)).to_pyarrow_table(columns=["num"])
    assert sorted(rows.column("num").to_pylist()) == list(range(400))
