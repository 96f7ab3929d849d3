"""What the Spark writer's MERGE settles, on a real S3 server, against the Spark writer on a
local lake: repeated hashes (the Arrow writer's files fixed by the driver, arrowfix) and an
interval the lake holds part of (the merge writer, no Spark write).

The same Redis entries are archived onto the store and onto a local lake with
``archive_writer = spark``, and both tables must hold the same rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline import keys
from pipeline.blockcodec import encode_block
from pipeline.lake.archive import archive_interval
from pipeline.lake.storage import store, tables
from pipeline.lake.storage.entries import read_entries
from pipeline.lake.trim import logged_intervals
from pipeline.lake.write import arrowwrite
from tests.integration.lake.helpers import chain, publish, settings_for
from tests.integration.lake.test_s3 import _redis_entries

pytestmark = pytest.mark.spark

KEYS = {tables.STREAM_ENTRIES: ("stream", "entry_id"), tables.BLOCKS: ("stream", "num", "hash")}


def _contents(lake: Any, name: str) -> list[dict[str, Any]]:
    """Every row of a table but ``archived_at`` (a run's clock), in key order."""
    rows = store.open_table(lake, name).to_pyarrow_table().drop_columns(["archived_at"])
    return sorted(rows.to_pylist(), key=lambda row: tuple(row[k] for k in KEYS[name]))


def _same_tables(s3: Any, local: Any) -> None:
    for name in (tables.BLOCKS, tables.STREAM_ENTRIES):
        assert _contents(s3.lake, name) == _contents(local.lake, name), name


def _versions(lake: Any) -> dict[str, int]:
    return {n: store.open_table(lake, n).version() for n in (tables.BLOCKS, tables.STREAM_ENTRIES)}


def test_repeated_hashes_on_s3_archive_as_the_spark_writer_does(
    spark: Any,
    redis_client: Any,
    redis_url: str,
    s3_lake: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Hashes repeated in the read; the job killed between its two commits; the rerun exact."""
    s3 = settings_for(redis_url, **s3_lake)
    local = settings_for(redis_url, lake_uri=str(tmp_path / "lake"), archive_writer="spark")
    blocks = chain(0, 12)
    key = keys.stream("c")
    publish(redis_client, "c", blocks[:8], first_ms=1000)  # 1000..1007
    redis_client.xadd(key, {b"block": encode_block(blocks[3])}, id="1008-0")  # dup in the read
    redis_client.xadd(key, {b"block": encode_block(blocks[3])}, id="1008-1")  # and again
    redis_client.xadd(key, {b"block": encode_block(blocks[8]), b"note": b"x"}, id="1009-0")
    redis_client.xadd(key, {b"block": b"\xc1 not msgpack"}, id="1010-0")  # invalid
    publish(redis_client, "c", blocks[9:], first_ms=1011)  # 1011..1013
    redis_client.xadd(key, {b"block": encode_block(blocks[10])}, id="1014-0")  # dup in the read

    commit = arrowwrite.commit

    def killed_before_entries(table_uri: str, files: Any, stream: str, *options: Any) -> None:
        if table_uri.endswith(tables.STREAM_ENTRIES):
            raise RuntimeError("killed")
        commit(table_uri, files, stream, *options)

    monkeypatch.setattr(arrowwrite, "commit", killed_before_entries)
    with pytest.raises(Exception, match="killed"):
        archive_interval(spark, s3, "c", 1000, 1020)
    monkeypatch.setattr(arrowwrite, "commit", commit)
    assert store.open_table(s3.lake, tables.STREAM_ENTRIES).to_pyarrow_table().num_rows == 0
    assert logged_intervals(s3.lake, "c") == []

    done = archive_interval(spark, s3, "c", 1000, 1020)
    # the blocks committed by the killed run are present: only the entries go in, fixed
    assert "fix" in done.stages and "commit_blocks" not in done.stages
    assert "merge_entries" not in done.stages
    assert (done.entries, done.blocks, done.invalid) == (16, 15, 1)
    reference = archive_interval(spark, local, "c", 1000, 1020)
    assert "merge_entries" not in reference.stages  # the Spark writer
    assert (reference.entries, reference.blocks, reference.invalid) == (16, 15, 1)
    _same_tables(s3, local)
    assert len(_contents(s3.lake, tables.BLOCKS)) == 12
    assert list(read_entries(s3.lake, "c")) == _redis_entries(redis_client, "c", 1000, 1020)
    assert logged_intervals(s3.lake, "c") == [(1000, 1020)]


def test_a_partly_archived_interval_reruns_exactly_on_s3_and_a_full_one_commits_nothing(
    spark: Any, redis_client: Any, redis_url: str, s3_lake: dict[str, Any], tmp_path: Path
) -> None:
    """Entries added later with explicit ids (some repeating archived blocks): a forced rerun
    adds just them, as the Spark writer does; another forced rerun commits nothing."""
    s3 = settings_for(redis_url, **s3_lake)
    local = settings_for(redis_url, lake_uri=str(tmp_path / "lake"), archive_writer="spark")
    blocks = chain(0, 24)
    key = keys.stream("c")
    publish(redis_client, "c", blocks[:10], first_ms=1000)  # 1000..1009
    for settings in (s3, local):
        first = archive_interval(spark, settings, "c", 1000, 1040)
        assert (first.entries, first.blocks) == (10, 10)

    publish(redis_client, "c", blocks[10:20], first_ms=1020)  # 1020..1029, explicit ids
    redis_client.xadd(key, {b"block": encode_block(blocks[2])}, id="1030-0")  # dup of the lake
    redis_client.xadd(key, {b"block": encode_block(blocks[12])}, id="1030-1")  # dup in the read
    redis_client.xadd(key, {b"block": encode_block(blocks[20]), b"note": b"x"}, id="1031-0")
    redis_client.xadd(key, {b"x": b"1"}, id="1032-0")  # not a block
    redis_client.xadd(key, {b"block": encode_block(blocks[21])}, id="1033-0")
    s3_before = _versions(s3.lake)
    again = archive_interval(spark, s3, "c", 1000, 1040, force=True)
    assert "merge_entries" in again.stages
    assert (again.entries, again.blocks, again.invalid) == (25, 24, 1)
    assert all(v == s3_before[n] + 1 for n, v in _versions(s3.lake).items())  # one commit each
    reference = archive_interval(spark, local, "c", 1000, 1040, force=True)
    assert (reference.entries, reference.blocks, reference.invalid) == (25, 24, 1)
    _same_tables(s3, local)
    assert len(_contents(s3.lake, tables.BLOCKS)) == 22
    assert list(read_entries(s3.lake, "c")) == _redis_entries(redis_client, "c", 1000, 1040)

    # Fully archived: a forced rerun reads it all and commits nothing to either table.
    settled = _versions(s3.lake)
    rows = {n: _contents(s3.lake, n) for n in settled}
    last = archive_interval(spark, s3, "c", 1000, 1040, force=True)
    assert (last.entries, last.blocks, last.invalid) == (25, 24, 1)
    assert _versions(s3.lake) == settled
    assert {n: _contents(s3.lake, n) for n in settled} == rows
