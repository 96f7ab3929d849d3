"""The archive's merge writer: the Spark writer's insert-only MERGE, computed with Arrow, no Spark.

What :mod:`pipeline.lake.archive` runs for an interval the Arrow writer does
not take (the lake holds part of it, a block hash repeats in it, or its
blocks are in ``blocks`` from other entries), unless
``SLUICE_ARCHIVE_WRITER=spark``. It writes exactly the rows
:mod:`pipeline.lake.sparkwrite` writes:

1. Read the interval on the driver (paged raw ``XRANGE``, block heads decoded
   as the ``redis-streams`` source does: :func:`~pipeline.lake.source.raw_to_batch`).
   The whole interval is held as Arrow on the driver (payloads once).
2. Plan from the read and the ``(hash, entry_id)`` rows of ``blocks`` in the
   read's num range (:func:`plan`): in entry order, a valid entry is *new*
   when ``blocks`` does not hold its hash and it is the hash's first entry;
   else it is ``present`` (``blocks`` holds its row from this very entry) or
   ``dup`` (its fields keep the block, ``payload_in_blocks = false``).
3. Write the new ``blocks`` rows, then the ``stream_entries`` rows whose
   ``entry_id`` the interval does not hold yet, as Parquet files with the
   tables' declared types and Delta statistics, each committed with delta-rs
   in one atomic append (:func:`pipeline.lake.arrowwrite.commit`, retried on
   a lost race). Rows already in the lake are never rewritten.

No delta-rs ``merge``: it writes ``string_view`` columns, which break the
readers' pyarrow statistics pushdown (NOTES.md). Two archive jobs of one
stream never run at once (:mod:`pipeline.lake.lock`), so the rows missing at
the plan are still missing at the commit; a job killed between the two
commits is completed exactly by its rerun (its blocks are then ``present``).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.lake import arrowwrite, source, store, tables
from pipeline.lake.intervalstats import Stats, interval_scan, interval_stats, stats_of
from pipeline.lake.redisread import MAX_SEQ, raw_connect, read_raw_pages
from pipeline.lake.writejob import WriteJob
from pipeline.settings import LakeSettings

#: The field name of a chain entry's block (restored in ``fields`` of a ``dup`` entry).
BLOCK_FIELD = "block"


def write(job: WriteJob, empty: bool, read: pa.Table | None = None) -> Stats:
    """Insert the interval's missing rows into ``blocks`` then ``stream_entries``.

    Returns what ``stream_entries`` holds for the interval afterwards.
    ``empty``: the lake holds no entry of the interval (no read-back then).
    ``read``: the interval already read (:func:`read_files`), else Redis is read.
    """
    lake, stream, lap = job.settings.lake, job.stream, job.lap
    if read is None:
        read = read_interval(job)
    lap("merge_read")
    archived_at = pa.scalar(job.archived_at, pa.timestamp("us", tz="UTC"))
    in_blocks = fields = None
    if job.chain:
        owners = _owners(lake, stream, read)
        new, dup = plan(read, owners)
        lap("merge_plan")
        blocks = _block_rows(stream, read.filter(new), archived_at)
        _commit(lake, tables.BLOCKS, stream, blocks)
        lap("merge_blocks")
        in_blocks, fields = _payload_columns(read, dup)
    entries = _entry_rows(stream, read, archived_at, in_blocks, fields)
    if not empty:
        have = interval_scan(
            lake, tables.STREAM_ENTRIES, stream, "entry_ms", job.start_ms, job.end_ms - 1,
            ["entry_id"],
        )  # fmt: skip
        entries = entries.filter(pc.invert(pc.is_in(entries.column("entry_id"), have.column(0))))
    _commit(lake, tables.STREAM_ENTRIES, stream, entries)
    lap("merge_entries")
    if empty:
        return stats_of(read)
    stats = interval_stats(lake, stream, job.start_ms, job.end_ms)
    lap("stats")
    return stats


def read_interval(job: WriteJob) -> pa.Table:
    """The interval's entries in id order (:data:`source.ARROW_SCHEMA`, payloads split off)."""
    from pipeline.lake.blockhead import HeadReader

    heads = HeadReader()
    batches: list[pa.RecordBatch] = []
    client = raw_connect(job.settings.redis.url)
    try:
        first, last = (job.start_ms, 0), (job.end_ms - 1, MAX_SEQ)
        for page in read_raw_pages(client, job.key, first, last, source.DEFAULT_PAGE):
            batches.append(source.raw_to_batch(page, job.chain, split=job.chain, heads=heads))
    finally:
        client.close()
    return pa.Table.from_batches(batches, schema=source.ARROW_SCHEMA)


def read_files(lake: LakeSettings, written: Any) -> pa.Table:
    """The interval as the Arrow writer's uncommitted files hold it (a
    :class:`~pipeline.lake.arrowwrite.Written`), shaped as :func:`read_interval` returns it.

    Its entry files hold the rows in id order (tasks in range order, each in id
    order) with split-off payloads' ``fields`` empty; its block files hold each
    valid entry's payload and weight, in the same order.
    """
    import pyarrow.parquet as pq

    def rows(name: str, files: Any, columns: list[str]) -> pa.Table:
        fs, root = store.filesystem(lake, lake.table(name))
        parts = [pq.read_table(f"{root}/{f.path}", columns=columns, filesystem=fs) for f in files]
        empty = source.ARROW_SCHEMA.empty_table().select(columns)
        return pa.concat_tables([empty, *(p.cast(empty.schema) for p in parts)])

    head = [n for n in source.ARROW_SCHEMA.names if n not in ("payload", "weight")]
    entries = rows(tables.STREAM_ENTRIES, written.entries_files, head)
    blocks = rows(tables.BLOCKS, written.blocks_files, ["payload", "weight"])
    valid = pc.fill_null(entries.column("valid_block"), False).to_numpy(zero_copy_only=False)
    if int(valid.sum()) != blocks.num_rows:
        raise AssertionError("the Arrow writer's files disagree: one block row per valid entry")
    at = np.cumsum(valid) - 1
    where = pa.array(at, mask=~valid)
    columns = [entries.column(n) for n in head]
    columns += [blocks.column(n).take(where) for n in ("payload", "weight")]
    return pa.Table.from_arrays(columns, schema=source.ARROW_SCHEMA)


def _owners(lake: LakeSettings, stream: str, read: pa.Table) -> pa.Table:
    """``(hash, entry_id)`` of the ``blocks`` rows in the num range of the read's valid blocks."""
    valid = read.filter(pc.fill_null(read.column("valid_block"), False))
    if not valid.num_rows:
        return pa.table({"hash": pa.array([], pa.string()), "entry_id": pa.array([], pa.string())})
    lo, hi = pc.min_max(valid.column("block_num")).values()
    return interval_scan(
        lake, tables.BLOCKS, stream, "num", lo.as_py(), hi.as_py(), ["hash", "entry_id"]
    )


def plan(read: pa.Table, owners: pa.Table) -> tuple[pa.Array, pa.Array]:
    """``(new, dup)`` boolean masks over the rows of ``read`` (in entry order).

    ``new``: the valid entry adds a ``blocks`` row (its hash is not in
    ``owners`` and no earlier entry of the read has it). ``dup``: a valid
    entry that is not new and whose hash ``owners`` does not hold from this
    very entry. (The Spark writer's ``_marks``; the rest are ``present``.)
    """
    n = read.num_rows
    valid = pc.fill_null(read.column("valid_block"), False).to_numpy(zero_copy_only=False)
    hashes = read.column("block_hash")
    codes = pc.index_in(hashes, value_set=pc.unique(hashes)).to_numpy(zero_copy_only=False)
    first = np.zeros(n, dtype=bool)
    rows = np.flatnonzero(valid)
    if len(rows):
        _, at = np.unique(codes[rows], return_index=True)
        first[rows[at]] = True
    owned = pc.fill_null(pc.is_in(hashes, value_set=owners.column("hash")), False)
    owned_np = owned.to_numpy(zero_copy_only=False) & valid
    pairs = pc.binary_join_element_wise(hashes, read.column("entry_id"), " ")
    owner_pairs = pc.binary_join_element_wise(owners.column("hash"), owners.column("entry_id"), " ")
    mine = pc.fill_null(pc.is_in(pairs, value_set=owner_pairs), False)
    present = owned_np & mine.to_numpy(zero_copy_only=False)
    new = valid & ~owned_np & first
    dup = valid & ~new & ~present
    return pa.array(new), pa.array(dup)


def _payload_columns(read: pa.Table, dup: pa.Array) -> tuple[pa.Array, pa.Array]:
    """``payload_in_blocks`` and ``fields`` of a chain read: a split-off entry marked ``dup``
    gets its block back in ``fields`` (``{"block": payload}``) and ``payload_in_blocks = false``."""
    fields = pa.concat_arrays(read.column("fields").chunks or [pa.array([], _FIELDS)])
    lengths = _lengths(fields)
    split = pc.and_kleene(read.column("valid_block").combine_chunks(), pa.array(lengths == 0))
    in_blocks = pc.and_kleene(split, pc.invert(dup))
    back = pc.fill_null(pc.and_(split, dup), False).to_numpy(zero_copy_only=False)
    if not back.any():
        return in_blocks, fields
    payloads = read.column("payload").combine_chunks().filter(pa.array(back))
    old_keys, old_items = fields.keys, fields.items
    old_starts = fields.offsets.to_numpy()[:-1] - fields.offsets[0].as_py()
    new_lengths = np.where(back, 1, lengths)
    offsets = np.concatenate([[0], np.cumsum(new_lengths)]).astype(np.int32)
    starts = np.where(back, len(old_keys) + np.cumsum(back) - 1, old_starts)
    take = np.repeat(starts - offsets[:-1], new_lengths) + np.arange(offsets[-1])
    keys = pa.concat_arrays([old_keys, pa.array([BLOCK_FIELD] * len(payloads), pa.string())])
    items = pa.concat_arrays([old_items, payloads])
    rebuilt = pa.MapArray.from_arrays(
        pa.array(offsets), keys.take(pa.array(take)), items.take(pa.array(take))
    )
    return in_blocks, rebuilt.cast(fields.type)


_FIELDS = source.ARROW_SCHEMA.field("fields").type


def _lengths(fields: pa.Array) -> np.ndarray[Any, Any]:
    """Entries of each map of ``fields`` (pyarrow has no length kernel for maps)."""
    offsets = fields.offsets.to_numpy()
    lengths: np.ndarray[Any, Any] = np.diff(offsets)
    return lengths


def _entry_rows(
    stream: str,
    read: pa.Table,
    archived_at: pa.Scalar,
    in_blocks: pa.Array | None,
    fields: pa.Array | None,
) -> pa.Table:
    """``stream_entries`` rows of the read (as ``sparkwrite._write_entries`` selects them)."""
    if in_blocks is None or fields is None:
        fields = pa.concat_arrays(read.column("fields").chunks or [pa.array([], _FIELDS)])
        empty = pa.array(_lengths(fields) == 0)
        in_blocks = pc.and_kleene(read.column("valid_block").combine_chunks(), empty)
    n = read.num_rows
    return pa.Table.from_arrays(
        [
            pa.repeat(pa.scalar(stream), n),
            read.column("entry_id"),
            read.column("entry_ms"),
            read.column("entry_seq"),
            fields,
            read.column("valid_block"),
            read.column("block_num"),
            read.column("block_hash"),
            read.column("block_parent"),
            read.column("block_error"),
            pa.repeat(archived_at, n),
            in_blocks,
        ],
        schema=tables.STREAM_ENTRIES_ARROW,
    )


def _block_rows(stream: str, good: pa.Table, archived_at: pa.Scalar) -> pa.Table:
    """``blocks`` rows of the new valid entries (``canonical = false``)."""
    n = good.num_rows
    return pa.Table.from_arrays(
        [
            pa.repeat(pa.scalar(stream), n),
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
        schema=tables.BLOCKS_TABLE_ARROW,
    )


def _commit(lake: LakeSettings, name: str, stream: str, rows: pa.Table) -> None:
    """Write ``rows`` (of ``stream``) as one data file with the table's declared types and
    Delta statistics, and append it in one commit (nothing when there is no row)."""
    if not rows.num_rows:
        return
    uri = lake.table(name)
    fs, root = store.filesystem(lake, uri)
    file_schema = pa.schema([f for f in rows.schema if f.name != arrowwrite.PARTITION_COLUMN])
    part = arrowwrite.partition_dir(stream)
    stats = tables.STATS_COLUMNS[name].split(",")
    out = arrowwrite._File(f"{root}/{part}", 0, file_schema, stats, fs)
    try:
        for batch in rows.select(file_schema.names).cast(file_schema).to_batches():
            out.add(batch)
        out.close()
    except BaseException:
        out.remove()
        raise
    report = out.report("file")
    written = arrowwrite.DataFile(
        f"{part}/{out.name}", int(report["file_size"]), int(time.time() * 1000),
        report["file_stats"],
    )  # fmt: skip
    arrowwrite.commit(uri, (written,), stream, lake.storage_options())


__all__ = ["plan", "read_files", "read_interval", "write"]
