"""One Spark task of the Arrow writer: read an id range from Redis, decode it, write both tables' files.

Step 2 of :mod:`pipeline.lake.write.arrowwrite`'s theory of operation. A task
(:func:`write_ranges`, the body of ``mapInArrow``) reads its range with paged
raw ``XRANGE``, decodes each page to Arrow
(:func:`~pipeline.lake.intake.arrowpage.raw_to_batch`), writes at most one
file per table (:class:`~pipeline.lake.write.parquetfile.PartFile`) and
returns one row of :data:`RESULT_ARROW`: its files and what the driver needs
to plan (counts, first invalid ids, the num range, the first 8 bytes of each
valid block's hash). A file of a task that fails is removed; nothing is
committed here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.lake.intake.arrowpage import raw_to_batch
from pipeline.lake.intake.blockhead import HeadReader
from pipeline.lake.intake.redisread import StreamId, raw_connect, read_raw_before, read_raw_pages
from pipeline.lake.storage import tables
from pipeline.lake.write.blockplan import FirstSeen, prefix_keys, restore_blocks
from pipeline.lake.write.filerows import BLOCKS_FILE, ENTRIES_FILE, block_rows, entry_rows
from pipeline.lake.write.parquetfile import PartFile, filesystem

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


def write_ranges(task: WriteTask, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body: each input row's ``id`` names a range of ``task`` to write."""
    for batch in batches:
        for index in batch.column(0).to_pylist():
            yield _write_range(task, int(index))


@dataclass(slots=True)
class _Files:
    """A task's two files: ``stream_entries`` rows and ``blocks`` rows."""

    entries: PartFile
    blocks: PartFile

    @classmethod
    def open(cls, task: WriteTask, index: int) -> _Files:
        fs = filesystem(task.storage)

        def stats(name: str) -> list[str]:
            return tables.STATS_COLUMNS[name].split(",")

        return cls(
            PartFile(task.entries_dir, index, ENTRIES_FILE, stats(tables.STREAM_ENTRIES), fs),
            PartFile(task.blocks_dir, index, BLOCKS_FILE, stats(tables.BLOCKS), fs),
        )

    def close(self) -> None:
        self.entries.close()
        self.blocks.close()

    def remove(self) -> None:
        self.entries.remove()
        self.blocks.remove()


@dataclass(slots=True)
class _Tally:
    """What a task read and wrote so far: the fields of its :data:`RESULT_ARROW` row."""

    entries: int = 0
    valid: int = 0
    invalid: int = 0
    invalid_ids: list[str] = field(default_factory=list)
    first_id: str | None = None
    last_id: str | None = None
    num_lo: int | None = None
    num_hi: int | None = None
    hash_keys: list[np.ndarray[Any, Any]] = field(default_factory=list)
    read_s: float = 0.0
    decode_s: float = 0.0
    write_s: float = 0.0

    def count_entries(self, ids: pa.Array) -> None:
        self.entries += len(ids)
        self.first_id = self.first_id or ids[0].as_py()
        self.last_id = ids[-1].as_py()

    def count_blocks(self, batch: pa.RecordBatch, flags: pa.Array, flags_np: Any) -> None:
        """Count the valid and invalid entries of a chain ``batch`` (``flags``: valid_block)."""
        n_valid = int(np.count_nonzero(flags_np))
        self.valid += n_valid
        self.invalid += batch.num_rows - n_valid
        if len(self.invalid_ids) < MAX_INVALID_IDS and n_valid < batch.num_rows:
            ids = batch.column("entry_id")
            bad = ids.filter(pc.invert(flags)).slice(0, MAX_INVALID_IDS)
            self.invalid_ids.extend(bad.to_pylist()[: MAX_INVALID_IDS - len(self.invalid_ids)])
        if n_valid:
            low, high = pc.min_max(batch.column("block_num")).values()  # valid entries'
            self.num_lo = low.as_py() if self.num_lo is None else min(self.num_lo, low.as_py())
            self.num_hi = high.as_py() if self.num_hi is None else max(self.num_hi, high.as_py())

    def row(self, index: int, files: _Files, began_task: float) -> pa.RecordBatch:
        """The task's one :data:`RESULT_ARROW` row."""
        keys = np.sort(np.concatenate(self.hash_keys)) if self.hash_keys else np.empty(0, np.uint64)
        row = {
            "idx": index,
            **files.entries.report("entries"),
            **files.blocks.report("blocks"),
            "mtime": int(time.time() * 1000),
            "entries": self.entries,
            "valid": self.valid,
            "invalid": self.invalid,
            "invalid_ids": json.dumps(self.invalid_ids),
            "first_id": self.first_id,
            "last_id": self.last_id,
            "num_lo": self.num_lo,
            "num_hi": self.num_hi,
            "hash_keys": keys.tobytes(),
            "read_s": self.read_s,
            "decode_s": self.decode_s,
            "write_s": self.write_s,
            "task_s": time.perf_counter() - began_task,
        }
        return pa.RecordBatch.from_pylist([row], schema=RESULT_ARROW)


def _write_range(task: WriteTask, index: int) -> pa.RecordBatch:
    """Write range ``index`` of ``task``; its :data:`RESULT_ARROW` row."""
    began_task = time.perf_counter()
    lo, hi = task.ranges[index]
    archived_at = pa.scalar(task.archived_at_us, pa.timestamp("us", tz="UTC"))
    files = _Files.open(task, index)
    heads = HeadReader()
    seen = FirstSeen()
    tally = _Tally()
    client = raw_connect(task.url)
    try:
        if task.chain:
            _see_before(client, task, lo, heads, seen)
        pages = read_raw_pages(client, task.key, lo, hi, task.page)
        while True:
            began = time.perf_counter()
            page = next(pages, None)
            tally.read_s += time.perf_counter() - began
            if page is None:
                break
            _write_page(task, page, archived_at, heads, seen, files, tally)
        began = time.perf_counter()
        files.close()
        tally.write_s += time.perf_counter() - began
    except BaseException:
        files.remove()
        raise
    finally:
        client.close()
    return tally.row(index, files, began_task)


def _see_before(
    client: Any, task: WriteTask, lo: StreamId, heads: HeadReader, seen: FirstSeen
) -> None:
    """Take as seen the valid hashes of the :data:`LOOKBACK` entries just before ``lo``
    (within the interval)."""
    before = read_raw_before(client, task.key, lo, task.ranges[0][0], LOOKBACK)
    if before:
        tail = raw_to_batch(before, True, split=True, heads=heads)
        flags = pc.fill_null(tail.column("valid_block"), False)
        seen.first(tail.column("block_hash"), flags.to_numpy(zero_copy_only=False))


class _Valid(NamedTuple):
    """Of a chain page: which entries are valid blocks, and which write their hash's row."""

    flags: pa.Array
    flags_np: np.ndarray[Any, Any]
    keep: np.ndarray[Any, Any]


def _decode(
    task: WriteTask, page: list[list[Any]], heads: HeadReader, seen: FirstSeen
) -> tuple[pa.RecordBatch, _Valid | None]:
    """One page of raw entries as Arrow, and for a chain stream its :class:`_Valid`."""
    batch = raw_to_batch(page, task.chain, split=task.chain, heads=heads)
    if not task.chain:
        return batch, None
    # A hash's row is written once, from its first entry (repeats within the
    # window); a repeat keeps its block in its fields (as blockplan.plan does).
    flags = pc.fill_null(batch.column("valid_block"), False)
    flags_np = flags.to_numpy(zero_copy_only=False)
    keep = seen.first(batch.column("block_hash"), flags_np)
    repeat = flags_np & ~keep
    if repeat.any():
        fields = restore_blocks(batch, pa.array(repeat))
        batch = batch.set_column(batch.schema.get_field_index("fields"), "fields", fields)
    return batch, _Valid(flags, flags_np, keep)


def _write_page(
    task: WriteTask,
    page: list[list[Any]],
    archived_at: pa.Scalar,
    heads: HeadReader,
    seen: FirstSeen,
    files: _Files,
    tally: _Tally,
) -> None:
    """Decode one page of raw entries and add its rows to the task's files."""
    began = time.perf_counter()
    batch, valid = _decode(task, page, heads, seen)
    rows = entry_rows(batch, archived_at)
    decoded = time.perf_counter()
    tally.decode_s += decoded - began
    tally.count_entries(batch.column("entry_id"))
    files.entries.add(rows)
    if valid is not None:
        tally.count_blocks(batch, valid.flags, valid.flags_np)
        firsts = batch.filter(pa.array(valid.keep))
        if firsts.num_rows:
            tally.hash_keys.append(_hash_keys(firsts.column("block_hash")))
            files.blocks.add(block_rows(firsts, archived_at))
    tally.write_s += time.perf_counter() - decoded


def _hash_keys(hashes: pa.Array) -> np.ndarray[Any, Any]:
    """The first 8 bytes of each hash (64 hex digits) as uint64, for a distinctness check."""
    keys = prefix_keys(hashes)
    if keys is None:
        raise AssertionError("block hashes are 64 hex digits")  # the source checks 32 bytes
    return keys
