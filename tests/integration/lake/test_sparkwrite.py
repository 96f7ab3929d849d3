"""The archive's Spark writer keeps the driver's share bounded, and writes the same rows
whichever way its marks are joined (issue 9: 1M entries lost their task results in a
1g local driver when the whole read's small columns were collected at once)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline import keys
from pipeline.blockcodec import encode_block
from pipeline.lake.archive import ArchiveResult, archive_interval
from pipeline.lake.storage import tables
from pipeline.lake.storage.entries import read_entries
from pipeline.lake.storage.intervalstats import MAX_REPORTED_INVALID
from pipeline.lake.write import sparkwrite
from tests.integration.lake.helpers import chain, publish, settings_for
from tests.integration.lake.test_arrowwrite import _redis_entries, _rows

pytestmark = pytest.mark.spark

STREAM = "c"
#: more invalid entries than the archive reports by id
INVALID = MAX_REPORTED_INVALID + 30
BLOCKS = 300


def _archive(
    spark: Any, redis_url: str, lake_uri: str, writer: str, start_ms: int, end_ms: int, **kw: Any
) -> ArchiveResult:
    settings = settings_for(redis_url, lake_uri, archive_writer=writer, archive_partitions=3)
    return archive_interval(spark, settings, STREAM, start_ms, end_ms, **kw)


@pytest.fixture
def collected(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, int]]]:
    """``(method, rows)`` of every result a classic DataFrame hands to the driver's Python,
    and of every DataFrame built from driver data (``createDataFrame``)."""
    from pyspark.sql.classic.dataframe import DataFrame
    from pyspark.sql.session import SparkSession

    seen: list[tuple[str, int]] = []

    def spy(cls: Any, name: str, count: Any) -> None:
        original = getattr(cls, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            seen.append((name, count(args, result)))
            return result

        monkeypatch.setattr(cls, name, wrapper)

    for name in ("collect", "tail", "toPandas"):
        spy(DataFrame, name, lambda args, result: len(result))
    spy(DataFrame, "toArrow", lambda args, result: result.num_rows)
    spy(DataFrame, "toLocalIterator", lambda args, result: -1)  # unbounded by nature: flagged
    spy(SparkSession, "createDataFrame", lambda args, result: len(args[1]) if len(args) > 1 else -1)
    yield seen


def test_the_driver_collects_a_few_rows_whatever_the_interval_size(
    spark: Any, redis_client: Any, redis_url: str, tmp_path: Path, collected: list[Any]
) -> None:
    """Every collection the Spark writer makes is a bounded one: one aggregate row, at most
    :data:`MAX_REPORTED_INVALID` invalid ids (test_arrowwrite checks its rows against the
    Arrow writer's)."""
    key = keys.stream(STREAM)
    publish(redis_client, STREAM, chain(0, BLOCKS), first_ms=1000)  # 1000..1299
    pipe = redis_client.pipeline(transaction=False)
    for i in range(INVALID):  # after the chain, two per ms: 1300-0, 1300-1, 1301-0, ...
        pipe.xadd(key, {b"block": b"\xc1 bad %d" % i}, id=f"{1300 + i // 2}-{i % 2}")
    pipe.execute()
    end_ms = 1300 + INVALID // 2 + 1
    lake_uri = str(tmp_path / "lake")

    result = _archive(spark, redis_url, lake_uri, "spark", 1000, end_ms)

    assert "scan" in result.stages
    assert (result.entries, result.blocks, result.invalid) == (BLOCKS + INVALID, BLOCKS, INVALID)
    assert (result.first_id, result.last_id) == ("1000-0", f"{1300 + (INVALID - 1) // 2}-1")
    assert result.invalid_ids == tuple(f"{1300 + i // 2}-{i % 2}" for i in range(100))
    # Before issue 9's fix: one toArrow of all BLOCKS + INVALID rows.
    assert collected, "the spy saw nothing: the writer's collections moved elsewhere"
    assert all(0 <= rows <= MAX_REPORTED_INVALID for _, rows in collected), collected
    assert not [c for c in collected if c[0] == "createDataFrame"], collected
    assert len(_rows(lake_uri, tables.BLOCKS)) == BLOCKS
    expected = _redis_entries(redis_client, STREAM, 1000, end_ms)
    assert list(read_entries(lake_uri, STREAM)) == expected


def test_marks_joined_by_a_shuffle_write_the_expected_rows(
    spark: Any,
    redis_client: Any,
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    collected: list[Any],
) -> None:
    """Repeated hashes, within the read and against ``blocks`` (a second interval), with
    marks too many to broadcast: one ``blocks`` row per hash from its first entry, every
    other entry keeps its payload, a forced rerun changes nothing, entries read as in Redis.

    (The broadcast join of the same marks: test_arrowwrite's repeated-hash test.)"""
    monkeypatch.setattr(sparkwrite, "MAX_BROADCAST_MARKS", 0)
    blocks = chain(0, 20)
    key = keys.stream(STREAM)
    publish(redis_client, STREAM, blocks[:10], first_ms=1000)  # 1000..1009
    redis_client.xadd(key, {b"block": encode_block(blocks[4])}, id="1010-0")  # dup in the read
    publish(redis_client, STREAM, blocks[10:], first_ms=1011)  # 1011..1020
    redis_client.xadd(key, {b"block": encode_block(blocks[2])}, id="1021-0")  # dup of the lake
    redis_client.xadd(key, {b"block": encode_block(blocks[12])}, id="1021-1")  # dup in the read
    lake_uri = str(tmp_path / "lake")

    first = _archive(spark, redis_url, lake_uri, "spark", 1000, 1011)
    second = _archive(spark, redis_url, lake_uri, "spark", 1011, 1022)
    assert (first.entries, first.blocks, second.entries, second.blocks) == (11, 11, 12, 12)
    owners = [(row["num"], row["entry_id"]) for row in _rows(lake_uri, tables.BLOCKS)]
    assert owners == [(n, f"{1000 + n}-0") for n in range(10)] + [
        (n, f"{1001 + n}-0") for n in range(10, 20)
    ]
    entries = _rows(lake_uri, tables.STREAM_ENTRIES)
    kept = [row["entry_id"] for row in entries if not row[tables.PAYLOAD_COLUMN]]
    assert kept == ["1010-0", "1021-0", "1021-1"]
    expected = _redis_entries(redis_client, STREAM, 1000, 1022)
    assert list(read_entries(lake_uri, STREAM)) == expected

    # A forced rerun marks every entry present or dup: nothing is added or changed.
    again = _archive(spark, redis_url, lake_uri, "spark", 1000, 1022, force=True)
    assert (again.entries, again.blocks) == (23, 23)
    assert _rows(lake_uri, tables.STREAM_ENTRIES) == entries
    assert len(_rows(lake_uri, tables.BLOCKS)) == 20
    assert all(0 <= rows <= MAX_REPORTED_INVALID for _, rows in collected), collected
