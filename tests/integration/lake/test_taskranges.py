"""The Arrow writer's task ranges against a real Redis: an interval whose entries came in a
burst is cut where its entries are, not by milliseconds alone."""

from __future__ import annotations

from typing import Any

from pipeline import keys
from pipeline.lake.write.arrowwrite import WriteOptions, plan_task

STREAM = "bursty"


def _options(redis_url: str, partitions: int, range_entries: int = 1) -> WriteOptions:
    return WriteOptions(
        url=redis_url, key=keys.stream(STREAM), chain=False, first=(0, 0), last=(10_000, 0),
        partitions=partitions, range_entries=range_entries, page=100, entries_table="/tmp/e", blocks_table="/tmp/b",
        stream=STREAM, archived_at_us=0,
    )  # fmt: skip


def test_a_burst_is_shared_by_the_tasks(redis_client: Any, redis_url: str) -> None:
    key = keys.stream(STREAM)
    pipe = redis_client.pipeline(transaction=False)
    for seq in range(3):  # a few entries at the interval's start, then a burst 4 s later
        pipe.xadd(key, {b"a": b"1"}, id=f"1000-{seq}")
    for i in range(400):
        pipe.xadd(key, {b"a": b"1"}, id=f"{5000 + i // 2}-{i % 2}")
    pipe.execute()
    task = plan_task(_options(redis_url, 2))
    assert task is not None
    counts = [
        len(redis_client.xrange(key, f"{lo[0]}-{lo[1]}", f"{hi[0]}-{hi[1]}"))
        for lo, hi in task.ranges
    ]
    assert sum(counts) == 403 and len(counts) == 2
    assert min(counts) >= 150, counts  # by milliseconds alone: [3, 400]
    assert task.ranges[0][0] == (1000, 0) and task.ranges[-1][1] == (5199, 1)


def test_an_interval_of_few_entries_is_one_range(redis_client: Any, redis_url: str) -> None:
    """The default ``archive_range_entries`` (4,096): 403 entries are one task's work, not
    ``archive_partitions`` tasks' (1,000 small streams were written as 4,000 files)."""
    key = keys.stream(STREAM)
    pipe = redis_client.pipeline(transaction=False)
    for i in range(403):
        pipe.xadd(key, {b"a": b"1"}, id=f"{1000 + i * 20}-0")
    pipe.execute()
    task = plan_task(_options(redis_url, 4, range_entries=4096))
    assert task is not None and task.ranges == (((1000, 0), (1000 + 402 * 20, 0)),)
    assert plan_task(_options(redis_url, 4, range_entries=100)) is not None
    assert len(plan_task(_options(redis_url, 4, range_entries=100)).ranges) == 4  # type: ignore[union-attr]
