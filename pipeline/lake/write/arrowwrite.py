"""The archive's Arrow writer, its driver: plan the Spark tasks, collect their files, commit them.

This is the shape of Spark's own file writers (``FileFormatWriter``, Delta's
``TransactionalWrite``): each task writes its data files and reports them,
and the driver commits all of them in one atomic Delta commit per table.
What differs is only who writes: a task here reads its id range from Redis
(:func:`~pipeline.lake.intake.redisread.read_raw_pages`), decodes block heads
(:func:`~pipeline.lake.intake.arrowpage.raw_to_batch`) and writes the rows of
``stream_entries`` and ``blocks`` with pyarrow, Arrow end to end, so no row
is converted to the JVM, cached, or written by parquet-mr (that path tops out
near 50k entries/s on two cores). Spark still places the tasks, one id range
per task (``settings.lake.archive_partitions``), on whatever executors the
session has, so a cluster scales the work out.

Theory of operation, for one interval:

1. The driver splits the ids Redis holds in the interval into ranges (at most
   ``archive_partitions``, one per ``archive_range_entries`` entries it expects
   the interval to hold: :func:`~pipeline.lake.intake.redisread.ranges_for`) of
   about as many busy millisecond slices each (probed with ``XRANGE .. COUNT 1``:
   an interval whose entries came in a burst still gets a range per task,
   :func:`~pipeline.lake.intake.redisread.balanced_ranges`) and runs one Spark task per
   range (``spark.range(n, numPartitions=n).mapInArrow(...)``).
2. Each task (:mod:`pipeline.lake.write.arrowtask`) writes at most one file per
   table (:mod:`pipeline.lake.write.parquetfile`), named like Delta's own
   (``part-<task>-<uuid>.c000.snappy.parquet``) under the table's partition
   directory (``stream=<escaped name>``, as Spark names it), with Delta stats
   (``numRecords``, ``minValues``, ``maxValues``, ``nullCount``) of the
   columns of :data:`pipeline.lake.storage.tables.STATS_COLUMNS`, and returns one row:
   its files and what the driver needs to plan (counts, first invalid ids,
   the num range, the first 8 bytes of each valid block's hash).
3. The driver (:mod:`pipeline.lake.archive`) decides whether the files may be
   committed as they are, and then commits them with delta-rs
   (``DeltaTable.create_write_transaction``, append), or deletes them
   (:func:`discard`) and takes the Spark writer's path.

Files that are written and never committed (a job killed before its commits,
a task retried by Spark, a fallback whose delete failed) are not in the Delta
log, so no reader ever sees them. ``sluice lake maintain`` removes them: its
VACUUM runs delta-rs' full mode, which deletes every file under a table that
the log does not reference and that is older than the retention window.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa

from pipeline.lake.intake.redisread import StreamId, balanced_ranges, bounds, connect, ranges_for
from pipeline.lake.storage import tables
from pipeline.lake.write.arrowtask import (
    MAX_INVALID_IDS,
    RESULT_ARROW,
    RESULT_DDL,
    WriteTask,
    write_ranges,
)
from pipeline.lake.write.filerows import BLOCKS_FILE, ENTRIES_FILE
from pipeline.lake.write.parquetfile import (
    PARTITION_COLUMN,
    PartFile,
    filesystem,
    fs_path,
    partition_dir,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DataFile:
    """One written, not yet committed, data file."""

    #: path relative to the table root (plain, not URI-encoded: delta-rs encodes it)
    path: str
    size: int
    mtime_ms: int
    stats: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Written:
    """What the tasks wrote and read, for the driver to decide on and commit."""

    entries_files: tuple[DataFile, ...]
    blocks_files: tuple[DataFile, ...]
    entries: int
    blocks: int
    invalid: int
    invalid_ids: tuple[str, ...]
    first_id: str | None
    last_id: str | None
    num_lo: int | None
    num_hi: int | None
    #: True when the hashes of the written ``blocks`` rows are pairwise distinct (by their
    #: first 8 bytes: two different hashes sharing them make this False, which only costs
    #: a check). A task writes a hash's row once for repeats within its window (FirstSeen).
    distinct: bool
    #: mean seconds per task spent reading Redis, decoding, and writing files, and the
    #: wall seconds of the slowest task
    stages: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class WriteOptions:
    """One stream's interval for the Arrow writer: ids ``[first, last]`` (inclusive) of ``key``."""

    url: str
    key: str
    chain: bool
    first: StreamId
    last: StreamId
    partitions: int
    #: entries a range is planned for (``archive_range_entries``)
    range_entries: int
    page: int
    entries_table: str
    blocks_table: str
    stream: str
    archived_at_us: int
    storage_options: dict[str, str] | None = None


def write_files(spark: Any, options: WriteOptions) -> Written:
    """Read the interval of ``options`` in Spark tasks and write their files.

    Nothing is committed: hand the result to :func:`commit` or :func:`discard`.
    (:class:`pipeline.lake.write.arrowbatch.SharedWrites` takes the same arguments and
    runs one Spark job for the intervals of several streams.)
    """
    task = plan_task(options)
    if task is None:
        return nothing_written()
    n = len(task.ranges)
    rows = spark.range(0, n, 1, n).mapInArrow(partial(write_ranges, task), RESULT_DDL).toArrow()
    return collect(rows.cast(RESULT_ARROW), partition_dir(options.stream))


def plan_task(options: WriteOptions) -> WriteTask | None:
    """The Spark tasks' work for the interval of ``options`` (None: Redis holds none of it)."""
    client = connect(options.url)
    try:
        found = bounds(client, options.key, options.first, options.last)
        ranges = (
            [] if found is None
            else balanced_ranges(
                client, options.key, *found,
                ranges_for(
                    client, options.key, *found, options.partitions, options.range_entries
                ),
            )
        )  # fmt: skip
    finally:
        client.close()
    if found is None:
        return None
    part = partition_dir(options.stream)
    return WriteTask(
        url=options.url,
        key=options.key,
        chain=options.chain,
        page=options.page,
        archived_at_us=options.archived_at_us,
        entries_dir=f"{fs_path(options.entries_table)}/{part}",
        blocks_dir=f"{fs_path(options.blocks_table)}/{part}",
        ranges=tuple(ranges),
        partition=part,
        storage=dict(options.storage_options or {}),
    )


def nothing_written() -> Written:
    """What :func:`write_files` returns for an id range Redis holds nothing of."""
    return collect(pa.table({name: [] for name in RESULT_ARROW.names}, schema=RESULT_ARROW))


def collect(rows: pa.Table, part: str = "") -> Written:
    """The :class:`Written` of one stream's task rows (:data:`RESULT_ARROW`)."""
    rows = rows.sort_by("idx")
    docs = rows.to_pylist()
    entries_files = tuple(
        DataFile(f"{part}/{d['entries_path']}", d["entries_size"], d["mtime"], d["entries_stats"])
        for d in docs
        if d["entries_path"]
    )
    blocks_files = tuple(
        DataFile(f"{part}/{d['blocks_path']}", d["blocks_size"], d["mtime"], d["blocks_stats"])
        for d in docs
        if d["blocks_path"]
    )
    invalid_ids: list[str] = []
    for d in docs:
        invalid_ids.extend(json.loads(d["invalid_ids"] or "[]"))
    lows = [d["num_lo"] for d in docs if d["num_lo"] is not None]
    highs = [d["num_hi"] for d in docs if d["num_hi"] is not None]
    # Each task sent its keys sorted: a stable sort of the runs is a merge.
    keys = [np.frombuffer(d["hash_keys"] or b"", dtype=np.uint64) for d in docs]
    every = np.sort(np.concatenate(keys), kind="stable") if keys else np.empty(0, np.uint64)
    blocks = sum(d["valid"] for d in docs)
    nonempty = [d for d in docs if d["entries"]]
    tasks = max(1, len(docs))
    return Written(
        entries_files=entries_files,
        blocks_files=blocks_files,
        entries=sum(d["entries"] for d in docs),
        blocks=blocks,
        invalid=sum(d["invalid"] for d in docs),
        invalid_ids=tuple(invalid_ids[:MAX_INVALID_IDS]),
        first_id=nonempty[0]["first_id"] if nonempty else None,
        last_id=nonempty[-1]["last_id"] if nonempty else None,
        num_lo=min(lows) if lows else None,
        num_hi=max(highs) if highs else None,
        distinct=not bool(np.any(every[1:] == every[:-1])),
        stages={
            **{
                name: round(sum(d[f"{name}_s"] for d in docs) / tasks, 3)
                for name in ("read", "decode", "write")
            },
            "slowest_task": round(max((d["task_s"] for d in docs), default=0.0), 3),
        },
    )


def write_file(
    table_uri: str,
    name: str,
    stream: str,
    rows: pa.Table,
    storage_options: dict[str, str] | None = None,
) -> DataFile | None:
    """Write ``rows`` (file rows of table ``name``: no partition column) of ``stream`` as one
    data file of the table at ``table_uri``, with its declared types and Delta statistics.

    Not committed (:func:`commit`); None when there is no row.
    """
    if not rows.num_rows:
        return None
    schema = ENTRIES_FILE if name == tables.STREAM_ENTRIES else BLOCKS_FILE
    part = partition_dir(stream)
    fs = filesystem(storage_options or {})
    stats = tables.STATS_COLUMNS[name].split(",")
    out = PartFile(f"{fs_path(table_uri)}/{part}", 0, schema, stats, fs)
    try:
        for batch in rows.select(schema.names).cast(schema).to_batches():
            out.add(batch)
        out.close()
    except BaseException:
        out.remove()
        raise
    report = out.report("file")
    return DataFile(
        f"{part}/{out.name}", int(report["file_size"]), int(time.time() * 1000),
        report["file_stats"],
    )  # fmt: skip


def commit(
    table_uri: str,
    files: tuple[DataFile, ...],
    stream: str,
    storage_options: dict[str, str] | None = None,
) -> None:
    """Add ``files`` to the Delta table at ``table_uri`` in one atomic append commit.

    A commit that lost a race to another writer's commit of the same version
    (a local rename that found the file, or an S3 conditional put that found
    the object) is retried on the new version by :func:`~pipeline.lake.write.jobs.delta_retry`.
    """
    commit_many(table_uri, [(files, stream)], storage_options)


def commit_many(
    table_uri: str,
    items: list[tuple[tuple[DataFile, ...], str]],
    storage_options: dict[str, str] | None = None,
) -> None:
    """:func:`commit` of the ``(files, stream)`` of several streams in one atomic commit."""
    from deltalake import DeltaTable
    from deltalake.transaction import AddAction, RemoveAction

    from pipeline.lake.write.jobs import delta_retry

    actions: list[AddAction | RemoveAction] = [
        AddAction(f.path, f.size, {PARTITION_COLUMN: stream}, f.mtime_ms, True, f.stats)
        for files, stream in items
        for f in files
    ]
    if not actions:
        return

    def append() -> None:
        table = DeltaTable(table_uri, storage_options=storage_options)
        table.create_write_transaction(
            actions, mode="append", schema=table.schema(), partition_by=[PARTITION_COLUMN]
        )

    delta_retry(f"commit of {len(actions)} files to {table_uri}", append)


def discard(
    table_uri: str, files: tuple[DataFile, ...], storage_options: dict[str, str] | None = None
) -> None:
    """Delete uncommitted ``files`` (best effort: maintenance's VACUUM removes any left)."""
    fs = filesystem(storage_options or {})
    for f in files:
        try:
            fs.delete_file(f"{fs_path(table_uri)}/{f.path}")
        except OSError as exc:
            log.debug("could not delete uncommitted %s: %s", f.path, exc)
