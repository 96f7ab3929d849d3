"""The archive job reading a Redis Cluster: the same table rows as from one server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline import redisconn
from pipeline.lake import tables
from pipeline.redisconn import Role

from .test_arrowwrite import _archive, _fill, _rows

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
