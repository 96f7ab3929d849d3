"""The Spark writer's repeated-hash count, run here as its Spark tasks run it."""

from __future__ import annotations

import pyarrow as pa

from pipeline.lake.sparkwrite import count_repeats


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
