"""Which entries of a chain read add a ``blocks`` row, and what a repeat keeps: pure Arrow.

The archive's rule (the Spark writer's MERGE, :mod:`pipeline.lake.sparkwrite`):
in entry order, a valid entry is *new* when ``blocks`` does not hold its hash
and it is the hash's first entry; else it is *present* (``blocks`` holds its
row from this very entry) or *dup* (its ``fields`` keep the block,
``payload_in_blocks = false``). Used by the merge writer
(:mod:`pipeline.lake.mergewrite`), by each Arrow writer task for the repeats
inside its own id range (:class:`FirstSeen`), and by the driver's fix of the
Arrow writer's files (:mod:`pipeline.lake.arrowfix`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.lake import source

#: The field name of a chain entry's block (restored in ``fields`` of a ``dup`` entry).
BLOCK_FIELD = "block"

_FIELDS = source.ARROW_SCHEMA.field("fields").type


def plan(read: pa.Table, owners: pa.Table) -> tuple[pa.Array, pa.Array]:
    """``(new, dup)`` boolean masks over the rows of ``read`` (in entry order).

    ``read`` needs ``entry_id``, ``valid_block`` and ``block_hash``; ``owners``
    the ``(hash, entry_id)`` rows ``blocks`` holds. ``new``: the valid entry
    adds a ``blocks`` row (its hash is not in ``owners`` and no earlier entry
    of the read has it). ``dup``: a valid entry that is not new and whose hash
    ``owners`` does not hold from this very entry. (The Spark writer's
    ``_marks``; the rest are ``present``.)
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


class FirstSeen:
    """The hashes one writer task has seen so far: which valid entries of its pages are the
    first of their hash in its id range (bounded by the range, as the task's files are)."""

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def first(self, hashes: pa.Array, valid: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """True for each valid entry (``valid``) whose hash no earlier entry had."""
        keep = np.zeros(len(valid), dtype=bool)
        seen = self._seen
        values = hashes.to_pylist()
        for i in np.flatnonzero(valid).tolist():
            digest = values[i]
            if digest not in seen:
                seen.add(digest)
                keep[i] = True
        return keep


def restore_blocks(read: Any, dup: pa.Array) -> pa.Array:
    """``fields`` of a chain read (a table or a record batch with ``fields``, ``valid_block``
    and ``payload``) where each split-off entry marked ``dup`` has its block back
    (``{"block": payload}``); its ``payload_in_blocks`` is then false
    (:func:`pipeline.lake.arrowwrite.entry_rows`)."""
    fields = _array(read.column("fields"), _FIELDS)
    lengths = map_lengths(fields)
    valid = _array(read.column("valid_block"), pa.bool_())
    split = pc.and_kleene(valid, pa.array(lengths == 0))
    back = pc.fill_null(pc.and_(split, dup), False).to_numpy(zero_copy_only=False)
    if not back.any():
        return fields
    payloads = _array(read.column("payload"), pa.binary()).filter(pa.array(back))
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
    rebuilt_fields: pa.Array = rebuilt.cast(fields.type)
    return rebuilt_fields


def map_lengths(fields: pa.Array) -> np.ndarray[Any, Any]:
    """Entries of each map of ``fields`` (pyarrow has no length kernel for maps)."""
    offsets = fields.offsets.to_numpy()
    lengths: np.ndarray[Any, Any] = np.diff(offsets)
    return lengths


def _array(column: Any, kind: pa.DataType) -> pa.Array:
    """A column of a table (chunked) or of a record batch as one array."""
    if isinstance(column, pa.ChunkedArray):
        return pa.concat_arrays(column.chunks or [pa.array([], kind)])
    return column
