"""Archived stream entries put back together, as Redis held them (delta-rs, no JVM).

The archive stores each chain block's payload once, in ``blocks``: an entry
row with ``payload_in_blocks = true`` has empty ``fields`` and its one field,
``block``, is the ``payload`` of the ``blocks`` row of this stream with the
entry's ``entry_id`` (:data:`pipeline.lake.storage.tables.PAYLOAD_COLUMN`). Rows written
before that layout (the column is missing or null) and rows with the flag
false hold their whole fields. :func:`read_entries` reads both alike.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.errors import LakeError
from pipeline.lake.storage import store, tables
from pipeline.settings import LakeSettings

#: Entry rows resolved per step (bounds the memory of one step's blocks lookup).
STEP_ROWS = 50_000
_COLUMNS = ["entry_id", "entry_ms", "entry_seq", "fields", "block_num"]


@dataclass(frozen=True, slots=True)
class Entry:
    """One archived entry: its id and its fields, as ``XRANGE`` returned them (keys decoded)."""

    entry_id: str
    entry_ms: int
    entry_seq: int
    fields: dict[str, bytes]


def read_entries(
    lake_uri: LakeSettings | str, stream: str, start_ms: int = 0, end_ms: int | None = None
) -> Iterator[Entry]:
    """The entries of ``stream`` with ``start_ms <= entry_ms < end_ms``, in id order.

    Raises :class:`LakeError` when a row says its payload is in ``blocks`` and
    ``blocks`` has no row for it (a lake damaged by hand: the archive commits
    ``blocks`` before ``stream_entries``).
    """
    lake = LakeSettings.from_url(lake_uri) if isinstance(lake_uri, str) else lake_uri
    table = store.open_table(lake, tables.STREAM_ENTRIES)
    names = table.schema().to_arrow().names
    flag = tables.PAYLOAD_COLUMN in names
    expr = (pc.field("stream") == stream) & (pc.field("entry_ms") >= start_ms)
    pruning: list[tuple[str, str, object]] = [("stream", "=", stream), ("entry_ms", ">=", start_ms)]
    if end_ms is not None:
        expr &= pc.field("entry_ms") < end_ms
        pruning.append(("entry_ms", "<", end_ms))
    rows = (
        table.to_pyarrow_dataset(file_pruning_predicate=pruning)
        .to_table(columns=_COLUMNS + ([tables.PAYLOAD_COLUMN] if flag else []), filter=expr)
        .sort_by([("entry_ms", "ascending"), ("entry_seq", "ascending")])
    )
    for offset in range(0, rows.num_rows, STEP_ROWS):
        yield from _resolve(lake, stream, rows.slice(offset, STEP_ROWS), flag)


def _resolve(lake: LakeSettings, stream: str, rows: pa.Table, flag: bool) -> Iterator[Entry]:
    payloads: dict[str, bytes] = {}
    if flag:
        marked = rows.filter(pc.fill_null(rows.column(tables.PAYLOAD_COLUMN), False))
        if marked.num_rows:
            payloads = _payloads(lake, stream, marked)
    in_blocks = rows.column(tables.PAYLOAD_COLUMN).to_pylist() if flag else [None] * rows.num_rows
    for entry_id, ms, seq, fields, marked_row in zip(
        rows.column("entry_id").to_pylist(),
        rows.column("entry_ms").to_pylist(),
        rows.column("entry_seq").to_pylist(),
        rows.column("fields").to_pylist(),
        in_blocks,
        strict=True,
    ):
        whole = dict(fields or [])
        if marked_row:
            payload = payloads.get(entry_id)
            if payload is None:
                raise LakeError(
                    f"stream_entries row {stream!r} {entry_id} has its payload in blocks, "
                    "and blocks has no row of that entry"
                )
            whole = {"block": payload}
        yield Entry(entry_id, ms, seq, whole)


def _payloads(lake: LakeSettings, stream: str, marked: pa.Table) -> dict[str, bytes]:
    """``entry_id -> blocks.payload`` for the marked entry rows (files pruned by num)."""
    nums = marked.column("block_num")
    lo, hi = pc.min(nums).as_py(), pc.max(nums).as_py()
    found = (
        store.open_table(lake, tables.BLOCKS)
        .to_pyarrow_dataset(
            file_pruning_predicate=[("stream", "=", stream), ("num", ">=", lo), ("num", "<=", hi)]
        )
        .to_table(
            columns=["entry_id", "payload"],
            filter=(pc.field("stream") == stream)
            & (pc.field("num") >= lo)
            & (pc.field("num") <= hi)
            & pc.field("entry_id").isin(marked.column("entry_id")),
        )
    )
    return dict(
        zip(found.column("entry_id").to_pylist(), found.column("payload").to_pylist(), strict=True)
    )


__all__ = ["STEP_ROWS", "Entry", "read_entries"]
