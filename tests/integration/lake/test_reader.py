"""The JVM-free reader against tables written by Spark (the real writer)."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.errors import LakeError
from pipeline.lake.storage import tables
from pipeline.lake.storage.reader import LakeReader
from pipeline.lake.write.jobs import ensure_tables, table_sql
from pipeline.settings import LakeSettings
from tests.integration.lake.helpers import block_rows, chain

pytestmark = pytest.mark.spark


def _append(spark: Any, lake_uri: str, rows: list[dict[str, Any]]) -> None:
    frame = spark.createDataFrame(rows, schema=tables.BLOCKS_DDL)
    frame.write.format("delta").mode("append").save(
        LakeSettings.from_url(lake_uri).table(tables.BLOCKS)
    )


def test_reader_reads_what_spark_wrote(spark: Any, lake_uri: str) -> None:
    lake = LakeSettings.from_url(lake_uri)
    reader = LakeReader(lake_uri)
    assert reader.head("s") is None
    assert list(reader.iter_canonical("s", 0)) == []

    ensure_tables(lake)
    main = chain(0, 30)
    fork = chain(20, 24, branch="fork", parent=main[19].hash)
    # Three commits with overlapping num ranges (out of order), plus reorged blocks
    # and another stream in the same table.
    _append(spark, lake_uri, block_rows("s", main[10:30]))
    _append(
        spark, lake_uri, block_rows("s", main[0:12][:10]) + block_rows("s", fork, canonical=False)
    )
    _append(spark, lake_uri, block_rows("other", chain(0, 50, branch="o")))

    assert reader.head("s") is None  # old snapshot until refresh
    reader.refresh()
    head = reader.head("s")
    assert head is not None and head.num == 29 and head.hash == main[29].hash
    assert head.parent == main[28].hash and head.canonical

    at21 = reader.canonical_at("s", 21)
    assert at21 is not None and at21.hash == main[21].hash
    assert reader.canonical_at("s", 30) is None

    reorged = reader.find_hash("s", fork[1].hash)
    assert reorged is not None and not reorged.canonical and reorged.num == 21
    assert reader.find_hash("other", fork[1].hash) is None

    got = [row for batch in reader.iter_canonical("s", 5, 25, batch_rows=4) for row in batch]
    assert [r.num for r in got] == list(range(5, 25))
    assert [r.hash for r in got] == [b.hash for b in main[5:25]]
    assert all(len(batch) <= 4 for batch in reader.iter_canonical("s", 0, batch_rows=4))
    everything = [r.num for batch in reader.iter_canonical("s", 0) for r in batch]
    assert everything == list(range(30))
    arrow = list(reader.iter_canonical_arrow("other", 45))
    assert sum(t.num_rows for t in arrow) == 5
    assert arrow[0].column_names == ["num", "hash", "parent", "payload"]

    # The properties the reader depends on, as the jobs create the table.
    config = _properties(spark, lake)
    assert config.get("delta.enableDeletionVectors") == "false"
    assert config.get("delta.columnMapping.mode", "none") == "none"


def test_reader_refuses_deletion_vectors(spark: Any, lake_uri: str) -> None:
    lake = LakeSettings.from_url(lake_uri)
    ensure_tables(lake)
    _append(spark, lake_uri, block_rows("s", chain(0, 3)))
    spark.sql(
        f"ALTER TABLE {table_sql(lake, tables.BLOCKS)} "
        "SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')"
    )
    with pytest.raises(LakeError, match="deletionVectors"):
        LakeReader(lake_uri)


def test_reader_bad_range_arguments(lake_uri: str) -> None:
    reader = LakeReader(lake_uri)
    with pytest.raises(ValueError):
        list(reader.iter_canonical("s", 5, 2))
    with pytest.raises(ValueError):
        list(reader.iter_canonical("s", 0, batch_rows=0))


def _properties(spark: Any, lake: LakeSettings) -> dict[str, str]:
    rows = spark.sql(f"SHOW TBLPROPERTIES {table_sql(lake, tables.BLOCKS)}").collect()
    return {r["key"]: r["value"] for r in rows}
