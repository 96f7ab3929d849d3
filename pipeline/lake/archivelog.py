"""The ``archive_log`` table: what a run finds already logged, and the row it logs last.

A log row proves the interval's entries and blocks are committed
(:mod:`pipeline.lake.archive`, step 6): it is written last, with an
insert-only MERGE on ``(stream, start_ms, end_ms)``, so a rerun keeps the
first row as is.
"""

from __future__ import annotations

from datetime import datetime
from functools import partial
from typing import Any, Protocol

import pyarrow as pa

from pipeline.lake.storage import store, tables
from pipeline.lake.write.jobs import delta_retry
from pipeline.settings import LakeSettings


class Archived(Protocol):
    """What a log row records of an archived interval (an :class:`~pipeline.lake.archive.ArchiveResult`)."""

    @property
    def stream(self) -> str: ...
    @property
    def start_ms(self) -> int: ...
    @property
    def end_ms(self) -> int: ...
    @property
    def entries(self) -> int: ...
    @property
    def blocks(self) -> int: ...
    @property
    def invalid(self) -> int: ...
    @property
    def first_id(self) -> str | None: ...
    @property
    def last_id(self) -> str | None: ...


def logged_entries(lake: LakeSettings, stream: str, start_ms: int, end_ms: int) -> int | None:
    """The entry count ``archive_log`` records for exactly this interval, or None."""
    import pyarrow.compute as pc

    from pipeline.lake.trim import stream_is

    table = (
        store.open_table(lake, tables.ARCHIVE_LOG)
        .to_pyarrow_dataset()
        .to_table(
            columns=["entries"],
            filter=stream_is(stream)
            & (pc.field("start_ms") == start_ms)
            & (pc.field("end_ms") == end_ms),
        )
    )
    return int(table.column("entries")[0].as_py()) if table.num_rows else None


def write_log(
    lake: LakeSettings,
    result: Archived,
    run_id: str | None,
    archived_at: datetime,
    shared: Any = None,
) -> None:
    """Insert the interval's row into ``archive_log`` (kept as is when already there).

    With ``shared``, in one MERGE with the rows other streams of the job log at once.
    """
    row = pa.Table.from_pylist(
        [
            {
                "stream": result.stream,
                "start_ms": result.start_ms,
                "end_ms": result.end_ms,
                "entries": result.entries,
                "blocks": result.blocks,
                "invalid": result.invalid,
                "first_id": result.first_id,
                "last_id": result.last_id,
                "run_id": run_id,
                "archived_at": archived_at,
            }
        ],
        schema=tables.ARCHIVE_LOG_ARROW,
    )

    def merge(rows: pa.Table) -> None:
        what = (
            f"archive_log row of {result.stream!r}"
            if rows is row
            else (f"archive_log rows of {rows.num_rows} intervals")
        )
        delta_retry(what, partial(_merge, lake, rows))

    if shared is not None:
        shared.write_log(merge, row)
    else:
        merge(row)


def _merge(lake: LakeSettings, rows: pa.Table) -> None:
    (
        store.open_table(lake, tables.ARCHIVE_LOG)
        .merge(
            rows,
            "t.stream = s.stream AND t.start_ms = s.start_ms AND t.end_ms = s.end_ms",
            source_alias="s",
            target_alias="t",
        )
        .when_not_matched_insert_all()
        .execute()
    )
