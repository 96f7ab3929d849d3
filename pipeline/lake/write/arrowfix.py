"""The Arrow writer's files of a chain interval, made exact before the driver commits them.

Each writer task writes a hash's ``blocks`` row once, from the hash's first
entry, and keeps the block of a repeat in the repeat's ``fields``, for a repeat
within its page or a window before it (:class:`~pipeline.lake.write.blockplan.FirstSeen`).
What a task does not settle is a repeat further back in its range (its hash
keys then repeat: ``Written.distinct`` is false), a hash an earlier task's
range holds too, or one ``blocks`` holds
already (from other entries, or from these very entries when a job died
between its two commits). The driver settles those here, from what the tasks
report, without a second read of Redis:

1. :func:`plan_fix`: nothing to do when the written hashes are pairwise
   distinct and none is in ``blocks`` (the common case: two cheap checks)
   and no kept row's height lies (:mod:`pipeline.lake.write.heights`, from
   the key columns of the written ``blocks`` files: a set-aside row is
   dropped and its block restored, as a *dup*'s).
   Else the interval is planned exactly (:func:`~pipeline.lake.write.blockplan.plan`)
   from the key columns of the written files (no payloads) and the ``(hash,
   entry_id)`` rows of ``blocks`` in their num range: a written ``blocks`` row
   that is not *new* is dropped (*present*: ``blocks`` holds it; *dup*: an
   earlier entry owns the hash), and a dropped split-off entry gets its block
   back in ``fields`` (``payload_in_blocks = false``).
2. :func:`apply_fix`: only the files that hold such a row are rewritten (read,
   changed, written as new files with their Delta stats); the others are
   committed as they are. The replaced files are deleted (never committed: no
   reader sees them; ``sluice lake maintain`` removes any left).

The committed rows are the Spark writer's MERGE's (:mod:`pipeline.lake.write.sparkwrite`).
Two archive jobs of one stream never run at once (:mod:`pipeline.lake.lock`),
so what ``blocks`` holds at the plan still holds at the commit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.lake.storage import store, tables
from pipeline.lake.storage.intervalstats import interval_scan
from pipeline.lake.write import arrowwrite
from pipeline.lake.write.arrowwrite import DataFile, Written
from pipeline.lake.write.blockplan import plan, restore_blocks
from pipeline.lake.write.heights import Heights, set_aside
from pipeline.settings import LakeSettings

#: The blocks of the entries whose ``fields`` get them back.
_PAYLOADS = pa.schema([("entry_id", pa.string()), ("payload", pa.binary())])


@dataclass(frozen=True, slots=True)
class Fix:
    """Rows of the written files to change: by entry id, and the files that hold them."""

    #: entries whose ``blocks`` row is dropped
    drop: pa.Array
    #: entries (of ``drop``) whose block goes back into their ``fields``
    restore: pa.Array
    #: indexes into ``written.blocks_files`` / ``written.entries_files`` to rewrite
    blocks_files: frozenset[int]
    entries_files: frozenset[int]
    #: indexes of ``blocks_files`` whose every row is dropped and none restored (not read)
    dropped: frozenset[int] = frozenset()


def plan_fix(
    lake: LakeSettings, stream: str, written: Written, heights: Heights | None = None
) -> Fix | None:
    """What of ``written`` must change before its commit (None: commit it as it is).

    The rows it keeps are then checked for heights that lie
    (:func:`~pipeline.lake.write.heights.set_aside`, told to ``heights``): a
    set-aside row is dropped and its block restored like a ``dup``'s.
    """
    if not written.blocks or not written.blocks_files:
        return None
    assert written.num_lo is not None and written.num_hi is not None
    there = interval_scan(
        lake, tables.BLOCKS, stream, "num", written.num_lo, written.num_hi, ["hash", "entry_id"]
    )
    ours = _read(lake, tables.BLOCKS, written.blocks_files, ["entry_id", "num", "hash", "parent"])
    every = pa.concat_tables(ours)
    entries: list[pa.Table] | None = None
    drop_mask = restore_mask = None
    known = pc.is_in(every.column("hash"), value_set=there.column("hash"))
    if not written.distinct or pc.any(known).as_py():
        entries = _read(lake, tables.STREAM_ENTRIES, written.entries_files, _ENTRY_KEYS)
        drop_mask, restore_mask = _repeats(pa.concat_tables(entries), there, every)
    dropped = _EMPTY if drop_mask is None else _ids(entries, drop_mask)
    keep = every.filter(pc.invert(pc.is_in(every.column("entry_id"), value_set=dropped)))
    aside = set_aside(lake, stream, keep)
    if heights is not None:
        heights.add(aside)
    if not len(dropped) and not len(aside.entry_ids):
        return None
    if entries is None:
        entries = _read(lake, tables.STREAM_ENTRIES, written.entries_files, _ENTRY_KEYS)
    read = pa.concat_tables(entries)
    out = pc.is_in(read.column("entry_id"), value_set=aside.entry_ids)
    split = pc.fill_null(read.column("payload_in_blocks"), False)
    drop_mask = out if drop_mask is None else pc.or_(drop_mask, out)
    back = pc.and_(out, split)
    restore_mask = back if restore_mask is None else pc.or_(restore_mask, back)
    drop, restore = _ids(entries, drop_mask), _ids(entries, restore_mask)

    def touched(parts: list[pa.Table], id_set: pa.Array, every: bool = False) -> frozenset[int]:
        test = pc.all if every else pc.any
        return frozenset(
            i
            for i, part in enumerate(parts)
            if test(pc.is_in(part.column("entry_id"), value_set=id_set)).as_py()
        )

    gone = touched(ours, drop, every=True) - touched(ours, restore)
    return Fix(drop, restore, touched(ours, drop), touched(entries, restore), gone)


#: The key columns of the written ``stream_entries`` files a fix reads.
_ENTRY_KEYS = ["entry_id", "valid_block", "block_hash", "payload_in_blocks"]
_EMPTY = pa.array([], pa.string())


def _repeats(read: pa.Table, there: pa.Table, every: pa.Table) -> tuple[Any, Any]:
    """``(drop, restore)`` masks over the entries ``read`` (entry order) for repeats: a
    written ``blocks`` row (of ``every``) whose entry is not *new* is dropped, and a
    split-off *dup* gets its block back (:func:`~pipeline.lake.write.blockplan.plan`)."""
    new, dup = plan(read, there)
    kept = pc.is_in(read.column("entry_id"), value_set=every.column("entry_id"))
    drop_mask = pc.and_(kept, pc.invert(new))
    split = pc.fill_null(read.column("payload_in_blocks"), False)
    return drop_mask, pc.and_(pc.and_(drop_mask, dup), split)


def _ids(entries: list[pa.Table] | None, mask: Any) -> pa.Array:
    """Entry ids of the rows of ``entries`` (concatenated) that ``mask`` selects."""
    assert entries is not None
    ids = pa.concat_tables(entries).column("entry_id")
    return ids.filter(mask).combine_chunks()


def apply_fix(lake: LakeSettings, stream: str, written: Written, fix: Fix) -> Written:
    """``written`` with the files :func:`plan_fix` named rewritten (the old ones deleted)."""
    options = lake.storage_options()
    blocks_uri, entries_uri = lake.table(tables.BLOCKS), lake.table(tables.STREAM_ENTRIES)
    blocks_files: list[DataFile] = []
    replaced_blocks: list[DataFile] = []
    back = [_PAYLOADS.empty_table()]
    for i, f in enumerate(written.blocks_files):
        if i not in fix.blocks_files:
            blocks_files.append(f)
            continue
        replaced_blocks.append(f)
        if i in fix.dropped:
            continue
        (rows,) = _read(lake, tables.BLOCKS, (f,), None)
        ids = rows.column("entry_id")
        restored = rows.filter(pc.is_in(ids, value_set=fix.restore))
        back.append(restored.select(_PAYLOADS.names).cast(_PAYLOADS))
        kept = rows.filter(pc.invert(pc.is_in(ids, value_set=fix.drop)))
        rewritten = arrowwrite.write_file(blocks_uri, tables.BLOCKS, stream, kept, options)
        blocks_files += [rewritten] if rewritten is not None else []
    payloads = pa.concat_tables(back).combine_chunks()
    entries_files: list[DataFile] = []
    replaced_entries: list[DataFile] = []
    for i, f in enumerate(written.entries_files):
        if i not in fix.entries_files:
            entries_files.append(f)
            continue
        (rows,) = _read(lake, tables.STREAM_ENTRIES, (f,), None)
        rewritten = arrowwrite.write_file(
            entries_uri, tables.STREAM_ENTRIES, stream, _restored(rows, payloads), options
        )
        entries_files += [rewritten] if rewritten is not None else []
        replaced_entries.append(f)
    arrowwrite.discard(blocks_uri, tuple(replaced_blocks), options)
    arrowwrite.discard(entries_uri, tuple(replaced_entries), options)
    return replace(written, blocks_files=tuple(blocks_files), entries_files=tuple(entries_files))


def _restored(rows: pa.Table, payloads: pa.Table) -> pa.Table:
    """Entry file ``rows`` with the block of each entry of ``payloads`` back in its ``fields``."""
    at = pc.index_in(rows.column("entry_id"), value_set=payloads.column("entry_id"))
    dup = pc.is_valid(at)
    view = pa.table(
        {
            "fields": rows.column("fields"),
            "valid_block": rows.column("valid_block"),
            "payload": payloads.column("payload").take(at),
        }
    )
    fields = restore_blocks(view, dup)
    in_blocks = pc.if_else(dup, False, rows.column(tables.PAYLOAD_COLUMN))
    rows = rows.set_column(rows.schema.get_field_index("fields"), "fields", fields)
    at_flag = rows.schema.get_field_index(tables.PAYLOAD_COLUMN)
    return rows.set_column(at_flag, tables.PAYLOAD_COLUMN, in_blocks)


def _read(
    lake: LakeSettings, name: str, files: tuple[DataFile, ...], columns: list[str] | None
) -> list[pa.Table]:
    """Each of the written ``files`` of table ``name`` (``columns``, or all), in order."""
    import pyarrow.parquet as pq

    fs, root = store.filesystem(lake, lake.table(name))
    return [pq.read_table(f"{root}/{f.path}", columns=columns, filesystem=fs) for f in files]


__all__ = ["Fix", "apply_fix", "plan_fix"]
