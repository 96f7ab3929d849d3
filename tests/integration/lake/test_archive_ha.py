"""The archive job reading a Redis Cluster or a Sentinel-watched master: the same table
rows as from one server, also across a master's death."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline import keys, redisconn
from pipeline.lake import tables
from pipeline.lake.archive import archive_interval
from pipeline.redisconn import Role

from .helpers import settings_for
from .test_arrowwrite import STREAM, _archive, _fill, _rows

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
    assert not _archive(spark, redis_url, one, writer).skipped
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
