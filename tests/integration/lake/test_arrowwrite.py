"""The archive's Arrow writer against the Spark writer: same rows, readable by Spark and delta-rs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from pipeline import keys
from pipeline.blockcodec import Block, encode_block
from pipeline.lake.archive import ArchiveResult, archive_interval
from pipeline.lake.maintain import _vacuum
from pipeline.lake.storage import tables
from pipeline.lake.storage.entries import Entry, read_entries
from pipeline.lake.write import arrowwrite
from pipeline.settings import LakeSettings
from tests.integration.lake.helpers import chain, publish, settings_for

pytestmark = pytest.mark.spark

#: a name Spark escapes in its partition directory (``:`` and ``=``)
STREAM = "chain:a=b"
PLAIN = "plain"


def _rows(lake_uri: str, name: str) -> list[dict[str, Any]]:
    """Every row of a table, ``archived_at`` left out (each run stamps its own)."""
    table = DeltaTable(LakeSettings.from_url(lake_uri).table(name)).to_pyarrow_table()
    sort = {
        tables.BLOCKS: ["stream", "num", "hash"],
        tables.STREAM_ENTRIES: ["stream", "entry_id"],
        tables.ARCHIVE_LOG: ["start_ms", "stream"],
    }[name]
    rows = table.sort_by([(c, "ascending") for c in sort]).to_pylist()
    for row in rows:
        row.pop("archived_at")
    return rows


def _stamps(lake_uri: str, name: str) -> set[Any]:
    table = DeltaTable(LakeSettings.from_url(lake_uri).table(name)).to_pyarrow_table()
    return set(table.column("archived_at").to_pylist())


def _redis_entries(client: Any, stream: str, start_ms: int, end_ms: int) -> list[Entry]:
    out = []
    for raw_id, fields in client.xrange(keys.stream(stream), f"{start_ms}-0", f"({end_ms}-0"):
        entry_id = raw_id.decode()
        ms, seq = (int(x) for x in entry_id.split("-"))
        out.append(
            Entry(
                entry_id,
                ms,
                seq,
                {k.decode("utf-8", "backslashreplace"): v for k, v in fields.items()},
            )
        )
    return out


def _fill(client: Any) -> None:
    key = keys.stream(STREAM)
    blocks = chain(0, 40)
    publish(client, STREAM, blocks[:20], first_ms=1000)  # 1000..1019
    client.xadd(key, {b"block": b"\xc1 not msgpack"}, id="1020-0")
    client.xadd(key, {b"other": b"x", b"\xff": b"y"}, id="1020-1")
    heavy = Block(num=20, hash=blocks[20].hash, parent=blocks[20].parent, weight=2**200 + 7)
    client.xadd(key, {b"block": encode_block(heavy), b"note": b"n"}, id="1021-0")
    publish(client, STREAM, blocks[21:], first_ms=1022)  # 1022..1040
    client.xadd(keys.stream(PLAIN), {b"a": b"1", b"b": b"2"}, id="1001-0")
    client.xadd(keys.stream(PLAIN), {b"c": b""}, id="1001-5")


def _archive(spark: Any, redis_url: str, lake_uri: str, writer: str, **kw: Any) -> ArchiveResult:
    settings = settings_for(
        redis_url,
        lake_uri,
        streams=(STREAM, PLAIN),
        chain_streams=(STREAM,),
        archive_writer=writer,
        archive_partitions=3,
    )
    return archive_interval(spark, settings, kw.pop("stream", STREAM), 1000, 1041, **kw)


def test_arrow_and_spark_writers_write_the_same_rows(
    spark: Any, redis_client: Any, redis_url: str, tmp_path: Path
) -> None:
    _fill(redis_client)
    arrow, slow = str(tmp_path / "arrow"), str(tmp_path / "spark")
    results = {}
    for writer, lake_uri in (("arrow", arrow), ("spark", slow)):
        results[writer] = _archive(spark, redis_url, lake_uri, writer)
        _archive(spark, redis_url, lake_uri, writer, stream=PLAIN)
    fast, reference = results["arrow"], results["spark"]
    assert "commit_entries" in fast.stages and "commit_entries" not in reference.stages
    assert (fast.entries, fast.blocks, fast.invalid) == (42, 40, 2)
    for name in ("entries", "blocks", "invalid", "invalid_ids", "first_id", "last_id", "read"):
        assert getattr(fast, name) == getattr(reference, name), name

    for name in (tables.STREAM_ENTRIES, tables.BLOCKS):
        assert _rows(arrow, name) == _rows(slow, name), name
    # Every row of a run carries the run's archived_at, the one its archive_log row has.
    logged = _stamps(arrow, tables.ARCHIVE_LOG)
    assert _stamps(arrow, tables.STREAM_ENTRIES) == logged and len(logged) == 2
    assert len(_stamps(arrow, tables.BLOCKS)) == 1 and _stamps(arrow, tables.BLOCKS) < logged
    log_rows = _rows(arrow, tables.ARCHIVE_LOG)
    assert sorted((r["stream"], r["entries"], r["blocks"]) for r in log_rows) == [
        (STREAM, 42, 40),
        (PLAIN, 2, 0),
    ]
    for stream in (STREAM, PLAIN):
        expected = _redis_entries(redis_client, stream, 1000, 1041)
        assert list(read_entries(arrow, stream)) == expected
        assert list(read_entries(slow, stream)) == expected

    # Spark reads the Arrow writer's tables as delta-rs does (partition values, stats, types).
    lake = LakeSettings.from_url(arrow)
    for name, column, low in (
        (tables.STREAM_ENTRIES, "entry_ms", 1030),
        (tables.BLOCKS, "num", 30),
    ):
        frame = spark.read.format("delta").load(lake.table(name))
        seen = frame.where(f"stream = '{STREAM}' AND {column} >= {low}").count()
        table = DeltaTable(lake.table(name)).to_pyarrow_table()
        pairs = zip(
            table.column("stream").to_pylist(), table.column(column).to_pylist(), strict=True
        )
        wanted = [v for k, v in pairs if k == STREAM and v >= low]
        assert seen == len(wanted) > 0
        assert frame.count() == table.num_rows
    blocks_frame = spark.read.format("delta").load(lake.table(tables.BLOCKS))
    assert sorted(r["num"] for r in blocks_frame.select("num").collect()) == list(range(40))
    # Files sit in the partition directory Spark would use for the stream.
    written = list(Path(lake.table(tables.BLOCKS)).glob("stream=chain%3Aa%3Db/part-*.parquet"))
    assert written and all(p.name.endswith(".c000.snappy.parquet") for p in written)

    # A rerun is skipped; a forced one re-reads and merges (merge writer): nothing changes.
    entries_before = _rows(arrow, tables.STREAM_ENTRIES)
    assert _archive(spark, redis_url, arrow, "arrow").skipped
    forced = _archive(spark, redis_url, arrow, "arrow", force=True)
    assert "commit_entries" not in forced.stages and "merge_entries" in forced.stages
    assert _rows(arrow, tables.STREAM_ENTRIES) == entries_before


def test_repeated_and_known_hashes_keep_the_arrow_writer(
    spark: Any, redis_client: Any, redis_url: str, tmp_path: Path
) -> None:
    """Hashes repeated inside one task's range, across tasks' ranges, and already in ``blocks``
    from an earlier interval: the Arrow writer commits the Spark writer's rows (no merge
    writer), rewriting only the last task's files; the files it replaced are gone."""
    blocks = chain(0, 13)
    key = keys.stream(STREAM)
    publish(redis_client, STREAM, blocks[:2], first_ms=900)  # an earlier interval
    publish(redis_client, STREAM, blocks[2:12], first_ms=1000)  # 1000..1009
    # Three tasks: ids 1000..1003, 1004..1008, 1009..1013.
    redis_client.xadd(key, {b"block": encode_block(blocks[11])}, id="1009-1")  # same task
    redis_client.xadd(key, {b"block": encode_block(blocks[3]), b"note": b"n"}, id="1010-0")
    redis_client.xadd(key, {b"block": encode_block(blocks[5])}, id="1011-0")  # task 1's
    redis_client.xadd(key, {b"block": encode_block(blocks[0])}, id="1012-0")  # in blocks
    redis_client.xadd(key, {b"block": encode_block(blocks[12])}, id="1013-0")
    arrow, slow = str(tmp_path / "arrow"), str(tmp_path / "spark")
    for lake_uri, writer in ((arrow, "arrow"), (slow, "spark")):
        settings = settings_for(
            redis_url, lake_uri, streams=(STREAM,), chain_streams=(STREAM,),
            archive_writer=writer, archive_partitions=3, archive_range_entries=1,
        )  # fmt: skip
        archive_interval(spark, settings, STREAM, 900, 1000)
    lake = LakeSettings.from_url(arrow)
    before = {
        n: DeltaTable(lake.table(n)).version() for n in (tables.BLOCKS, tables.STREAM_ENTRIES)
    }
    fast = _archive(spark, redis_url, arrow, "arrow")
    _archive(spark, redis_url, slow, "spark")
    assert "fix" in fast.stages and "commit_entries" in fast.stages
    assert "merge_entries" not in fast.stages
    assert (fast.entries, fast.blocks) == (15, 15)
    for name in (tables.STREAM_ENTRIES, tables.BLOCKS):
        assert _rows(arrow, name) == _rows(slow, name), name
        assert DeltaTable(lake.table(name)).version() == before[name] + 1  # one commit each
    assert len(_rows(arrow, tables.BLOCKS)) == 13
    assert list(read_entries(arrow, STREAM)) == _redis_entries(redis_client, STREAM, 900, 1041)
    # The files the fix replaced (the last task's) were deleted; the others committed as written.
    for name in (tables.STREAM_ENTRIES, tables.BLOCKS):
        live = {a for a in DeltaTable(lake.table(name)).file_uris()}
        on_disk = {str(p) for p in Path(lake.table(name)).rglob("*.parquet")}
        assert on_disk == {u.removeprefix("file://") for u in live}, name
        names = {Path(u).name[:10] for u in live}
        assert "part-00001" in names and "part-00002" not in names, name


def test_a_repeat_right_after_a_range_boundary_is_settled_in_its_task(
    spark: Any, redis_client: Any, redis_url: str, tmp_path: Path
) -> None:
    """A producer's retried XADD lands as the first entry of the next task's range: the task
    looks back past its range's start, so no file is rewritten; the rows are Spark's."""
    blocks = chain(0, 12)
    key = keys.stream(STREAM)
    publish(redis_client, STREAM, blocks[:4], first_ms=1000)  # 1000..1003
    redis_client.xadd(key, {b"block": encode_block(blocks[3])}, id="1004-0")
    publish(redis_client, STREAM, blocks[4:7], first_ms=1005)  # 1005..1007
    redis_client.xadd(key, {b"block": encode_block(blocks[7]), b"n": b"1"}, id="1008-0")
    redis_client.xadd(key, {b"block": encode_block(blocks[7]), b"n": b"2"}, id="1009-0")
    publish(redis_client, STREAM, blocks[8:], first_ms=1010)  # 1010..1013
    # Three tasks: ids 1000..1003, 1004..1008, 1009..1013.
    arrow, slow = str(tmp_path / "arrow"), str(tmp_path / "spark")
    fast = _archive(spark, redis_url, arrow, "arrow")
    _archive(spark, redis_url, slow, "spark")
    assert "commit_entries" in fast.stages and "fix" not in fast.stages
    assert (fast.entries, fast.blocks) == (14, 14)
    for name in (tables.STREAM_ENTRIES, tables.BLOCKS):
        assert _rows(arrow, name) == _rows(slow, name), name
    assert list(read_entries(arrow, STREAM)) == _redis_entries(redis_client, STREAM, 1000, 1041)


def test_a_repeat_further_back_than_the_task_window_is_settled_by_the_driver(
    spark: Any, redis_client: Any, redis_url: str, tmp_path: Path
) -> None:
    """One task, a hash repeated 10,000 entries after its first (beyond the task's window,
    blockplan.WINDOW): the task writes it as a first, the driver's fix settles it; the rows
    are the Spark writer's."""
    from pipeline.lake.intake.redisread import DEFAULT_PAGE
    from pipeline.lake.write.blockplan import WINDOW

    n = 2 * DEFAULT_PAGE
    assert n - DEFAULT_PAGE > WINDOW  # the first page has left the window by the repeat's
    blocks = chain(0, n)
    publish(redis_client, STREAM, blocks, first_ms=1000)
    redis_client.xadd(keys.stream(STREAM), {b"block": encode_block(blocks[1])}, id=f"{1000 + n}-0")
    arrow, slow = str(tmp_path / "arrow"), str(tmp_path / "spark")
    results = {}
    for lake_uri, writer in ((arrow, "arrow"), (slow, "spark")):
        settings = settings_for(
            redis_url, lake_uri, streams=(STREAM,), chain_streams=(STREAM,),
            archive_writer=writer, archive_partitions=1,
        )  # fmt: skip
        results[writer] = archive_interval(spark, settings, STREAM, 1000, 1001 + n)
    fast = results["arrow"]
    assert "fix" in fast.stages and "commit_entries" in fast.stages
    assert (fast.entries, fast.blocks) == (n + 1, n + 1)
    for name in (tables.STREAM_ENTRIES, tables.BLOCKS):
        assert _rows(arrow, name) == _rows(slow, name), name
    assert len(_rows(arrow, tables.BLOCKS)) == n


def test_killed_between_the_commits_the_rerun_completes(
    spark: Any, redis_client: Any, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """blocks committed, stream_entries not (the job died in between): the rerun is exact."""
    _fill(redis_client)
    arrow, slow = str(tmp_path / "arrow"), str(tmp_path / "spark")
    commit = arrowwrite.commit

    def die_before_entries(table_uri: str, files: Any, stream: str, *options: Any) -> None:
        if table_uri.endswith(tables.STREAM_ENTRIES):
            raise KeyboardInterrupt("killed")
        commit(table_uri, files, stream, *options)

    monkeypatch.setattr(arrowwrite, "commit", die_before_entries)
    with pytest.raises(KeyboardInterrupt):
        _archive(spark, redis_url, arrow, "arrow")
    monkeypatch.setattr(arrowwrite, "commit", commit)
    lake = LakeSettings.from_url(arrow)
    assert DeltaTable(lake.table(tables.BLOCKS)).to_pyarrow_table().num_rows == 40
    assert DeltaTable(lake.table(tables.STREAM_ENTRIES)).to_pyarrow_table().num_rows == 0
    assert DeltaTable(lake.table(tables.ARCHIVE_LOG)).to_pyarrow_table().num_rows == 0
    orphans = list(Path(lake.table(tables.STREAM_ENTRIES)).rglob("*.parquet"))
    assert orphans  # written, never committed: invisible

    again = _archive(spark, redis_url, arrow, "arrow")
    # blocks holds exactly this interval's rows: the rerun commits only the entries
    assert "commit_entries" in again.stages and "commit_blocks" not in again.stages
    _archive(spark, redis_url, slow, "spark")
    for name in (tables.STREAM_ENTRIES, tables.BLOCKS):
        assert _rows(arrow, name) == _rows(slow, name), name
    assert list(read_entries(arrow, STREAM)) == _redis_entries(redis_client, STREAM, 1000, 1041)

    # Maintenance's VACUUM removes the files no commit references (Spark's .crc side files
    # too); both readers read the same table.
    before = _rows(arrow, tables.STREAM_ENTRIES)
    assert _vacuum(lake, tables.STREAM_ENTRIES, 0) >= len(orphans)
    assert not any(p.exists() for p in orphans)
    assert _rows(arrow, tables.STREAM_ENTRIES) == before
    assert spark.read.format("delta").load(lake.table(tables.STREAM_ENTRIES)).count() == 42
