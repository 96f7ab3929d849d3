"""The archive job reading a Redis Cluster or a Sentinel-watched master: the same table
rows as from one server, also across a master's death."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from pipeline import keys
from pipeline.errors import RedisUnavailable
from pipeline.lake.archive import archive_interval
from pipeline.lake.intake import redisread
from pipeline.lake.storage import tables
from pipeline.lake.storage.entries import read_entries
from pipeline.redisio import conn as redisconn
from pipeline.redisio.conn import Role
from pipeline.settings import LakeSettings
from tests.support.poll import until_sync

from .helpers import chain, publish, settings_for
from .test_arrowwrite import STREAM, _archive, _fill, _redis_entries, _rows

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("writer", ["arrow", "spark"])
def test_archive_from_a_cluster_writes_what_one_server_gives(
    spark: Any, redis_client: Any, redis_url: str, cluster_url: str, tmp_path: Path, writer: str
) -> None:
    _fill(redis_client)
    client = redisconn.connect_sync(cluster_url, Role.CLI)
    try:
        _fill(client)
    finally:
        client.close()
    one, many = str(tmp_path / "one"), str(tmp_path / "cluster")
    # The reference from one server is the Arrow writer's whatever ``writer`` is: the
    # Spark writer writes the same rows from one server (test_arrowwrite's
    # test_arrow_and_spark_writers_write_the_same_rows, same data, same ``_rows``), and a
    # second Spark job here would only repeat that at ~15 s a run.
    assert not _archive(spark, redis_url, one, "arrow").skipped
    assert not _archive(spark, cluster_url, many, writer).skipped
    for name in (tables.STREAM_ENTRIES, tables.BLOCKS):
        assert _rows(many, name) == _rows(one, name)
        assert _rows(many, name)  # the interval was not empty


@pytest.mark.timeout(300)
@pytest.mark.parametrize("layout", ["sentinel", "cluster"])
def test_archive_across_a_masters_death(
    spark: Any,
    redis_client: Any,
    redis_url: str,
    tmp_path: Path,
    layout: str,
    request: pytest.FixtureRequest,
) -> None:
    """Two archive runs of one stream, the stream's master killed (SIGKILL) between them,
    then the first interval archived again (forced) on the promoted replica: the tables
    hold exactly the rows one server gives for both intervals, nothing lost, nothing
    twice."""
    group = request.getfixturevalue(
        {"sentinel": "redis_sentinels", "cluster": "redis_cluster"}[layout]
    )
    url = group.ready_url()
    _fill(redis_client)
    client = redisconn.connect_sync(url, Role.CLI)
    try:
        _fill(client)
    finally:
        client.close()
    group.wait_replicated()  # what was written is the ground truth after the failover
    one, ha = str(tmp_path / "one"), str(tmp_path / "ha")

    def archive(redis: str, lake: str, start: int, end: int, **kw: Any) -> None:
        settings = settings_for(
            redis, lake, streams=(STREAM,), chain_streams=(STREAM,), archive_writer="arrow"
        )
        result = archive_interval(spark, settings, STREAM, start, end, **kw)
        assert not result.skipped

    archive(redis_url, one, 1000, 1021)
    archive(redis_url, one, 1021, 1041)
    archive(url, ha, 1000, 1021)
    dead = group.kill_master(keys.stream(STREAM)) if layout == "cluster" else group.kill_master()
    try:
        group.wait_failed_over(dead)
        archive(url, ha, 1021, 1041)
        archive(url, ha, 1000, 1021, force=True)  # a re-run after the failover
    finally:
        group.heal()
    for name in (tables.STREAM_ENTRIES, tables.BLOCKS):
        assert _rows(ha, name) == _rows(one, name)
        assert _rows(ha, name)


#: Blocks of the failover-during-a-read test: 2 tasks of 6 pages each (a page is
#: source.DEFAULT_PAGE entries), so a task has pages left to read when the master dies.
BIG = 60_000


def _xrange_calls(client: Any) -> int:
    stats = client.info("commandstats").get("cmdstat_xrange")
    return int(stats["calls"]) if stats else 0


def _driver_xranges(url: str, key: str, parts: int) -> int:
    """The ``XRANGE`` calls the archive's driver makes before its tasks read: the first id
    of the interval, then the task-range probes (:func:`redisread.probe_count`)."""
    client = redisconn.connect_sync(url, Role.CLI)
    try:
        found = redisread.bounds(client, key, (0, 0), (redisread.MAX_SEQ, redisread.MAX_SEQ))
    finally:
        client.close()
    assert found is not None
    return 1 + redisread.probe_count(*found, parts)


def _kill_mid_read(master: Any, base: int, seen: list[int]) -> None:
    """Once the archive's tasks have read a page (``XRANGE`` calls beyond the driver's,
    ``base``, and two), pause every client of ``master`` (the tasks' next page waits in
    Redis) and SIGKILL it: the read dies half done."""
    client = master.client()
    try:
        seen.append(
            until_sync(
                lambda: (n := _xrange_calls(client)) >= base + 2 and n,
                "the archive's tasks reading from the master",
                within_s=240,
                every_s=0.002,
            )
        )
        client.execute_command("CLIENT", "PAUSE", "60000", "ALL")
    finally:
        client.close()
        master.kill()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("layout", ["sentinel", "cluster"])
def test_archive_across_a_masters_death_during_the_read(
    spark: Any, tmp_path: Path, layout: str, request: pytest.FixtureRequest
) -> None:
    """The master is killed (SIGKILL) while the Arrow writer's Spark tasks are reading the
    interval. The run fails with Redis unavailable (or rides the failover out); its retry
    after the failover, as Airflow's would be, archives the interval: the lake holds every
    entry and block of the stream exactly once, nothing lost, nothing twice."""
    group = request.getfixturevalue(
        {"sentinel": "redis_sentinels", "cluster": "redis_cluster"}[layout]
    )
    url = group.ready_url()
    blocks = chain(0, BIG, size=8)
    client = redisconn.connect_sync(url, Role.CLI)
    try:
        for i in range(0, BIG, 5000):
            publish(client, STREAM, blocks[i : i + 5000], first_ms=1000 + i)
    finally:
        client.close()
    group.wait_replicated()  # what was written is the ground truth after the failover
    key = keys.stream(STREAM)
    master = group.master_of(key) if layout == "cluster" else group.master()
    lake = str(tmp_path / "ha")
    settings = settings_for(
        url, lake, streams=(STREAM,), chain_streams=(STREAM,), archive_writer="arrow"
    )
    driver = _driver_xranges(url, key, settings.lake.archive_partitions)
    watcher = master.client()
    try:
        base = _xrange_calls(watcher) + driver
    finally:
        watcher.close()
    seen: list[int] = []
    killer = threading.Thread(target=_kill_mid_read, args=(master, base, seen), daemon=True)
    killer.start()
    try:
        try:
            first = archive_interval(spark, settings, STREAM, 1000, 1000 + BIG)
        except RedisUnavailable as exc:
            first = None
            assert "Redis is unavailable (redis unavailable while reading" in str(exc), exc
        killer.join(60)
        assert seen and not killer.is_alive(), "the master was not killed during the read"
        group.wait_failed_over(master)
        if first is None:  # Airflow's retry of the failed task
            again = archive_interval(spark, settings, STREAM, 1000, 1000 + BIG)
            assert again.entries == BIG and not again.skipped
        check = redisconn.connect_sync(url, Role.CLI)
        try:
            expected = _redis_entries(check, STREAM, 1000, 1000 + BIG)
        finally:
            check.close()
    finally:
        group.heal()
    assert len(expected) == BIG  # the promoted replica had every entry
    got = list(read_entries(lake, STREAM))
    assert got == expected
    rows = DeltaTable(LakeSettings.from_url(lake).table(tables.BLOCKS)).to_pyarrow_table()
    nums = rows.column("num").to_pylist()
    assert sorted(nums) == list(range(BIG))  # every block once
