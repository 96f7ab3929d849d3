"""The archive's Arrow write path: Spark schedules, tasks write Parquet, the driver commits.

This is the shape of Spark's own file writers (``FileFormatWriter``, Delta's
``TransactionalWrite``): each task writes its data files and reports them,
and the driver commits all of them in one atomic Delta commit per table.
What differs is only who writes: a task here reads its id range from Redis
(:func:`~pipeline.lake.intake.redisread.read_raw_pages`), decodes block heads
(:func:`~pipeline.lake.spark.source.raw_to_batch`) and writes the rows of
``stream_entries`` and ``blocks`` with pyarrow, Arrow end to end, so no row
is converted to the JVM, cached, or written by parquet-mr (that path tops out
near 50k entries/s on two cores). Spark still places the tasks, one id range
per task (``settings.lake.archive_partitions``), on whatever executors the
session has, so a cluster scales the work out.

Theory of operation, for one interval:

1. The driver splits the ids Redis holds in the interval into ranges of
   about as many busy millisecond slices each (probed with ``XRANGE .. COUNT 1``:
   an interval whose entries came in a burst still gets a range per task,
   :func:`~pipeline.lake.intake.redisread.balanced_ranges`) and runs one Spark task per
   range (``spark.range(n, numPartitions=n).mapInArrow(...)``).
2. Each task writes at most one file per table, named like Delta's own
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

import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.lake.intake.redisread import StreamId, balanced_ranges, bounds, connect
from pipeline.lake.storage import tables
from pipeline.lake.write.blockplan import FirstSeen, prefix_keys, restore_blocks

log = logging.getLogger(__name__)

#: Rows buffered per Parquet row group (pages are 5,000 entries: fewer, larger groups).
ROW_GROUP_ROWS = 65_536
#: Invalid entry ids a task reports (the archive reports at most 100 in all).
MAX_INVALID_IDS = 100
#: Entries of the interval just before a chain task's range whose hashes the task takes
#: as seen: a repeat right after its first entry (a producer's retried XADD) is then
#: settled in the task even across a range boundary (no file rewrite by the driver).
LOOKBACK = 64

#: One row per task (per id range), see :func:`write_ranges`.
RESULT_DDL = (
    "idx BIGINT, entries_path STRING, entries_size BIGINT, entries_stats STRING, "
    "blocks_path STRING, blocks_size BIGINT, blocks_stats STRING, mtime BIGINT, "
    "entries BIGINT, valid BIGINT, invalid BIGINT, invalid_ids STRING, first_id STRING, "
    "last_id STRING, num_lo BIGINT, num_hi BIGINT, hash_keys BINARY, "
    "read_s DOUBLE, decode_s DOUBLE, write_s DOUBLE, task_s DOUBLE"
)
RESULT_ARROW = pa.schema(
    [
        ("idx", pa.int64()),
        ("entries_path", pa.string()),
        ("entries_size", pa.int64()),
        ("entries_stats", pa.string()),
        ("blocks_path", pa.string()),
        ("blocks_size", pa.int64()),
        ("blocks_stats", pa.string()),
        ("mtime", pa.int64()),
        ("entries", pa.int64()),
        ("valid", pa.int64()),
        ("invalid", pa.int64()),
        ("invalid_ids", pa.string()),
        ("first_id", pa.string()),
        ("last_id", pa.string()),
        ("num_lo", pa.int64()),
        ("num_hi", pa.int64()),
        ("hash_keys", pa.binary()),
        ("read_s", pa.float64()),
        ("decode_s", pa.float64()),
        ("write_s", pa.float64()),
        ("task_s", pa.float64()),
    ]
)

#: The data columns of each table's files (the partition column ``stream`` is in the path).
ENTRIES_FILE = pa.schema([f for f in tables.STREAM_ENTRIES_ARROW if f.name != "stream"])
BLOCKS_FILE = pa.schema([f for f in tables.BLOCKS_TABLE_ARROW if f.name != "stream"])
PARTITION_COLUMN = "stream"

# Characters Spark escapes in a partition directory name (ExternalCatalogUtils.escapePathName).
_ESCAPED = frozenset("\"#%'*/:=?\\\x7f{[]^") | frozenset(chr(c) for c in range(1, 32))


def partition_dir(stream: str) -> str:
    """``stream=<name>`` with the characters Spark escapes as ``%XX``, as Spark names it."""
    name = "".join(f"%{ord(c):02X}" if c in _ESCAPED else c for c in stream)
    return f"{PARTITION_COLUMN}={name}"


@dataclass(frozen=True, slots=True)
class WriteTask:
    """Everything a task needs, pickled to the executors with :func:`write_ranges`."""

    url: str
    key: str
    chain: bool
    page: int
    archived_at_us: int
    #: directories of the stream's partition in each table, as paths of :attr:`storage`'s
    #: filesystem (local paths, or ``bucket/key`` on object storage)
    entries_dir: str
    blocks_dir: str
    ranges: tuple[tuple[StreamId, StreamId], ...]
    #: the stream's partition directory (``stream=<escaped name>``)
    partition: str = ""
    #: delta-rs storage options of an object-store lake (empty: local files)
    storage: dict[str, str] = field(default_factory=dict, repr=False)


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
            else balanced_ranges(client, options.key, *found, options.partitions)
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
        entries_dir=f"{_fs_path(options.entries_table)}/{part}",
        blocks_dir=f"{_fs_path(options.blocks_table)}/{part}",
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
    fs = _filesystem(storage_options or {})
    stats = tables.STATS_COLUMNS[name].split(",")
    out = _File(f"{_fs_path(table_uri)}/{part}", 0, schema, stats, fs)
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
    fs = _filesystem(storage_options or {})
    for f in files:
        try:
            fs.delete_file(f"{_fs_path(table_uri)}/{f.path}")
        except OSError as exc:
            log.debug("could not delete uncommitted %s: %s", f.path, exc)


def _fs_path(uri: str) -> str:
    """A table URI as a path of its pyarrow filesystem (``s3://b/k`` -> ``b/k``)."""
    _, sep, rest = uri.partition("://")
    return rest.rstrip("/") if sep else uri.rstrip("/")


def _filesystem(storage: dict[str, str]) -> Any:
    """The pyarrow filesystem files are written to: local, or the lake's object store."""
    import pyarrow.fs as pafs

    from pipeline.lake.storage.store import s3_filesystem

    return s3_filesystem(storage) if storage else pafs.LocalFileSystem()


# --- the tasks --------------------------------------------------------------------


def write_ranges(task: WriteTask, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body: each input row's ``id`` names a range of ``task`` to write."""
    for batch in batches:
        for index in batch.column(0).to_pylist():
            yield _write_range(task, int(index))


class _File:
    """One Parquet file being written: buffered row groups and running Delta stats.

    ``fs``: the pyarrow filesystem ``directory`` is a path of (default: local files).
    """

    def __init__(
        self, directory: str, index: int, schema: pa.Schema, stats: list[str], fs: Any = None
    ) -> None:
        import pyarrow.fs as pafs

        self.fs = fs if fs is not None else pafs.LocalFileSystem()
        if isinstance(self.fs, pafs.LocalFileSystem):
            os.makedirs(directory, exist_ok=True)  # object stores have no directories
        self.name = f"part-{index:05d}-{uuid.uuid4()}.c000.snappy.parquet"
        self.path = f"{directory.rstrip('/')}/{self.name}"
        self.schema = schema
        self.stats = stats
        self.rows = 0
        self.mins: dict[str, Any] = {}
        self.maxs: dict[str, Any] = {}
        self.nulls = dict.fromkeys(stats, 0)
        self.buffer: list[pa.RecordBatch] = []
        self.buffered = 0
        self.writer: Any = None

    def add(self, batch: pa.RecordBatch) -> None:
        if not batch.num_rows:
            return
        for name in self.stats:
            column = batch.column(name)
            self.nulls[name] += column.null_count
            low, high = pc.min_max(column).values()
            if low.is_valid:
                lo, hi = low.as_py(), high.as_py()
                self.mins[name] = min(self.mins.get(name, lo), lo)
                self.maxs[name] = max(self.maxs.get(name, hi), hi)
        self.rows += batch.num_rows
        self.buffer.append(batch)
        self.buffered += batch.num_rows
        if self.buffered >= ROW_GROUP_ROWS:
            self._flush()

    def _flush(self) -> None:
        import pyarrow.parquet as pq

        if not self.buffer:
            return
        if self.writer is None:
            self.writer = pq.ParquetWriter(
                self.path,
                self.schema,
                filesystem=self.fs,
                compression="snappy",
                # Lake columns are mostly unique (hashes, ids, payloads): dictionaries only cost.
                use_dictionary=False,
                write_statistics=self.stats,
            )
        table = pa.Table.from_batches(self.buffer, self.schema)
        self.writer.write_table(table, row_group_size=max(table.num_rows, 1))
        self.buffer = []
        self.buffered = 0

    def close(self) -> None:
        self._flush()
        if self.writer is not None:
            self.writer.close()

    def remove(self) -> None:
        if self.writer is not None:
            self.writer.close()
        with contextlib.suppress(OSError):
            self.fs.delete_file(self.path)

    def report(self, prefix: str) -> dict[str, Any]:
        """``<prefix>_path`` (file name), ``_size`` and ``_stats`` of the closed file, or nulls."""
        if self.writer is None:  # nothing written
            return dict.fromkeys([f"{prefix}_path", f"{prefix}_size", f"{prefix}_stats"])
        return {
            f"{prefix}_path": self.name,
            f"{prefix}_size": self.fs.get_file_info(self.path).size,
            f"{prefix}_stats": self.delta_stats(),
        }

    def delta_stats(self) -> str:
        return json.dumps(
            {
                "numRecords": self.rows,
                "minValues": self.mins,
                "maxValues": self.maxs,
                "nullCount": self.nulls,
            },
            separators=(",", ":"),
        )


def _write_range(task: WriteTask, index: int) -> pa.RecordBatch:
    from pipeline.lake.intake.blockhead import HeadReader
    from pipeline.lake.intake.redisread import raw_connect, read_raw_before, read_raw_pages
    from pipeline.lake.spark.source import raw_to_batch

    began_task = time.perf_counter()
    lo, hi = task.ranges[index]
    archived_at = pa.scalar(task.archived_at_us, pa.timestamp("us", tz="UTC"))
    fs = _filesystem(task.storage)
    entries_file = _File(
        task.entries_dir,
        index,
        ENTRIES_FILE,
        tables.STATS_COLUMNS[tables.STREAM_ENTRIES].split(","),
        fs,
    )
    blocks_file = _File(
        task.blocks_dir, index, BLOCKS_FILE, tables.STATS_COLUMNS[tables.BLOCKS].split(","), fs
    )
    heads = HeadReader()
    seen = FirstSeen()
    entries = valid = invalid = 0
    invalid_ids: list[str] = []
    first_id = last_id = None
    num_lo: int | None = None
    num_hi: int | None = None
    hash_keys: list[np.ndarray[Any, Any]] = []
    read_s = decode_s = write_s = 0.0
    client = raw_connect(task.url)
    try:
        if task.chain:
            before = read_raw_before(client, task.key, lo, task.ranges[0][0], LOOKBACK)
            if before:
                tail = raw_to_batch(before, True, split=True, heads=heads)
                flags = pc.fill_null(tail.column("valid_block"), False)
                seen.first(tail.column("block_hash"), flags.to_numpy(zero_copy_only=False))
        pages = read_raw_pages(client, task.key, lo, hi, task.page)
        while True:
            began = time.perf_counter()
            page = next(pages, None)
            read_s += time.perf_counter() - began
            if page is None:
                break
            began = time.perf_counter()
            batch = raw_to_batch(page, task.chain, split=task.chain, heads=heads)
            keep = None
            if task.chain:
                # A hash's row is written once, from its first entry (repeats within the
                # window); a repeat keeps its block in its fields (as blockplan.plan does).
                flags = pc.fill_null(batch.column("valid_block"), False)
                flags_np = flags.to_numpy(zero_copy_only=False)
                keep = seen.first(batch.column("block_hash"), flags_np)
                repeat = flags_np & ~keep
                if repeat.any():
                    fields = restore_blocks(batch, pa.array(repeat))
                    batch = batch.set_column(
                        batch.schema.get_field_index("fields"), "fields", fields
                    )
            rows = entry_rows(batch, archived_at)
            decoded = time.perf_counter()
            decode_s += decoded - began
            entries += batch.num_rows
            ids = batch.column("entry_id")
            first_id = first_id or ids[0].as_py()
            last_id = ids[-1].as_py()
            entries_file.add(rows)
            if keep is not None:
                n_valid = int(np.count_nonzero(flags_np))
                valid += n_valid
                invalid += batch.num_rows - n_valid
                if len(invalid_ids) < MAX_INVALID_IDS and n_valid < batch.num_rows:
                    bad = ids.filter(pc.invert(flags)).slice(0, MAX_INVALID_IDS)
                    invalid_ids.extend(bad.to_pylist()[: MAX_INVALID_IDS - len(invalid_ids)])
                if n_valid:
                    low, high = pc.min_max(batch.column("block_num")).values()  # valid entries'
                    num_lo = low.as_py() if num_lo is None else min(num_lo, low.as_py())
                    num_hi = high.as_py() if num_hi is None else max(num_hi, high.as_py())
                firsts = batch.filter(pa.array(keep))
                if firsts.num_rows:
                    hash_keys.append(_hash_keys(firsts.column("block_hash")))
                    blocks_file.add(block_rows(firsts, archived_at))
            write_s += time.perf_counter() - decoded
        began = time.perf_counter()
        entries_file.close()
        blocks_file.close()
        write_s += time.perf_counter() - began
    except BaseException:
        entries_file.remove()
        blocks_file.remove()
        raise
    finally:
        client.close()
    keys = np.sort(np.concatenate(hash_keys)) if hash_keys else np.empty(0, np.uint64)
    row = {
        "idx": index,
        **entries_file.report("entries"),
        **blocks_file.report("blocks"),
        "mtime": int(time.time() * 1000),
        "entries": entries,
        "valid": valid,
        "invalid": invalid,
        "invalid_ids": json.dumps(invalid_ids),
        "first_id": first_id,
        "last_id": last_id,
        "num_lo": num_lo,
        "num_hi": num_hi,
        "hash_keys": keys.tobytes(),
        "read_s": read_s,
        "decode_s": decode_s,
        "write_s": write_s,
        "task_s": time.perf_counter() - began_task,
    }
    return pa.RecordBatch.from_pylist([row], schema=RESULT_ARROW)


def entry_rows(batch: pa.RecordBatch, archived_at: pa.Scalar) -> pa.RecordBatch:
    """``stream_entries`` file rows of a :data:`pipeline.lake.spark.source.ARROW_SCHEMA` batch.

    The same values the Spark writer derives (``sparkwrite._write_entries``):
    ``payload_in_blocks = valid_block AND size(fields) = 0``, SQL's three-valued
    AND (null for a chain row cannot occur; false for plain streams). A repeat
    of a hash has its block in ``fields`` already (:func:`~pipeline.lake.write.blockplan.restore_blocks`).
    """
    fields = batch.column("fields")
    offsets = fields.offsets
    empty = pc.equal(pc.subtract(offsets[1:], offsets[:-1]), 0)
    in_blocks = pc.and_kleene(batch.column("valid_block"), empty)
    n = batch.num_rows
    return pa.RecordBatch.from_arrays(
        [
            batch.column("entry_id"),
            batch.column("entry_ms"),
            batch.column("entry_seq"),
            fields,
            batch.column("valid_block"),
            batch.column("block_num"),
            batch.column("block_hash"),
            batch.column("block_parent"),
            batch.column("block_error"),
            pa.repeat(archived_at, n),
            in_blocks,
        ],
        schema=ENTRIES_FILE,
    )


def block_rows(good: pa.RecordBatch, archived_at: pa.Scalar) -> pa.RecordBatch:
    """``blocks`` file rows of the entries of a batch that add one (``canonical = false``)."""
    n = good.num_rows
    return pa.RecordBatch.from_arrays(
        [
            good.column("block_num"),
            good.column("block_hash"),
            good.column("block_parent"),
            pa.repeat(pa.scalar(False), n),
            good.column("entry_id"),
            good.column("entry_ms"),
            good.column("payload"),
            pa.repeat(archived_at, n),
            good.column("weight"),
        ],
        schema=BLOCKS_FILE,
    )


def _hash_keys(hashes: pa.Array) -> np.ndarray[Any, Any]:
    """The first 8 bytes of each hash (64 hex digits) as uint64, for a distinctness check."""
    keys = prefix_keys(hashes)
    if keys is None:
        raise AssertionError("block hashes are 64 hex digits")  # the source checks 32 bytes
    return keys
