"""The lake's Redis side (XRANGE reader, archive lock) on Sentinel and on a Cluster, no Spark."""

from __future__ import annotations

import pytest

from pipeline import keys
from pipeline.errors import LockBusy
from pipeline.lake.intake import redisread
from pipeline.lake.lock import StreamLock
from pipeline.redisio import conn as redisconn
from pipeline.redisio.conn import Role
from pipeline.settings import LakeSettings

LAKE = LakeSettings.from_url("/lakes/ha")


def test_raw_reader_and_bounds_on_every_layout(any_redis_url: str) -> None:
    key = keys.stream("lake:ha")
    writer = redisconn.connect_sync(any_redis_url, Role.CLI)
    try:
        for i in range(250):
            writer.xadd(key, {"data": b"%d" % i}, id=f"1000-{i + 1}")
    finally:
        writer.close()
    client = redisread.raw_connect(any_redis_url)
    try:
        pages = list(redisread.read_raw_pages(client, key, (1000, 0), (1000, 10**6), 100))
        assert [len(p) for p in pages] == [100, 100, 50]
        assert pages[0][0] == [b"1000-1", [b"data", b"0"]]  # raw reply, not redis-py's dict
        assert redisread.bounds(client, key, (0, 0), (2000, 0)) == ((1000, 1), (1000, 250))
    finally:
        client.close()


def test_archive_lock_on_every_layout(any_redis_url: str) -> None:
    first = StreamLock(any_redis_url, "lake:ha", lake=LAKE, wait_s=0.0)
    second = StreamLock(any_redis_url, "lake:ha", lake=LAKE, wait_s=0.0)
    first.acquire()
    try:
        with pytest.raises(LockBusy, match="is locked by"):
            second.acquire()
    finally:
        first.release()
    second.acquire()
    second.release()
