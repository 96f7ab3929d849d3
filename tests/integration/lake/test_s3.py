"""The lake on a real S3 server (versitygw): every job and reader, racing commits, a store that stops."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from pipeline import keys
from pipeline.blockcodec import decode_block
from pipeline.errors import LakePathError
from pipeline.lake.archive import ArchiveResult, archive_interval
from pipeline.lake.archivelog import write_log as _write_log
from pipeline.lake.audit import audit
from pipeline.lake.canonical import mark_canonical
from pipeline.lake.maintain import maintain
from pipeline.lake.replay import replay
from pipeline.lake.storage import store, tables
from pipeline.lake.storage.entries import Entry, read_entries
from pipeline.lake.storage.reader import LakeReader
from pipeline.lake.trim import logged_intervals, safe_trim
from pipeline.lake.write import arrowwrite
from pipeline.local.s3 import LocalStore
from tests.integration.lake.helpers import chain, publish, settings_for

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[3]


def _redis_entries(client: Any, stream: str, start_ms: int, end_ms: int) -> list[Entry]:
    out = []
    for raw_id, fields in client.xrange(keys.stream(stream), f"{start_ms}-0", f"({end_ms}-0"):
        entry_id = raw_id.decode()
        ms, seq = (int(x) for x in entry_id.split("-"))
        out.append(Entry(entry_id, ms, seq, {k.decode(): v for k, v in fields.items()}))
    return out


def _objects(lake: Any, name: str) -> set[str]:
    """Every data file under a table on the store, committed or not (paths in the table)."""
    fs, root = store.filesystem(lake, lake.table(name))
    found = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    return {
        f.path.removeprefix(root + "/")
        for f in found
        if f.type == pafs.FileType.File and f.path.endswith(".parquet")
    }


def test_every_job_and_reader_on_s3(
    spark: Any, redis_client: Any, redis_url: str, s3_lake: dict[str, Any]
) -> None:
    """Archive (exact, idempotent), canonical through a reorg, audit, trim, replay, maintain."""
    settings = settings_for(redis_url, **s3_lake)
    lake = settings.lake
    main = chain(0, 10)
    fork = chain(7, 11, branch="fork", parent=main[6].hash)
    publish(redis_client, "c", main, first_ms=1000)  # 1000..1009
    publish(redis_client, "c", fork, first_ms=1010)  # 1010..1013
    redis_client.xadd(keys.stream("c"), {b"block": b"\xc1 not msgpack"}, id="1014-0")
    redis_client.xadd(keys.stream("plain"), {b"a": b"1", b"b": b"2"}, id="1001-0")

    first = archive_interval(spark, settings, "c", 1000, 1010, run_id="r1")
    assert (first.entries, first.blocks, first.read) == (10, 10, 10)
    assert "commit_blocks" in first.stages  # the Arrow writer wrote it, on the store
    versions = {n: store.open_table(lake, n).version() for n in tables.LAYOUT}
    again = archive_interval(spark, settings, "c", 1000, 1010, run_id="r2")
    assert again.skipped and again.entries == 10
    assert {n: store.open_table(lake, n).version() for n in tables.LAYOUT} == versions
    marked = mark_canonical(spark, settings, "c")
    assert (marked.head_num, marked.marked, marked.unmarked) == (9, 10, 0)

    # The fork's blocks share heights with archived ones: new hashes, committed as they are.
    second = archive_interval(spark, settings, "c", 1010, 1015)
    assert (second.entries, second.blocks, second.invalid) == (5, 4, 1)
    plain = archive_interval(spark, settings, "plain", 1000, 1015)
    assert plain.entries == 1
    reorg = mark_canonical(spark, settings, "c")
    assert (reorg.head_num, reorg.head_hash, reorg.marked, reorg.unmarked) == (
        10, fork[3].hash, 4, 3,
    )  # fmt: skip
    assert list(read_entries(lake, "c")) == _redis_entries(redis_client, "c", 0, 2000)
    assert list(read_entries(lake, "plain")) == _redis_entries(redis_client, "plain", 0, 2000)

    reader = LakeReader(lake)
    canonical = main[:7] + fork
    assert [r.hash for b in reader.iter_canonical("c", 0) for r in b] == [b.hash for b in canonical]
    reorged = reader.find_hash("c", main[8].hash)
    assert reorged is not None and not reorged.canonical
    report = audit(settings, "c")
    assert report.ok and (report.first, report.last, report.canonical_count) == (0, 10, 11)

    # Trim never goes past what archive_log proves archived.
    redis_client.xadd(keys.stream("c"), {b"block": b"late"}, id="5000-0")
    trimmed = safe_trim(settings, "c", now_ms=10**13)
    assert trimmed.covered_to_ms == 1015
    assert [e[0] for e in redis_client.xrange(keys.stream("c"))] == [b"5000-0"]
    assert sorted(logged_intervals(lake, "c")) == [(1000, 1010), (1010, 1015)]

    out = replay(settings, "c", 0, 10, target_stream="copy")
    assert (out.published, out.missing) == (11, 0)
    copied = [decode_block(f[b"block"]) for _, f in redis_client.xrange(keys.stream("copy"))]
    assert [b.hash for b in copied] == [b.hash for b in canonical]

    # Maintenance on the store: delta-rs compacts and vacuums; the chain reads the same.
    done = maintain(spark, settings, retain_hours=0)
    blocks = next(t for t in done.tables if t.table == tables.BLOCKS)
    assert blocks.files_after == 1 and blocks.vacuumed > 0
    live = store.open_table(lake, tables.BLOCKS).get_add_actions(flatten=True)
    assert _objects(lake, tables.BLOCKS) == set(pa.table(live).column("path").to_pylist())
    reader = LakeReader(lake)
    assert [r.hash for b in reader.iter_canonical("c", 0) for r in b] == [b.hash for b in canonical]


def test_two_archives_of_different_streams_commit_at_once(
    spark: Any, redis_client: Any, redis_url: str, s3_lake: dict[str, Any]
) -> None:
    """Both jobs commit to the shared tables at once; conditional puts keep both commits."""
    settings = settings_for(redis_url, **s3_lake, streams=("c", "d"), chain_streams=("c", "d"))
    publish(redis_client, "c", chain(0, 30), first_ms=1000)
    publish(redis_client, "d", chain(0, 30, branch="d"), first_ms=1000)
    start = threading.Barrier(2)

    def run(stream: str) -> ArchiveResult:
        start.wait()
        return archive_interval(spark, settings, stream, 1000, 1030)

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(run, ("c", "d")))
    assert [(r.stream, r.entries, r.blocks) for r in results] == [("c", 30, 30), ("d", 30, 30)]
    for stream in ("c", "d"):
        assert list(read_entries(settings.lake, stream)) == _redis_entries(
            redis_client, stream, 0, 2000
        )
        assert logged_intervals(settings.lake, stream) == [(1000, 1030)]


def test_racing_commits_to_one_table_are_all_kept(redis_url: str, s3_lake: dict[str, Any]) -> None:
    """Eight writers MERGE a row each into archive_log at once: a lost race is retried."""
    settings = settings_for(redis_url, **s3_lake)
    from pipeline.lake.write.jobs import ensure_tables

    ensure_tables(settings.lake)
    start = threading.Barrier(8)

    def log_one(i: int) -> None:
        row = ArchiveResult(
            stream=f"s{i}", start_ms=0, end_ms=10, entries=i, blocks=0, invalid=0,
            invalid_ids=(), first_id=None, last_id=None, seconds=0.0,
        )  # fmt: skip
        start.wait()
        _write_log(settings.lake, row, f"run{i}", __import__("datetime").datetime.now())

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(log_one, range(8)))
    rows = store.open_table(settings.lake, tables.ARCHIVE_LOG).to_pyarrow_table()
    assert sorted(rows.column("stream").to_pylist()) == [f"s{i}" for i in range(8)]


def test_the_store_stopped_mid_archive_then_the_rerun_is_exact(
    spark: Any,
    redis_client: Any,
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The store dies between the two commits: one clear error, nothing logged; rerun exact."""
    own = LocalStore(tmp_path / "s3").start()
    try:
        own.create_bucket("lake")
        settings = settings_for(redis_url, lake_uri="s3://lake/l", **own.lake_settings())
        publish(redis_client, "c", chain(0, 40), first_ms=1000)
        commit = arrowwrite.commit

        def stop_before_entries(table_uri: str, files: Any, stream: str, *options: Any) -> None:
            if table_uri.endswith(tables.STREAM_ENTRIES):
                own.stop()
            commit(table_uri, files, stream, *options)

        monkeypatch.setattr(arrowwrite, "commit", stop_before_entries)
        with pytest.raises(LakePathError) as failed:
            archive_interval(spark, settings, "c", 1000, 1040)
        assert "\n" not in str(failed.value)
        assert "refused the connection" in str(failed.value)
        monkeypatch.setattr(arrowwrite, "commit", commit)
        own.start()
        lake = settings.lake
        assert store.open_table(lake, tables.BLOCKS).to_pyarrow_table().num_rows == 40
        assert store.open_table(lake, tables.STREAM_ENTRIES).to_pyarrow_table().num_rows == 0
        assert logged_intervals(lake, "c") == []

        again = archive_interval(spark, settings, "c", 1000, 1040)
        assert "commit_entries" in again.stages and "commit_blocks" not in again.stages
        assert list(read_entries(lake, "c")) == _redis_entries(redis_client, "c", 0, 2000)
        assert store.open_table(lake, tables.BLOCKS).to_pyarrow_table().num_rows == 40
        assert logged_intervals(lake, "c") == [(1000, 1040)]
    finally:
        own.stop()


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"SLUICE_LAKE_URI": "s3://no-such-bucket/l"}, "bucket.* does not exist"),
        ({"SLUICE_LAKE_S3_SECRET_KEY": "wrong"}, "access denied"),
        ({"SLUICE_LAKE_S3_ENDPOINT": "__down__"}, "refused the connection"),
    ],
)
def test_cli_on_a_broken_store_is_one_line_and_exit_1(
    redis_client: Any,
    redis_url: str,
    s3_lake: dict[str, Any],
    tmp_path: Path,
    change: dict[str, str],
    says: str,
) -> None:
    publish(redis_client, "c", chain(0, 3), first_ms=1000)
    env = {
        **os.environ,
        **{"SLUICE_" + k.upper(): str(v).lower() if isinstance(v, bool) else str(v)
           for k, v in s3_lake.items()},
        "SLUICE_REDIS_URL": redis_url,
        "SLUICE_STREAMS": "c",
        "SLUICE_CHAIN_STREAMS": "c",
        "SLUICE_CONFIG": os.devnull,  # no config file
        "SLUICE_VAR_DIR": str(tmp_path / "var"),
        **change,
    }  # fmt: skip
    if env["SLUICE_LAKE_S3_ENDPOINT"] == "__down__":
        from pipeline.runtime.ports import free_port

        env["SLUICE_LAKE_S3_ENDPOINT"] = f"http://127.0.0.1:{free_port()}"
    for argv in (
        ["archive", "--stream", "c", "--start-ms", "1000", "--end-ms", "1003"],
        ["canonical", "--stream", "c"],
        ["audit", "--stream", "c"],
        ["replay", "--stream", "c", "--from", "0", "--to", "2"],
        ["maintain"],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "pipeline.lake.cli", *argv],
            env=env, capture_output=True, text=True, timeout=300, cwd=ROOT, check=False,
        )  # fmt: skip
        assert done.returncode == 1, done.stderr
        assert "Traceback" not in done.stderr, done.stderr
        errors = [line for line in done.stderr.splitlines() if re.search(says, line)]
        assert len(errors) == 1, done.stderr
