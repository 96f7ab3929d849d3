"""Which entries of a chain read add a ``blocks`` row, and what a repeat keeps: pure Arrow.

The archive's rule (the Spark writer's MERGE, :mod:`pipeline.lake.write.sparkwrite`):
in entry order, a valid entry is *new* when ``blocks`` does not hold its hash
and it is the hash's first entry; else it is *present* (``blocks`` holds its
row from this very entry) or *dup* (its ``fields`` keep the block,
``payload_in_blocks = false``). Used by the merge writer
(:mod:`pipeline.lake.write.mergewrite`), by each Arrow writer task for the repeats
within a window of its own id range (:class:`FirstSeen`), and by the driver's fix of the
Arrow writer's files (:mod:`pipeline.lake.write.arrowfix`).
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.lake.intake.arrowpage import ARROW_SCHEMA

#: The field name of a chain entry's block (restored in ``fields`` of a ``dup`` entry).
BLOCK_FIELD = "block"

_FIELDS = ARROW_SCHEMA.field("fields").type


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


#: Valid entries before a writer task's page that :class:`FirstSeen` compares it with (at
#: least the page before at the archive's page size): a repeat further back is written as
#: a first and settled by the driver (:mod:`pipeline.lake.write.arrowfix`, which the task's
#: reported hash keys tell it to run).
WINDOW = 4096


class FirstSeen:
    """Which valid entries of one writer task's pages are the first of their hash: within
    the page and the last ``window`` valid entries before it (exact, by full hash).

    Vectorised for the common page, whose hashes are pairwise distinct and new: the first
    8 bytes of each hash (:func:`prefix_keys`) are sorted and compared with the page's own
    and the window's. Only a page where two keys match (a repeat, or two hashes sharing
    8 bytes) is settled entry by entry. Memory: the window's hashes, not the range's.
    """

    def __init__(self, window: int = WINDOW) -> None:
        self._window = window
        #: (sorted prefix keys or None, hashes) of the pages in the window, oldest first
        self._pages: deque[tuple[np.ndarray[Any, Any] | None, pa.Array]] = deque()
        self._held = 0

    def first(self, hashes: pa.Array, valid: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """True for each valid entry (``valid``) whose hash no earlier entry had."""
        keep = np.zeros(len(valid), dtype=bool)
        rows = np.flatnonzero(valid)
        if not len(rows):
            return keep
        page = hashes.take(pa.array(rows))
        keys = prefix_keys(page)
        ordered = None if keys is None else np.sort(keys)
        if ordered is None or self._suspect(ordered):
            keep[rows] = self._exact(page)
        else:
            keep[rows] = True
        self._remember(ordered, page)
        return keep

    def _suspect(self, ordered: np.ndarray[Any, Any]) -> bool:
        """Whether a key of the page repeats in it or in the window (or a window page has none)."""
        if bool(np.any(ordered[1:] == ordered[:-1])):
            return True
        for there, _ in self._pages:
            if there is None:
                return True
            at = np.minimum(np.searchsorted(there, ordered), len(there) - 1)
            if bool(np.any(there[at] == ordered)):
                return True
        return False

    def _exact(self, page: pa.Array) -> np.ndarray[Any, Any]:
        known: set[str] = set()
        for _, hashes in self._pages:
            known.update(hashes.to_pylist())
        out = np.zeros(len(page), dtype=bool)
        for i, digest in enumerate(page.to_pylist()):
            if digest not in known:
                known.add(digest)
                out[i] = True
        return out

    def _remember(self, ordered: np.ndarray[Any, Any] | None, page: pa.Array) -> None:
        self._pages.append((ordered, page))
        self._held += len(page)
        while self._held - len(self._pages[0][1]) >= self._window:
            self._held -= len(self._pages.popleft()[1])


def prefix_keys(hashes: pa.Array) -> np.ndarray[Any, Any] | None:
    """The first 8 bytes of each hash (64 hex digits, no null) as uint64; None when a value
    is not 64 characters long (equal hashes have equal keys; equal keys may differ)."""
    n = len(hashes)
    if n == 0:
        return np.empty(0, np.uint64)
    if hashes.null_count:
        return None
    hashes = pa.concat_arrays([hashes])  # rebase a slice's buffers
    _, offsets_buf, values_buf = hashes.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int32, count=n + 1)
    if not np.all(np.diff(offsets) == 64):
        return None
    first = np.frombuffer(values_buf, dtype=np.uint8, count=int(offsets[-1]))[offsets[0] :]
    try:  # C speed: 16 digits per hash, decoded at once (a value not in hex has no key)
        raw = bytes.fromhex(first.reshape(n, 64)[:, :16].tobytes().decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return None
    if len(raw) != 8 * n:  # whitespace, which fromhex skips
        return None
    keys: np.ndarray[Any, Any] = np.frombuffer(raw, dtype=">u8").astype(np.uint64)
    return keys


def restore_blocks(read: Any, dup: pa.Array) -> pa.Array:
    """``fields`` of a chain read (a table or a record batch with ``fields``, ``valid_block``
    and ``payload``) where each split-off entry marked ``dup`` has its block back
    (``{"block": payload}``); its ``payload_in_blocks`` is then false
    (:func:`pipeline.lake.write.filerows.entry_rows`)."""
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
