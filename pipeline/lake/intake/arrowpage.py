"""A page of Redis stream entries as one Arrow record batch of the lake's entry schema.

The ``redis-streams`` data source (:mod:`pipeline.lake.spark.source`) returns
these batches to Spark, and the Arrow and merge writers build their files from
them without Spark: this module imports no pyspark. With ``chain`` the head of
each entry's ``block`` field is decoded (:mod:`pipeline.lake.intake.blockhead`):
a valid block fills ``block_num``, ``block_hash``, ``block_parent`` (lower-case
hex), ``payload`` (the field's bytes) and ``weight`` (32 bytes big-endian, null
when the block has none); an invalid one sets ``valid_block = false`` and
``block_error``, and keeps its raw fields, so nothing is lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.blockcodec import ENTRY_FIELD, HASH_LEN, WEIGHT_BYTES
from pipeline.errors import BadBatch
from pipeline.lake.intake.blockhead import HeadReader
from pipeline.lake.intake.pageheads import page_heads

ARROW_SCHEMA = pa.schema(
    [
        ("entry_id", pa.string()),
        ("entry_ms", pa.int64()),
        ("entry_seq", pa.int64()),
        ("fields", pa.map_(pa.string(), pa.binary())),
        ("valid_block", pa.bool_()),
        ("block_num", pa.int64()),
        ("block_hash", pa.string()),
        ("block_parent", pa.string()),
        ("block_error", pa.string()),
        ("payload", pa.binary()),
        ("weight", pa.binary()),
    ]
)


def entries_to_batch(
    entries: Sequence[tuple[bytes, dict[bytes, bytes]]],
    chain: bool,
    *,
    split: bool = False,
    heads: HeadReader | None = None,
) -> pa.RecordBatch:
    """:func:`raw_to_batch` of entries as redis-py's ``xrange`` returns them (id, dict)."""
    page = [
        [entry_id, [x for pair in fields.items() for x in pair]] for entry_id, fields in entries
    ]
    return raw_to_batch(page, chain, split=split, heads=heads)


def raw_to_batch(
    page: Sequence[Sequence[Any]],
    chain: bool,
    *,
    split: bool = False,
    heads: HeadReader | None = None,
) -> pa.RecordBatch:
    """One page of raw ``XRANGE`` replies (:func:`~pipeline.lake.intake.redisread.read_raw_pages`:
    ``[id, [field, value, ...]]`` each) as a record batch of :data:`ARROW_SCHEMA`.

    Fields read as redis-py's dict would (a repeated field name keeps its first
    place and its last value). A valid block's ``block`` field is also returned
    as ``payload`` (with its ``weight`` as 32 bytes); with ``split``, an entry
    whose one field is that block gets empty ``fields`` (the archive stores the
    payload once, in ``blocks``; an entry with other fields too keeps them all,
    in their order). Only the block's head is decoded
    (:mod:`pipeline.lake.intake.blockhead`); ids are split and hashes hex-encoded in Arrow.
    """

    n = len(page)
    ids = pa.array([e[0] for e in page], pa.binary()).cast(pa.string())
    parts = pc.split_pattern(ids, "-", max_splits=1)
    ms = pc.cast(pc.list_element(parts, 0), pa.int64())
    seq = pc.cast(pc.list_element(parts, 1), pa.int64())
    offsets = [0]
    keys: list[bytes] = []
    values: list[bytes] = []
    if not chain:
        for _, flat in page:
            _add_fields(flat, keys, values)
            offsets.append(len(keys))
        nulls = pa.nulls(n)
        columns = [nulls.cast(t) for t in _BLOCK_TYPES]
        return _batch(ids, ms, seq, offsets, keys, values, columns)
    return _chain_batch(page, ids, ms, seq, split, heads or HeadReader())


def _chain_batch(
    page: Sequence[Sequence[Any]],
    ids: pa.Array,
    ms: pa.Array,
    seq: pa.Array,
    split: bool,
    heads: HeadReader,
) -> pa.RecordBatch:
    """:func:`raw_to_batch` of a chain stream: heads read a page at a time
    (:func:`~pipeline.lake.intake.pageheads.page_heads`), one by one only where that cannot."""
    flats = [e[1] for e in page]
    datas, one = _block_fields(flats)
    payloads = pa.array(datas, pa.binary())
    found = _read_heads(payloads, datas, heads)
    # With split, a valid block alone in its entry leaves its fields empty (it is the payload).
    keep = ~(found.valid & one) if split else np.ones(len(page), dtype=np.bool_)
    offsets, keys, values = _kept_fields(flats, keep)
    invalid = ~found.valid
    columns = [
        pa.array(found.valid, pa.bool_()),
        pa.array(found.nums, pa.int64(), mask=invalid),
        _hex_rows(found.hashes, invalid, HASH_LEN),
        _hex_rows(found.parents, invalid, HASH_LEN),
        pa.array(found.errors, pa.string()),
        pc.if_else(pa.array(found.valid), payloads, pa.scalar(None, pa.binary())),
        _binary_rows(found.weights, ~found.has_weight, WEIGHT_BYTES),
    ]
    return _batch(ids, ms, seq, offsets, keys, values, columns)


def _block_fields(
    flats: list[Sequence[bytes]],
) -> tuple[list[bytes | None], np.ndarray[Any, Any]]:
    """Each entry's ``block`` field (None: it has none), and whether it is the entry's one field."""
    datas: list[bytes | None] = [
        f[1] if len(f) == 2 and f[0] == ENTRY_FIELD else None for f in flats
    ]
    one = np.ones(len(flats), dtype=np.bool_)
    # Rare: several fields (a repeated name counts once, as in a dict).
    for i in [i for i, flat in enumerate(flats) if len(flat) != 2]:
        pairs = dict(zip(flats[i][::2], flats[i][1::2], strict=True))
        datas[i], one[i] = pairs.get(ENTRY_FIELD), len(pairs) == 1
    return datas, one


@dataclass(slots=True)
class _Heads:
    """The heads of a page's payloads, row by row (as :class:`~pipeline.lake.intake.pageheads.PageHeads`),
    with the error of each payload that is not a block."""

    valid: np.ndarray[Any, Any]
    nums: np.ndarray[Any, Any]
    hashes: np.ndarray[Any, Any]
    parents: np.ndarray[Any, Any]
    weights: np.ndarray[Any, Any]
    has_weight: np.ndarray[Any, Any]
    errors: list[str | None]


def _read_heads(payloads: pa.Array, datas: list[bytes | None], heads: HeadReader) -> _Heads:
    """``page_heads`` where it can, :meth:`HeadReader.head` for each row it leaves."""
    found = page_heads(payloads)
    out = _Heads(
        valid=found.ok.copy(),
        nums=found.num.copy(),
        hashes=found.hash.copy(),
        parents=found.parent.copy(),
        weights=found.weight.copy(),
        has_weight=found.has_weight.copy(),
        errors=[None] * len(datas),
    )
    for i in np.flatnonzero(~found.ok).tolist():
        _read_one(out, i, datas[i], heads)
    return out


def _read_one(out: _Heads, i: int, data: bytes | None, heads: HeadReader) -> None:
    """Row ``i`` of ``out`` by :meth:`HeadReader.head`: its head, or the error that refused it."""
    if data is None:
        out.errors[i] = "entry has no 'block' field"
        return
    try:
        num, block_hash, parent, weight = heads.head(data)
    except BadBatch as exc:
        out.errors[i] = str(exc)[:500]
        return
    out.valid[i], out.nums[i] = True, num
    out.hashes[i] = np.frombuffer(block_hash, dtype=np.uint8)
    out.parents[i] = np.frombuffer(parent, dtype=np.uint8)
    if weight is not None:
        out.has_weight[i] = True
        out.weights[i] = np.frombuffer(weight, dtype=np.uint8)


def _kept_fields(
    flats: list[Sequence[bytes]], keep: np.ndarray[Any, Any]
) -> tuple[np.ndarray[Any, Any], list[bytes], list[bytes]]:
    """The map offsets, keys and values of the fields of the entries ``keep`` selects
    (the others get an empty map)."""
    n = len(flats)
    counts = np.zeros(n, dtype=np.int32)
    keys: list[bytes] = []
    values: list[bytes] = []
    for i in np.flatnonzero(keep).tolist():
        before = len(keys)
        _add_fields(flats[i], keys, values)
        counts[i] = len(keys) - before
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    return offsets, keys, values


def _binary_rows(rows: np.ndarray[Any, Any], null: np.ndarray[Any, Any], width: int) -> pa.Array:
    """Each row of an (n, width) uint8 array as one binary value (null where ``null``)."""
    n = len(rows)
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int32)
    values = pa.BinaryArray.from_buffers(
        pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(rows.tobytes())]
    )
    return pc.if_else(pa.array(~null), values, pa.scalar(None, pa.binary()))


def _hex_rows(rows: np.ndarray[Any, Any], null: np.ndarray[Any, Any], width: int) -> pa.Array:
    """Lower-case hex of each row of an (n, width) uint8 array (null where ``null``)."""
    n = len(rows)
    offsets = np.arange(0, (n + 1) * 2 * width, 2 * width, dtype=np.int32)
    values = pa.StringArray.from_buffers(
        n, pa.py_buffer(offsets), pa.py_buffer(_HEX[rows].tobytes())
    )
    return pc.if_else(pa.array(~null), values, pa.scalar(None, pa.string()))


def _add_fields(flat: Sequence[bytes], keys: list[bytes], values: list[bytes]) -> None:
    if len(flat) == 2:
        keys.append(flat[0])
        values.append(flat[1])
        return
    pairs = dict(zip(flat[::2], flat[1::2], strict=True))
    keys.extend(pairs)
    values.extend(pairs.values())


#: byte -> its two lower-case hex digits, as one little-endian uint16
_HEX = np.frombuffer(b"".join(f"{b:02x}".encode() for b in range(256)), dtype="<u2")


def hex_array(data: pa.Array) -> pa.Array:
    """Lower-case hex of each value of a binary array (nulls stay null), vectorized."""
    data = data.cast(pa.binary())
    if len(data) == 0:
        return pa.array([], pa.string())
    if data.offset:
        data = pa.concat_arrays([data])  # a slice: rebase its buffers
    validity, offsets_buf, values_buf = data.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int32, count=len(data) + 1)
    raw = np.frombuffer(values_buf, dtype=np.uint8, count=int(offsets[-1]))
    digits = _HEX[raw].tobytes()
    return pa.StringArray.from_buffers(
        len(data), pa.py_buffer(offsets * 2), pa.py_buffer(digits), validity, data.null_count
    )


_BLOCK_TYPES = [f.type for f in ARROW_SCHEMA][4:]


def _batch(
    ids: pa.Array,
    ms: pa.Array,
    seq: pa.Array,
    offsets: list[int] | np.ndarray[Any, Any],
    keys: list[bytes],
    values: list[bytes],
    columns: list[pa.Array],
) -> pa.RecordBatch:
    # Field names as text: invalid UTF-8 bytes become backslash escapes (as
    # ``bytes.decode("utf-8", "backslashreplace")``); the common names are ASCII.
    names = pa.array(keys, pa.binary())
    try:
        text = names.cast(pa.string())
    except pa.ArrowInvalid:
        text = pa.array([k.decode("utf-8", "backslashreplace") for k in keys], pa.string())
    fields_array = pa.MapArray.from_arrays(
        pa.array(offsets, pa.int32()), text, pa.array(values, pa.binary())
    )
    return pa.RecordBatch.from_arrays([ids, ms, seq, fields_array, *columns], schema=ARROW_SCHEMA)
