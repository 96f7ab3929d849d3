"""The Spark writer's read of an interval: the ``redis-streams`` read, cached, and what it holds.

:func:`read_interval` reads the interval through the data source
(:mod:`pipeline.lake.spark.source`) in as many partitions as its size needs
(:func:`read_partitions`); :func:`keep` caches it on disk for the writes of
:mod:`pipeline.lake.write.sparkwrite` and :func:`release` drops it after;
:func:`scan` tells the driver what it holds with aggregates only (the driver
never collects the read's rows).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from pipeline.lake.spark import source
from pipeline.lake.spark.session import is_connect
from pipeline.lake.storage.intervalstats import MAX_REPORTED_INVALID, Stats
from pipeline.settings import Settings

log = logging.getLogger(__name__)

#: Entries a task of the Spark writer reads, caches and writes, at most (as estimated by
#: :func:`read_partitions`): the Delta write sorts each task's rows by the table's partition
#: column on the heap, beside Parquet's row-group buffers, and 1.5M entries a task ran a
#: 1g local driver out of heap (3M entries in 12 or 16 tasks passed).
MAX_TASK_ENTRIES = 250_000


def read_interval(
    spark: Any, settings: Settings, key: str, start_ms: int, end_ms: int, chain: bool
) -> Any:
    """The interval's entries as read by the ``redis-streams`` source (block payloads split off)."""
    source.register(spark)
    partitions = read_partitions(settings, key, start_ms, end_ms)
    return (
        spark.read.format(source.NAME)
        .option("url", settings.redis.url)
        .option("key", key)
        .option("start", f"{start_ms}-0")
        .option("end", f"{end_ms}-0")
        .option("partitions", str(partitions))
        .option("chain", "true" if chain else "false")
        .option("splitPayload", "true" if chain else "false")
        .load()
    )


def read_partitions(settings: Settings, key: str, start_ms: int, end_ms: int) -> int:
    """``settings.lake.archive_partitions``, or more when the interval holds more than
    :data:`MAX_TASK_ENTRIES` entries a partition by the stream's mean density
    (``XINFO STREAM``: its length over the span of its ids; a burst in a long quiet
    stream is underestimated)."""
    from pipeline.lake.intake.redisread import connect

    client = connect(settings.redis.url)
    try:
        info = client.xinfo_stream(key)
    finally:
        client.close()
    first, last = info.get("first-entry"), info.get("last-entry")
    if not first or not last:
        return settings.lake.archive_partitions
    return partitions_for(
        int(info["length"]),
        int(first[0].split(b"-")[0]),
        int(last[0].split(b"-")[0]),
        start_ms,
        end_ms,
        settings.lake.archive_partitions,
    )


def partitions_for(
    length: int, first_ms: int, last_ms: int, start_ms: int, end_ms: int, least: int
) -> int:
    """Partitions for ``[start_ms, end_ms)`` of a stream of ``length`` entries with ids from
    ``first_ms`` to ``last_ms``: at least ``least``, at most :data:`source.MAX_PARTITIONS`."""
    overlap = min(end_ms, last_ms + 1) - max(start_ms, first_ms)
    if length <= 0 or overlap <= 0:
        return least
    estimate = min(length, -(-length * overlap // (last_ms - first_ms + 1)))
    wanted = -(-estimate // MAX_TASK_ENTRIES)
    return max(least, min(wanted, source.MAX_PARTITIONS))


def keep(spark: Any, frame: Any) -> Any:
    """``frame`` cached on local disk for the plans that follow (lazily, unless under
    Spark Connect).

    On disk only: a cache level that tries memory first unrolls each partition in
    the heap before it spills (260 MiB a partition before it gave up), and a
    3M-entry read ran a 1g local driver out of heap that way; from disk (the page
    cache, mostly) each use streams batch by batch.
    """
    from pyspark import StorageLevel

    # Under Spark Connect a persisted Python data source read is not matched by the
    # next plans (each re-reads Redis); a local checkpoint is, in both modes.
    if is_connect(spark):
        return frame.localCheckpoint(storageLevel=StorageLevel.DISK_ONLY)
    return frame.persist(StorageLevel.DISK_ONLY)


def scan(raw: Any) -> tuple[Stats, int]:
    """What the read holds (as :func:`~pipeline.lake.storage.intervalstats.stats_of` counts it),
    and :func:`_repeats` of it (0 when every valid hash is distinct).

    An aggregate (the first job over the cached read: it reads Redis), the
    repeated-hash count and, when there are invalid entries, a ``limit`` of their
    first ids: the driver gets a few rows whatever the interval's size.
    """
    from pyspark.sql import functions as F

    valid = F.col("valid_block")
    order = F.struct("entry_ms", "entry_seq", "entry_id")  # min/max: the first and last entry
    row = raw.agg(
        F.count(F.lit(1)).alias("entries"),
        F.count_if(valid).alias("blocks"),
        F.count_if(~valid).alias("invalid"),
        F.min(F.when(valid, F.col("block_num"))).alias("lo"),
        F.max(F.when(valid, F.col("block_num"))).alias("hi"),
        F.min(order).alias("first"),
        F.max(order).alias("last"),
    ).collect()[0]
    if not row["entries"]:
        return Stats(0, 0, 0, (), None, None, None, None), 0
    repeats = _repeats(raw) if row["blocks"] else 0
    invalid_ids: tuple[str, ...] = ()
    if row["invalid"]:
        first_bad = (
            raw.where(~valid)
            .orderBy("entry_ms", "entry_seq")
            .limit(MAX_REPORTED_INVALID)
            .select("entry_id")
            .collect()
        )
        invalid_ids = tuple(r["entry_id"] for r in first_bad)
    stats = Stats(
        entries=int(row["entries"]),
        blocks=int(row["blocks"]),
        invalid=int(row["invalid"]),
        invalid_ids=invalid_ids,
        lo=row["lo"],
        hi=row["hi"],
        first_id=row["first"]["entry_id"],
        last_id=row["last"]["entry_id"],
    )
    return stats, repeats


#: Partitions of the repeated-hash check: each Python task holds 8 bytes per valid
#: entry of its share (3M entries: ~3 MB a task).
REPEAT_PARTITIONS = 8


def _repeats(raw: Any) -> int:
    """How many valid entries of ``raw`` repeat an earlier 64-bit key of their hash
    (0 when every hash is distinct; > 0 also on a key collision, which only costs the
    exact marks of :func:`~pipeline.lake.write.sparkwrite._plan_blocks`, which then find none).

    The keys are shuffled by value and counted in Python tasks. (A Spark distinct
    count keeps a hash map of every key of its input partition on the JVM heap: at
    3M entries in two partitions it ran a 1g local driver out of heap.)
    """
    from pyspark.sql import functions as F

    keys = (
        raw.where(F.col("valid_block"))
        .select(F.xxhash64("block_hash").alias("key"))
        .repartition(REPEAT_PARTITIONS, "key")
    )
    total = keys.mapInArrow(count_repeats, "repeats BIGINT").agg(F.sum("repeats")).collect()
    return int(total[0][0] or 0)


def count_repeats(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body: one row, the keys of this partition minus its distinct keys."""
    import numpy as np

    parts = [batch.column(0).to_numpy(zero_copy_only=False) for batch in batches]
    keys = np.concatenate(parts) if parts else np.empty(0, np.int64)
    repeats = len(keys) - len(np.unique(keys))
    yield pa.RecordBatch.from_pydict({"repeats": pa.array([repeats], pa.int64())})


def release(raw: Any) -> None:
    """Drop a cached frame (the read, the marks); a session that is already gone took its
    cache with it.

    (A local checkpoint is freed when its DataFrame is garbage-collected.)
    """
    try:
        raw.unpersist()
    except Exception as exc:  # noqa: BLE001 (cleanup: the job's own error, if any, propagates)
        log.debug("could not release the cached read: %s", exc)
