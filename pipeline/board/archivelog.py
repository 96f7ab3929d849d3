"""Reads the lake's ``archive_log`` with delta-rs (never a JVM): per stream, its coverage and newest rows.

Blocking: the board calls :meth:`ArchiveLogReader.read` in a worker thread.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from pipeline.chain.serve.coverage import Archived, Interval, summarize
from pipeline.settings import LakeSettings

if TYPE_CHECKING:
    from deltalake import DeltaTable

#: Newest ``archive_log`` rows shown per stream.
ROWS_PER_STREAM = 10


@dataclass(frozen=True, slots=True, kw_only=True)
class LoggedInterval:
    """One ``archive_log`` row as the view shows it."""

    run_id: str | None
    start_ms: int
    end_ms: int
    entries: int
    blocks: int
    archived_at_ms: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class LakeView:
    """What ``archive_log`` says: per stream the merged coverage and the newest rows."""

    archived: dict[str, Archived] = field(default_factory=dict)
    newest: dict[str, tuple[LoggedInterval, ...]] = field(default_factory=dict)


class ArchiveLogReader:
    """Reads ``archive_log`` with delta-rs (no JVM); one table handle, refreshed incrementally."""

    COLUMNS = ["stream", "start_ms", "end_ms", "entries", "blocks", "run_id", "archived_at"]

    def __init__(self, lake: LakeSettings | str) -> None:
        from pipeline.lake.storage import tables

        self.lake = LakeSettings.from_url(lake) if isinstance(lake, str) else lake
        self.uri = self.lake.table(tables.ARCHIVE_LOG)
        self._table: DeltaTable | None = None

    def read(self) -> LakeView:
        """Blocking. Raises ``OSError``, ``ValueError`` or deltalake's ``DeltaError``."""
        from pipeline.lake.storage import store, tables

        if self._table is None:
            if not store.is_table(self.lake, tables.ARCHIVE_LOG):
                return LakeView()
            self._table = store.open_table(self.lake, tables.ARCHIVE_LOG)
        else:
            self._table.update_incremental()
        table = self._table.to_pyarrow_dataset().to_table(columns=self.COLUMNS)
        return _view(zip(*(table.column(c).to_pylist() for c in self.COLUMNS), strict=True))


def _view(
    rows: Iterable[tuple[str, int, int, int | None, int | None, str | None, datetime | None]],
) -> LakeView:
    """The rows of ``archive_log`` (in :attr:`ArchiveLogReader.COLUMNS` order) per stream."""
    intervals: dict[str, list[Interval]] = {}
    logged: dict[str, list[LoggedInterval]] = {}
    for stream, start, end, entries, blocks, run_id, at in rows:
        intervals.setdefault(stream, []).append(
            Interval(start_ms=start, end_ms=end, entries=entries or 0, blocks=blocks or 0)
        )
        logged.setdefault(stream, []).append(
            LoggedInterval(
                run_id=run_id,
                start_ms=start,
                end_ms=end,
                entries=entries or 0,
                blocks=blocks or 0,
                archived_at_ms=int(at.timestamp() * 1000) if at is not None else None,
            )
        )
    return LakeView(
        archived={s: summarize(i) for s, i in intervals.items()},
        newest={s: newest_rows(r) for s, r in logged.items()},
    )


def newest_rows(
    rows: Iterable[LoggedInterval], limit: int = ROWS_PER_STREAM
) -> tuple[LoggedInterval, ...]:
    """The ``limit`` newest intervals, newest first (by interval end, then by when archived)."""
    ordered = sorted(rows, key=lambda r: (r.end_ms, r.archived_at_ms or 0), reverse=True)
    return tuple(ordered[:limit])


def lake_errors() -> tuple[type[BaseException], ...]:
    """What a failed read of ``archive_log`` raises: reported on the page in one line."""
    from deltalake.exceptions import DeltaError

    from pipeline.errors import LakeError

    # LakeError: the store's own one-line reasons (down, no bucket, bad key)
    return (OSError, ValueError, DeltaError, LakeError)


__all__ = [
    "ROWS_PER_STREAM",
    "ArchiveLogReader",
    "LakeView",
    "LoggedInterval",
    "lake_errors",
    "newest_rows",
]
