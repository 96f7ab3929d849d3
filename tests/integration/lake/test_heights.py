"""Heights that cannot lie, in the lake: the archive keeps a block whose height is not its known
parent's plus one (and what lies above it) out of ``blocks``, and canonical marking never marks
one. Real Redis and delta-rs lakes; no Spark (the Arrow writer's tasks run here as Spark runs them)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pytest

from pipeline import keys
from pipeline.blockcodec import Block
from pipeline.lake import archivewrite
from pipeline.lake.archive import archive_interval
from pipeline.lake.canonical import mark_canonical
from pipeline.lake.storage import chainwalk, store, tables
from pipeline.lake.storage.entries import read_entries
from pipeline.lake.write import arrowwrite, mergewrite
from pipeline.lake.write.arrowtask import RESULT_ARROW, write_ranges
from pipeline.lake.write.jobs import ensure_tables as _create
from pipeline.lake.write.parquetfile import partition_dir
from pipeline.lake.write.writejob import WriteJob
from tests.integration.lake.helpers import append_blocks, block_hash, chain, publish, settings_for
from tests.integration.lake.test_s3 import _redis_entries

INTERVALS = ((1000, 1100), (1100, 1200))


def ensure_tables(lake: Any) -> None:
    """The tables as an archive leaves them (its layout step included)."""
    _create(lake)
    archivewrite.ensure_entries_columns(lake)


def _fill(client: Any) -> dict[str, Block]:
    """Two intervals of ``c``: an honest chain 0..13 with, in the first, a block that says
    1911 on a parent at 5 and its child; in the second, that child's child (honest on a
    set-aside parent) and a block that says 30 on a parent at 2, archived in the first."""
    main = chain(0, 14)
    liar = chain(1911, 1914, branch="x", parent=main[5].hash)
    low = Block(num=30, hash=block_hash(30, "y"), parent=main[2].hash)
    publish(client, "c", [*main[:10], *liar[:2], *main[10:12]], first_ms=1000)
    publish(client, "c", [liar[2], low, *main[12:]], first_ms=1100)
    return {"x1911": liar[0], "y30": low}


def _job(settings: Any, start_ms: int, end_ms: int) -> WriteJob:
    return WriteJob(
        settings=settings, stream="c", key=keys.stream("c"), start_ms=start_ms, end_ms=end_ms,
        chain=True, archived_at=datetime.now(UTC), lap=lambda *args: None,
    )  # fmt: skip


def _arrow(job: WriteJob) -> None:
    """The Arrow writer: its tasks (run here, one after the other), the driver's fix, commits."""
    task = arrowwrite.plan_task(archivewrite._write_options(job))
    assert task is not None and len(task.ranges) == 2
    ids = pa.record_batch([pa.array(range(len(task.ranges)), pa.int64())], names=["id"])
    rows = pa.Table.from_batches(list(write_ranges(task, iter([ids]))))
    written = arrowwrite.collect(rows.cast(RESULT_ARROW), partition_dir("c"))
    archivewrite._commit(job, archivewrite._fix(job, written))


def _rows(lake: Any, name: str) -> list[dict[str, Any]]:
    table = store.open_table(lake, name).to_pyarrow_table().drop_columns(["archived_at"])
    key = "entry_id" if name == tables.STREAM_ENTRIES else "hash"
    return sorted(table.to_pylist(), key=lambda row: row[key])


def test_the_archive_keeps_blocks_whose_height_lies_out_of_blocks(
    redis_client: Any, redis_url: str, tmp_path: Any
) -> None:
    told = _fill(redis_client)
    lakes = {
        writer: settings_for(
            redis_url, str(tmp_path / writer), archive_partitions=2, archive_range_entries=1
        )
        for writer in ("merge", "arrow")
    }
    reports = {}
    for writer, settings in lakes.items():
        ensure_tables(settings.lake)
        for start_ms, end_ms in INTERVALS:
            job = _job(settings, start_ms, end_ms)
            mergewrite.write(job) if writer == "merge" else _arrow(job)
            reports[writer, start_ms] = job.heights
    for writer in lakes:
        first, second = reports[writer, 1000], reports[writer, 1100]
        assert (first.bad, first.aside) == (1, 2), writer  # x1911, and x1912 above it
        assert first.named == [(told["x1911"].hash.hex(), 1911, 5)]
        # x1913 on x1912 (set aside by the first run), y30 on block 2 (by hash, far down)
        assert (second.bad, second.aside) == (1, 2), writer
        assert second.named == [(told["y30"].hash.hex(), 30, 2)]

    merge, arrow = lakes["merge"].lake, lakes["arrow"].lake
    assert sorted(r["num"] for r in _rows(merge, tables.BLOCKS)) == list(range(14))
    for name in (tables.BLOCKS, tables.STREAM_ENTRIES):
        assert _rows(merge, name) == _rows(arrow, name), name
    # every entry is archived whole: a set-aside block stays in its entry's fields
    expected = _redis_entries(redis_client, "c", 1000, 1200)
    assert list(read_entries(merge, "c")) == expected == list(read_entries(arrow, "c"))

    marked = mark_canonical(None, lakes["merge"], "c")
    assert (marked.head_num, marked.marked, marked.bad_height) == (13, 14, 0)


def test_the_archive_result_counts_and_logs_them_once(
    redis_client: Any, redis_url: str, lake_uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    told = _fill(redis_client)
    settings = settings_for(redis_url, lake_uri)
    ensure_tables(settings.lake)
    mergewrite.write(_job(settings, 1000, 1100))  # the lake holds the interval's entries:
    caplog.set_level("WARNING", logger="pipeline.lake.archive")
    done = archive_interval(None, settings, "c", 1000, 1100, force=True)  # merge writer again
    assert (done.bad_height, done.set_aside) == (1, 2)
    assert done.bad_height_blocks == ((told["x1911"].hash.hex(), 1911, 5),)
    lines = [r.getMessage() for r in caplog.records if "set aside" in r.getMessage()]
    assert len(lines) == 1 and "1911" in lines[0] and "parent at 5" in lines[0], lines


def test_canonical_marking_never_marks_a_height_that_lies(redis_url: str, lake_uri: str) -> None:
    settings = settings_for(redis_url, lake_uri)
    ensure_tables(settings.lake)
    main = chain(0, 7)
    fork = chain(5, 9, branch="f", parent=main[4].hash)  # a correct branch, the heaviest
    liar = chain(50, 53, branch="x", parent=main[4].hash)  # says 50 on a parent at 4
    append_blocks(lake_uri, "c", [*main, *liar, *fork], canonical=False)

    marked = mark_canonical(None, settings, "c")

    assert marked.head_hash == fork[-1].hash
    assert (marked.bad_height, marked.set_aside) == (1, 3)
    assert marked.bad_height_hashes == (liar[0].hash.hex(),)
    rows = store.open_table(settings.lake, tables.BLOCKS).to_pyarrow_table().to_pylist()
    canonical = sorted((r["num"], r["hash"]) for r in rows if r["canonical"])
    assert canonical == sorted((b.num, b.hash.hex()) for b in [*main[:5], *fork])


def test_a_height_pointing_below_the_walks_window_is_looked_up(
    redis_url: str, lake_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chainwalk, "WINDOW", 8)
    settings = settings_for(redis_url, lake_uri)
    ensure_tables(settings.lake)
    main = chain(0, 30)
    append_blocks(lake_uri, "c", main, canonical=True)
    liar = Block(num=60, hash=block_hash(60, "x"), parent=main[3].hash)  # far above, far below
    append_blocks(lake_uri, "c", [liar], canonical=False)

    marked = mark_canonical(None, settings, "c")

    assert (marked.head_num, marked.marked, marked.bad_height) == (29, 0, 1)
    plan = chainwalk.pending(settings.lake, "c")
    assert plan.mark == () and [n.num for n in plan.bad] == [60]


@pytest.mark.spark
def test_the_spark_writer_sets_the_same_blocks_aside(
    spark: Any, redis_client: Any, redis_url: str, tmp_path: Any
) -> None:
    told = _fill(redis_client)
    merge = settings_for(redis_url, str(tmp_path / "merge"))
    slow = settings_for(redis_url, str(tmp_path / "spark"), archive_writer="spark")
    ensure_tables(merge.lake)
    mergewrite.write(_job(merge, *INTERVALS[0]))
    done = archive_interval(spark, slow, "c", *INTERVALS[0])  # one interval: each costs Spark jobs
    assert (done.bad_height, done.set_aside) == (1, 2)
    assert done.bad_height_blocks == ((told["x1911"].hash.hex(), 1911, 5),)
    for name in (tables.BLOCKS, tables.STREAM_ENTRIES):
        assert _rows(merge.lake, name) == _rows(slow.lake, name), name
