"""The Spark writer's repeated-hash count, run here as its Spark tasks run it."""

from __future__ import annotations

import pyarrow as pa

from pipeline.lake.write.sparkread import count_repeats


def _count(*chunks: list[int]) -> int:
    batches = [pa.RecordBatch.from_pydict({"key": pa.array(c, pa.int64())}) for c in chunks]
    (row,) = list(count_repeats(iter(batches)))
    return int(row.column(0)[0].as_py())


def test_distinct_keys_repeat_nothing() -> None:
    assert _count([1, 2, 3], [4, -5]) == 0


def test_repeats_across_batches_are_counted_once_per_extra_entry() -> None:
    assert _count([7, 7, 1], [7, 1, 2]) == 3


def test_an_empty_partition_has_no_repeats() -> None:
    assert _count() == 0
    assert _count([]) == 0


def test_partitions_grow_with_the_interval_s_estimated_entries() -> None:
    from pipeline.lake.spark.source import MAX_PARTITIONS
    from pipeline.lake.write.sparkread import MAX_TASK_ENTRIES, partitions_for

    # 1M entries over ids 0..999 ms: the whole span, half of it, none of it.
    n = 4 * MAX_TASK_ENTRIES
    assert partitions_for(n, 0, 999, 0, 1000, 2) == 4
    assert partitions_for(n * 4, 0, 999, 0, 1000, 2) == 16
    assert partitions_for(n, 0, 999, 500, 2000, 2) == 2
    assert partitions_for(n, 0, 999, 5000, 6000, 2) == 2
    assert partitions_for(10, 0, 999, 0, 1000, 3) == 3
    assert partitions_for(10**12, 0, 0, 0, 1, 2) == MAX_PARTITIONS
    assert partitions_for(0, 0, 0, 0, 1, 2) == 2
