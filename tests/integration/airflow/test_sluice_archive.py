"""``sluice_archive`` end to end: Redis -> Airflow (dag.test) -> Spark jobs -> Delta -> trim.

The ``archived`` fixture (conftest.py) writes a chain with reorgs and a plain
stream inside one data interval and runs the DAG for exactly that interval
twice: first for both streams with a hot-retention window that protects
everything, then for the chain stream with a one-hour one. Both runs must
leave the same tables; only the second trims, and only below the archived
interval.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from pipeline.blockcodec import encode_block
from pipeline.runtime.ports import free_port
from tests.integration.airflow import scenario as sc
from tests.integration.airflow.conftest import AIRFLOW_WARNINGS, ROOT, DagRunner, task_states

pytestmark = [pytest.mark.airflow, pytest.mark.spark, AIRFLOW_WARNINGS]


def test_both_runs_succeed_for_exactly_the_interval(archived: Any) -> None:
    for (states, start, end), streams in ((archived["first"], 2), (archived["second"], 1)):
        assert all(state == "success" for state in states.values()), states
        assert (start, end) == (sc.START, sc.END)
        # one job for all streams, then one mapped archive per shard of streams (one here)...
        assert states["archive_streams[-1]"] == "success"
        assert (states["shards[-1]"], states["archive[0]"]) == ("success", "success")
        assert "archive[1]" not in states, (states, streams)
        # ...then one trim job for every stream
        assert states["trim[-1]"] == "success" and "trim[0]" not in states
        # ...and canonical marking for the chain stream only
        assert states["canonical[0]"] == "success" and "canonical[1]" not in states
        assert states["publish[-1]"] == "success"


def test_blocks_are_archived_with_reorged_blocks_kept_non_canonical(archived: Any) -> None:
    from pipeline.lake.storage.reader import LakeReader

    written = archived["written"]
    reader = LakeReader(archived["lake"])
    rows = [r for batch in reader.iter_canonical(sc.CHAIN, 0, None) for r in batch]
    assert [(r.num, r.hash) for r in rows] == [(b.num, b.hash) for b in written["canonical"]]
    assert [r.payload for r in rows] == [encode_block(b) for b in written["canonical"]]
    canonical = {b.hash for b in written["canonical"]}
    reorged = [b for b in written["inside"] if b.hash not in canonical]
    assert reorged, "the synthetic chain must contain a reorg"
    for block in reorged:
        row = reader.find_hash(sc.CHAIN, block.hash)
        assert row is not None and row.canonical is False
    head = reader.head(sc.CHAIN)
    assert head is not None and head.hash == written["canonical"][-1].hash
    inside = {b.hash for b in written["inside"]}
    for block in written["after"]:  # entries after the interval are not in the lake yet
        if block.hash not in inside:
            assert reader.find_hash(sc.CHAIN, block.hash) is None


def test_archive_log_and_entries_hold_exactly_the_interval(archived: Any) -> None:
    log = archived["tables_first"]["archive_log"]
    by_stream = {row["stream"]: row for row in log}
    assert set(by_stream) == {sc.CHAIN, sc.PLAIN} and len(log) == 2
    for stream, entries in ((sc.CHAIN, sc.CHAIN_INSIDE + 1), (sc.PLAIN, sc.PLAIN_INSIDE)):
        row = by_stream[stream]
        assert (row["start_ms"], row["end_ms"], row["entries"]) == (sc.START_MS, sc.END_MS, entries)
    assert by_stream[sc.CHAIN]["blocks"] == sc.CHAIN_INSIDE
    assert by_stream[sc.CHAIN]["invalid"] == 1
    entries = archived["tables_first"]["stream_entries"]
    assert sorted(r["entry_ms"] for r in entries if r["stream"] == sc.PLAIN) == [
        sc.START_MS + 7 * i for i in range(sc.PLAIN_INSIDE)
    ]
    chain_ms = [r["entry_ms"] for r in entries if r["stream"] == sc.CHAIN]
    assert len(chain_ms) == sc.CHAIN_INSIDE + 1
    assert min(chain_ms) == sc.START_MS and max(chain_ms) == sc.END_MS - 1


def test_invalid_entries_are_task_warnings_counted_in_the_result(archived: Any) -> None:
    # The job's warning reached the task log at WARNING level (the UI's level filter finds it)...
    warned = [m for level, m in archived["records_first"] if level >= logging.WARNING]
    assert any("not valid blocks" in m and "archived raw" in m for m in warned), warned
    assert any("logged 1 warning(s)" in m for m in warned), warned
    # ...and is counted in the task's result (the XCom), next to the invalid count.
    chain = next(r for r in archived["published_first"]["archived"] if r["stream"] == sc.CHAIN)
    assert (chain["invalid"], chain["warnings"]) == (1, 1), chain
    assert chain["invalid_ids"] == [sc.INVALID_ID]
    plain = next(r for r in archived["published_first"]["archived"] if r["stream"] == sc.PLAIN)
    assert plain["warnings"] == 0


def test_second_run_leaves_the_same_tables(archived: Any) -> None:
    first, second = archived["tables_first"], archived["tables_second"]
    assert set(first) == set(second) == {"blocks", "archive_log", "stream_entries"}
    for name in first:
        assert second[name] == first[name], name


def test_trim_only_below_the_archived_interval_and_outside_retention(archived: Any) -> None:
    # Run 1: everything was inside the retention window: nothing trimmed.
    assert {s: len(ids) for s, ids in archived["ids_first"].items()} == {
        sc.CHAIN: sc.CHAIN_INSIDE + 1 + sc.AFTER,
        sc.PLAIN: sc.PLAIN_INSIDE + sc.PLAIN_AFTER,
    }
    # Run 2: the chain's archived interval is gone from Redis; what follows it
    # survives. The plain stream was not in run 2 and keeps everything.
    assert archived["ids_second"] == {
        sc.CHAIN: [f"{sc.END_MS + i}-0" for i in range(sc.AFTER)],
        sc.PLAIN: archived["ids_first"][sc.PLAIN],
    }


def test_the_run_emits_the_lake_asset_with_its_interval(archived: Any) -> None:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.settings import Session
    from sqlalchemy import select

    with Session() as session:
        events = session.scalars(
            select(AssetEvent)
            .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .where(AssetModel.uri == "sluice://lake/blocks")
        ).all()
        extras = [e.extra for e in events if e.source_run_id == archived["second_run_id"]]
    assert extras, "no asset event from the archive run"
    assert (extras[-1]["start_ms"], extras[-1]["end_ms"]) == (sc.START_MS, sc.END_MS)
    assert extras[-1]["streams"] == [sc.CHAIN]


def test_redis_down_fails_the_archive_and_trims_nothing(
    dag_runner: DagRunner, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="sluice_lake_job")
    lake = tmp_path / "lake"
    env = {
        "SLUICE_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
        "SLUICE_LAKE_URI": str(lake),
        "SLUICE_STREAMS": sc.CHAIN,
        "SLUICE_CHAIN_STREAMS": "",
    }
    run = dag_runner.run("sluice_archive", sc.END + timedelta(minutes=5), env=env)
    states = task_states(run)
    assert str(run.state) == "failed", states
    # every stream failed in the shared job: it is failed (not green), so is the run,
    # and nothing after it ran (no archive, canonical, trim or publish succeeded)
    assert states["archive_streams[-1]"] == "failed", states
    assert f"stream {sc.CHAIN} failed: " in caplog.text  # each stream's error, in the task log
    # The job's own error line reached the task log.
    assert "is unavailable" in caplog.text
    after = ("archive[", "canonical[", "trim[", "publish[")
    assert not [k for k, v in states.items() if k.startswith(after) and v == "success"], states
    assert not (lake / "archive_log").exists() or sc.table_rows(str(lake), "archive_log") == []


@pytest.mark.parametrize("shard", [1, 2], ids=["a-shard-each", "one-shard"])
def test_a_stream_failing_in_the_shared_job_fails_only_its_own_task(
    shard: int,
    dag_runner: DagRunner,
    lake_redis: Any,
    lake_redis_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from pipeline import keys

    good, broken = "events:good", "events:broken"
    day = timedelta(days=1)
    ids = [f"{sc.START_MS + 86_400_000 + 1000 * i}-0" for i in range(1, 6)]
    for entry_id in ids:
        lake_redis.xadd(keys.stream(good), {b"n": entry_id.encode()}, id=entry_id)
    lake_redis.set(keys.stream(broken), b"not a stream")  # its archive fails, every time
    caplog.set_level("INFO", logger="sluice_lake_operator")
    caplog.set_level("INFO", logger="sluice_lake_job")
    lake = tmp_path / "lake"
    env = {
        "SLUICE_REDIS_URL": lake_redis_url,
        "SLUICE_LAKE_URI": str(lake),
        "SLUICE_STREAMS": f"{broken},{good}",
        "SLUICE_CHAIN_STREAMS": "",
        "SLUICE_ARCHIVE_SHARD_STREAMS": str(shard),
    }
    try:
        run = dag_runner.run("sluice_archive", sc.END + day, env=env)
    finally:
        lake_redis.delete(keys.stream(good), keys.stream(broken))
    states = task_states(run)
    # the shared job ran both streams and reported the broken one without failing...
    assert states["archive_streams[-1]"] == "success", states
    assert f"1 stream(s) failed in this job: {broken}" in caplog.text
    # ...whose shard's task archived it again (it alone), and failed with its error; the
    # good one's shard did not, or its result came from the shared job in the same task
    if shard == 1:
        assert (states["archive[0]"], states["archive[1]"]) == ("failed", "success"), states
    else:
        assert states["archive[0]"] == "failed" and "archive[1]" not in states, states
    assert f"stream {good}: archived by archive_streams: 5 entries read" in caplog.text
    # the shard's own job archived the failed stream alone
    assert f"0 of 1 stream(s) archived, 1 failed: {broken}" in caplog.text
    failures = [
        r for r in caplog.records if r.getMessage().startswith(f"stream {broken}: archive failed")
    ]
    # logged twice at ERROR (the shared job, then its own task's job), with the cause
    assert [r.levelname for r in failures] == ["ERROR", "ERROR"], caplog.text
    assert all("is a string, not a stream" in r.getMessage() for r in failures)
    assert str(run.state) == "failed"
    rows = sc.table_rows(str(lake), "archive_log")
    assert [(r["stream"], r["entries"]) for r in rows] == [(good, 5)]
    entries = sc.table_rows(str(lake), "stream_entries")
    assert sorted(r["entry_id"] for r in entries) == sorted(ids)


def test_the_dag_archives_into_an_s3_lake_and_the_coverage_view_reads_it(
    dag_runner: DagRunner, lake_redis: Any, lake_redis_url: str, s3_lake: dict[str, Any]
) -> None:
    """sluice_archive with the lake on the real S3 server; the coverage view reads it there."""
    import sys

    from pipeline import keys
    from pipeline.lake.storage import store, tables
    from pipeline.lake.storage.entries import read_entries
    from pipeline.settings import Settings

    stream = "events:s3"
    day = timedelta(days=1)
    ids = [f"{sc.START_MS + 3 * 86_400_000 + 1000 * i}-0" for i in range(1, 6)]
    for entry_id in ids:
        lake_redis.xadd(keys.stream(stream), {b"n": entry_id.encode()}, id=entry_id)
    env = {
        "SLUICE_" + k.upper(): str(v).lower() if isinstance(v, bool) else str(v)
        for k, v in s3_lake.items()
    } | {"SLUICE_REDIS_URL": lake_redis_url, "SLUICE_STREAMS": stream, "SLUICE_CHAIN_STREAMS": ""}
    try:
        run = dag_runner.run("sluice_archive", sc.END + 3 * day, env=env)
        assert str(run.state) == "success", task_states(run)
        settings = Settings.load(env={}, **s3_lake)
        lake = settings.lake
        got = [e.entry_id for e in read_entries(lake, stream)]
        assert got == ids
        rows = store.open_table(lake, tables.ARCHIVE_LOG).to_pyarrow_table().to_pylist()
        assert [(r["stream"], r["entries"]) for r in rows] == [(stream, 5)]
    finally:
        lake_redis.delete(keys.stream(stream))
    plugins = str(ROOT / "plugins")
    if plugins not in sys.path:  # Airflow adds it in its own processes
        sys.path.append(plugins)
    import sluice_coverage

    view = sluice_coverage.ArchiveLogReader(lake).read()
    assert [(i.entries, i.run_id) for i in view.newest[stream]] == [(5, run.run_id)]


def test_a_stream_pattern_archives_and_trims_every_matching_stream(
    dag_runner: DagRunner, lake_redis: Any, lake_redis_url: str, tmp_path: Path
) -> None:
    """``SLUICE_STREAMS=pat:*``: the streams Redis holds when the run starts, each archived
    and trimmed; a matching stream created later is archived by the next run."""
    from pipeline import keys

    day = timedelta(days=1)
    names = ["pat:a", "pat:b"]

    def write(name: str, days: int) -> list[str]:
        ids = [f"{sc.START_MS + days * 86_400_000 + 1000 * i}-0" for i in range(1, 4)]
        for entry_id in ids:
            lake_redis.xadd(keys.stream(name), {b"n": entry_id.encode()}, id=entry_id)
        return ids

    ids = {name: write(name, 5) for name in names}
    lake = str(tmp_path / "lake")
    env = {
        "SLUICE_REDIS_URL": lake_redis_url,
        "SLUICE_LAKE_URI": lake,
        "SLUICE_STREAMS": "pat:*",
        "SLUICE_CHAIN_STREAMS": "",
        "SLUICE_HOT_RETENTION_S": "3600",
    }
    try:
        run = dag_runner.run("sluice_archive", sc.END + 5 * day, env=env)
        states = task_states(run)
        assert str(run.state) == "success", states
        assert states["archive[0]"] == "success" and "archive[1]" not in states, states
        assert states["trim[-1]"] == "success", states
        rows = sc.table_rows(lake, "archive_log")
        assert sorted((r["stream"], r["entries"]) for r in rows) == [(n, 3) for n in names]
        # trimmed below what the lake holds (all of it: older than the hot window)
        assert [lake_redis.xlen(keys.stream(n)) for n in names] == [0, 0]
        # a stream created after the first run is picked up by the next one
        ids["pat:c"] = write("pat:c", 6)
        run = dag_runner.run("sluice_archive", sc.END + 6 * day, env=env)
        assert str(run.state) == "success", task_states(run)
        rows = sc.table_rows(lake, "archive_log")
        assert sorted(r["stream"] for r in rows if r["entries"]) == [*names, "pat:c"]
    finally:
        lake_redis.delete(*(keys.stream(n) for n in [*names, "pat:c"]))
    entries = sc.table_rows(lake, "stream_entries")
    assert sorted(r["entry_id"] for r in entries) == sorted(i for v in ids.values() for i in v)


def test_each_streams_archive_and_trim_result_is_visible_per_stream(archived: Any) -> None:
    """The shared jobs' results stay visible per stream: each mapped archive task's XCom
    is its stream's, the trim task's XCom has each stream's result, and each stream's
    outcome has its own log line."""
    published = archived["published_first"]
    assert [r["stream"] for r in published["archived"]] == [sc.CHAIN, sc.PLAIN]
    assert all(r["entries"] > 0 and "error" not in r for r in published["archived"])
    # run 1 trimmed nothing (everything inside the hot window), each stream says so itself
    assert [(r["stream"], r["trimmed"]) for r in published["trimmed"]] == [
        (sc.CHAIN, 0), (sc.PLAIN, 0),
    ]  # fmt: skip
    lines = [m for _, m in archived["records_first"]]
    for stream in (sc.CHAIN, sc.PLAIN):
        assert any(m.startswith(f"stream {stream}: archived by archive_streams") for m in lines)
        assert any(m.startswith(f"stream {stream}: trimmed 0 entries") for m in lines)
