"""A local lake's ``archive_log`` for the coverage board's tests, written with delta-rs."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from pipeline.lake.storage.tables import ARCHIVE_LOG, ARCHIVE_LOG_ARROW

MINUTE = 60_000


def write_archive_log(lake: str, rows: list[dict[str, Any]]) -> None:
    """Append rows (``stream``, ``start_ms``, ``end_ms``, ``entries``, ``run_id``; the rest filled)."""
    from deltalake import write_deltalake

    now = datetime.now(UTC)
    full = [
        {
            "blocks": r["entries"],
            "invalid": 0,
            "first_id": f"{r['start_ms']}-0",
            "last_id": f"{r['end_ms'] - 1}-0",
            "archived_at": now,
            **r,
        }
        for r in rows
    ]
    write_deltalake(
        f"{lake}/{ARCHIVE_LOG}", pa.Table.from_pylist(full, schema=ARCHIVE_LOG_ARROW), mode="append"
    )
