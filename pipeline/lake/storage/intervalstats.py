"""What the lake holds of one stream's interval, read back with delta-rs (no Spark).

Used by the archive (:mod:`pipeline.lake.archive`) and both of its writers:
counts of ``stream_entries`` rows of an interval, and whether a table holds
any row of a stream in a range (files pruned by their stats).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from pipeline.lake.storage import store, tables
from pipeline.settings import LakeSettings

#: At most this many invalid entry ids are returned (the count is always exact).
MAX_REPORTED_INVALID = 100


@dataclass(frozen=True, slots=True)
class Stats:
    """Counts of the entry rows of one interval (``lo``/``hi``: the valid blocks' num range)."""

    entries: int
    blocks: int
    invalid: int
    invalid_ids: tuple[str, ...]
    lo: int | None
    hi: int | None
    first_id: str | None
    last_id: str | None


STAT_COLUMNS = ["entry_id", "entry_ms", "entry_seq", "valid_block", "block_num", "block_hash"]


def interval_scan(
    lake: LakeSettings, name: str, stream: str, column: str, lo: int, hi: int, columns: list[str]
) -> pa.Table:
    """Rows of ``stream`` with ``lo <= column <= hi`` (delta-rs, files pruned by stats)."""
    import pyarrow.compute as pc

    dataset = store.open_table(lake, name).to_pyarrow_dataset(
        file_pruning_predicate=[("stream", "=", stream), (column, ">=", lo), (column, "<=", hi)]
    )
    expr = (pc.field("stream") == stream) & (pc.field(column) >= lo) & (pc.field(column) <= hi)
    table: pa.Table = dataset.to_table(columns=columns, filter=expr)
    return table


def any_rows(lake: LakeSettings, name: str, stream: str, column: str, lo: int, hi: int) -> bool:
    return bool(interval_scan(lake, name, stream, column, lo, hi, [column]).num_rows > 0)


def interval_stats(lake: LakeSettings, stream: str, start_ms: int, end_ms: int) -> Stats:
    """Counts of what ``stream_entries`` holds for the interval, read back with delta-rs."""
    table = interval_scan(
        lake, tables.STREAM_ENTRIES, stream, "entry_ms", start_ms, end_ms - 1, STAT_COLUMNS
    )
    return stats_of(table)


def stats_of(table: pa.Table) -> Stats:
    """Counts of entry rows with :data:`STAT_COLUMNS` (any order)."""
    import pyarrow.compute as pc

    if table.num_rows == 0:
        return Stats(0, 0, 0, (), None, None, None, None)
    table = table.sort_by([("entry_ms", "ascending"), ("entry_seq", "ascending")])
    flag = table.column("valid_block")
    valid = table.filter(pc.fill_null(flag, False))
    bad = table.filter(pc.fill_null(pc.invert(flag), False))
    nums = valid.column("block_num")
    return Stats(
        entries=table.num_rows,
        blocks=valid.num_rows,
        invalid=bad.num_rows,
        invalid_ids=tuple(bad.column("entry_id").slice(0, MAX_REPORTED_INVALID).to_pylist()),
        lo=pc.min(nums).as_py() if valid.num_rows else None,
        hi=pc.max(nums).as_py() if valid.num_rows else None,
        first_id=table.column("entry_id")[0].as_py(),
        last_id=table.column("entry_id")[-1].as_py(),
    )
