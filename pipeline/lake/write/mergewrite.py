"""The archive's merge writer: the Spark writer's insert-only MERGE, computed with Arrow, no Spark.

What :mod:`pipeline.lake.archive` runs for an interval the Arrow writer does
not take (the lake holds part of it: a forced rerun, or entries added later
with explicit ids), unless ``SLUICE_ARCHIVE_WRITER=spark``. It writes exactly the rows
:mod:`pipeline.lake.write.sparkwrite` writes:

1. Read the interval on the driver (paged raw ``XRANGE``, block heads decoded
   as the ``redis-streams`` source does: :func:`~pipeline.lake.intake.arrowpage.raw_to_batch`).
   The whole interval is held as Arrow on the driver (payloads once).
2. Plan from the read and the ``(hash, entry_id)`` rows of ``blocks`` in the
   read's num range (:func:`pipeline.lake.write.blockplan.plan`): in entry order, a valid entry is *new*
   when ``blocks`` does not hold its hash and it is the hash's first entry;
   else it is ``present`` (``blocks`` holds its row from this very entry) or
   ``dup`` (its fields keep the block, ``payload_in_blocks = false``). A new
   block whose height is not its parent's plus one (and every block above it)
   is set aside like a ``dup`` (:mod:`pipeline.lake.write.heights`).
3. Write the new ``blocks`` rows, then the ``stream_entries`` rows whose
   ``entry_id`` the interval does not hold yet, as Parquet files with the
   tables' declared types and Delta statistics
   (:func:`pipeline.lake.write.arrowwrite.write_file`), each committed with delta-rs
   in one atomic append (:func:`pipeline.lake.write.arrowwrite.commit`, retried on
   a lost race). Rows already in the lake are never rewritten.

No delta-rs ``merge``: it writes ``string_view`` columns, which break the
readers' pyarrow statistics pushdown (NOTES.md). Two archive jobs of one
stream never run at once (:mod:`pipeline.lake.lock`), so the rows missing at
the plan are still missing at the commit; a job killed between the two
commits is completed exactly by its rerun (its blocks are then ``present``).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.lake.intake import arrowpage
from pipeline.lake.intake.blockhead import HeadReader
from pipeline.lake.intake.redisread import DEFAULT_PAGE, MAX_SEQ, raw_connect, read_raw_pages
from pipeline.lake.storage import tables
from pipeline.lake.storage.intervalstats import Stats, interval_scan, interval_stats
from pipeline.lake.write import arrowwrite
from pipeline.lake.write.blockplan import plan, restore_blocks
from pipeline.lake.write.filerows import BLOCKS_FILE, ENTRIES_FILE, block_rows, entry_rows
from pipeline.lake.write.heights import set_aside
from pipeline.lake.write.writejob import WriteJob
from pipeline.settings import LakeSettings


def write(job: WriteJob) -> Stats:
    """Insert the interval's missing rows into ``blocks`` then ``stream_entries``.

    Returns what ``stream_entries`` holds for the interval afterwards.
    """
    lake, stream, lap = job.settings.lake, job.stream, job.lap
    read = read_interval(job)
    lap("merge_read")
    archived_at = pa.scalar(job.archived_at, pa.timestamp("us", tz="UTC"))
    if job.chain:
        new, dup = _set_aside(job, read, *plan(read, _owners(lake, stream, read)))
        lap("merge_plan")
        blocks = [block_rows(b, archived_at) for b in read.filter(new).to_batches()]
        _commit(lake, tables.BLOCKS, stream, pa.Table.from_batches(blocks, BLOCKS_FILE))
        lap("merge_blocks")
        at = read.schema.get_field_index("fields")
        read = read.set_column(at, "fields", restore_blocks(read, dup))
    rows = [entry_rows(b, archived_at) for b in read.to_batches()]
    entries = pa.Table.from_batches(rows, ENTRIES_FILE)
    have = interval_scan(
        lake, tables.STREAM_ENTRIES, stream, "entry_ms", job.start_ms, job.end_ms - 1, ["entry_id"]
    )
    entries = entries.filter(pc.invert(pc.is_in(entries.column("entry_id"), have.column(0))))
    _commit(lake, tables.STREAM_ENTRIES, stream, entries)
    lap("merge_entries")
    stats = interval_stats(lake, stream, job.start_ms, job.end_ms)
    lap("stats")
    return stats


def read_interval(job: WriteJob) -> pa.Table:
    """The interval's entries in id order (:data:`arrowpage.ARROW_SCHEMA`, payloads split off)."""
    heads = HeadReader()
    batches: list[pa.RecordBatch] = []
    client = raw_connect(job.settings.redis.url)
    try:
        first, last = (job.start_ms, 0), (job.end_ms - 1, MAX_SEQ)
        for page in read_raw_pages(client, job.key, first, last, DEFAULT_PAGE):
            batches.append(arrowpage.raw_to_batch(page, job.chain, split=job.chain, heads=heads))
    finally:
        client.close()
    return pa.Table.from_batches(batches, schema=arrowpage.ARROW_SCHEMA)


def _set_aside(job: WriteJob, read: pa.Table, new: pa.Array, dup: pa.Array) -> tuple[
    pa.Array, pa.Array
]:  # fmt: skip
    """``(new, dup)`` with the new blocks :func:`~pipeline.lake.write.heights.set_aside`
    keeps out of ``blocks`` moved from ``new`` to ``dup`` (told to ``job.heights``)."""
    columns = ["entry_id", "block_num", "block_hash", "block_parent"]
    rows = read.filter(new).select(columns).rename_columns(["entry_id", "num", "hash", "parent"])
    aside = set_aside(job.settings.lake, job.stream, rows)
    job.heights.add(aside)
    if not len(aside.entry_ids):
        return new, dup
    out = pc.is_in(read.column("entry_id"), value_set=aside.entry_ids).combine_chunks()
    return pc.and_(new, pc.invert(out)), pc.or_(dup, out)


def _owners(lake: LakeSettings, stream: str, read: pa.Table) -> pa.Table:
    """``(hash, entry_id)`` of the ``blocks`` rows in the num range of the read's valid blocks."""
    valid = read.filter(pc.fill_null(read.column("valid_block"), False))
    if not valid.num_rows:
        return pa.table({"hash": pa.array([], pa.string()), "entry_id": pa.array([], pa.string())})
    lo, hi = pc.min_max(valid.column("block_num")).values()
    return interval_scan(
        lake, tables.BLOCKS, stream, "num", lo.as_py(), hi.as_py(), ["hash", "entry_id"]
    )


def _commit(lake: LakeSettings, name: str, stream: str, rows: pa.Table) -> None:
    """Write ``rows`` (file rows of table ``name``) as one data file and append it in one
    commit (nothing when there is no row)."""
    uri, options = lake.table(name), lake.storage_options()
    written = arrowwrite.write_file(uri, name, stream, rows, options)
    if written is not None:
        arrowwrite.commit(uri, (written,), stream, options)


__all__ = ["read_interval", "write"]
