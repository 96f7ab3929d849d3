"""OPTIMIZE and VACUUM the lake tables, keeping them readable by delta-rs.

OPTIMIZE (compaction, z-ordered by ``num`` for ``blocks``) runs on Spark.
VACUUM runs through delta-rs: it only lists and deletes unreferenced files,
which delta-rs does in well under a second where Spark's VACUUM schedules a
large parallel listing job (tens of seconds on a small machine).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from pipeline.lake import tables
from pipeline.lake.jobs import ensure_tables, run_spark, table_sql
from pipeline.settings import LakeSettings, Settings

#: Z-order columns per table (``blocks`` by ``num`` so readers skip files by height).
ZORDER = {tables.BLOCKS: "num", tables.STREAM_ENTRIES: "entry_ms"}


@dataclass(frozen=True, slots=True, kw_only=True)
class TableMaintenance:
    table: str
    files_added: int
    files_removed: int
    vacuumed: int


@dataclass(frozen=True, slots=True, kw_only=True)
class MaintainResult:
    tables: tuple[TableMaintenance, ...]


def maintain(spark: Any, settings: Settings, *, retain_hours: int = 168) -> MaintainResult:
    """Compact (z-ordered where useful) and vacuum every table; deletion vectors stay off."""
    if retain_hours < 0:
        raise ValueError("retain_hours must be >= 0")
    lake = settings.lake
    ensure_tables(lake)
    done = tuple(
        run_spark(f"maintenance of {name}", partial(_one, spark, lake, name, retain_hours))
        for name in tables.LAYOUT
    )
    return MaintainResult(tables=done)


def _one(spark: Any, lake: LakeSettings, name: str, retain_hours: int) -> TableMaintenance:
    target = table_sql(lake, name)
    props = ", ".join(f"'{k}' = '{v}'" for k, v in tables.TABLE_PROPERTIES.items())
    # Re-assert the properties the JVM-free reader needs before rewriting files.
    spark.sql(f"ALTER TABLE {target} SET TBLPROPERTIES ({props})")
    zorder = f" ZORDER BY ({ZORDER[name]})" if name in ZORDER else ""
    metrics = spark.sql(f"OPTIMIZE {target}{zorder}").collect()[0]["metrics"]
    added = int(metrics["numFilesAdded"]) if metrics else 0
    removed = int(metrics["numFilesRemoved"]) if metrics else 0
    vacuumed = _vacuum(lake, name, retain_hours)
    return TableMaintenance(
        table=name, files_added=added, files_removed=removed, vacuumed=int(vacuumed)
    )


def _vacuum(lake: LakeSettings, name: str, retain_hours: int) -> int:
    from deltalake import DeltaTable

    from pipeline.lake.jobs import delta_retry

    table = DeltaTable(lake.table(name))
    removed = delta_retry(
        f"vacuum of {name}",
        lambda: table.vacuum(
            retention_hours=retain_hours, dry_run=False, enforce_retention_duration=False
        ),
    )
    return len(removed)
