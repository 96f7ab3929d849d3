"""Compact and VACUUM the lake tables; maintenance only ever shrinks or keeps the lake.

Rules, each learned from a lake that grew 3.3x under maintenance (Delta 4):

- Table properties are only set when they differ from what the JVM-free
  reader needs, and ``delta.columnMapping.mode`` is never set: Delta 4 logs
  ``SET TBLPROPERTIES ('delta.columnMapping.mode' = 'none')`` as REMOVE
  COLUMN MAPPING and rewrites the whole table even when mapping was already
  off. A table with column mapping on is reported (warning), not rewritten.
- Compaction (Spark ``OPTIMIZE``, bin-packing, no ZORDER) runs only on a
  table with a partition of two or more data files; ZORDER rewrote even
  single-file tables at every run. Rows are written in entry order already,
  so per-file ``num`` statistics stay tight without it.
- A compaction that would leave more live bytes than before (the merged
  rows compressing worse) is undone with ``RESTORE`` to the prior version.
- VACUUM runs through delta-rs: it only lists and deletes unreferenced files,
  which delta-rs does in well under a second where Spark's VACUUM schedules a
  large parallel listing job. It runs in delta-rs' full mode, so data files no
  commit ever referenced (an archive job killed after its tasks wrote files and
  before its commit) go too, once older than the retention window.

So a second run right after a first one rewrites nothing, and the live files
of every table never grow in count or bytes. The result reports both,
before and after, per table.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from functools import partial
from typing import Any

from pipeline.lake.storage import store, tables
from pipeline.lake.write.jobs import ensure_tables, run_spark, table_sql
from pipeline.settings import LakeSettings, Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class TableMaintenance:
    table: str
    files_added: int
    files_removed: int
    vacuumed: int
    #: live data files and their bytes before and after
    files_before: int = 0
    files_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    #: False when the table needed no compaction (nothing was rewritten)
    compacted: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class MaintainResult:
    tables: tuple[TableMaintenance, ...]


def maintain(spark: Any, settings: Settings, *, retain_hours: int = 168) -> MaintainResult:
    """Compact tables that need it and vacuum every table; see the module docstring.

    ``spark`` is touched only for a table that needs compaction or a property
    fix (it may be a lazy stand-in that is then never started).
    """
    if retain_hours < 0:
        raise ValueError("retain_hours must be >= 0")
    lake = settings.lake
    ensure_tables(lake)
    done = tuple(
        run_spark(f"maintenance of {name}", partial(_one, spark, lake, name, retain_hours))
        for name in tables.LAYOUT
    )
    return MaintainResult(tables=done)


def live_files(lake: LakeSettings, name: str) -> tuple[int, int, int]:
    """(data files, their bytes, most files in one partition) of the table's current version."""
    import pyarrow as pa

    actions = pa.table(store.open_table(lake, name).get_add_actions(flatten=True))
    paths = actions.column("path").to_pylist() if actions.num_rows else []
    sizes = actions.column("size_bytes").to_pylist() if actions.num_rows else []
    partitions = Counter(str(p).rsplit("/", 1)[0] if "/" in str(p) else "" for p in paths)
    return len(paths), int(sum(sizes)), max(partitions.values(), default=0)


def _property_fixes(lake: LakeSettings, name: str) -> dict[str, str]:
    config = store.open_table(lake, name).metadata().configuration
    fixes = {}
    if config.get("delta.enableDeletionVectors", "false") != "false":
        fixes["delta.enableDeletionVectors"] = "false"
    mapping = config.get("delta.columnMapping.mode", "none")
    if mapping != "none":
        log.warning(
            "table %s has column mapping %r: the JVM-free reader cannot read it; rewrite it "
            "by hand (maintenance does not, it would rewrite the whole table)",
            name,
            mapping,
        )
    return fixes


def _one(spark: Any, lake: LakeSettings, name: str, retain_hours: int) -> TableMaintenance:
    fixes = _property_fixes(lake, name)
    if fixes:
        _set_properties(spark, lake, name, fixes)
    files_before, bytes_before, most = live_files(lake, name)
    added = removed = 0
    if most >= 2:
        version = store.open_table(lake, name).version()
        added, removed = _compact(spark, lake, name)
        files_now, bytes_now, _ = live_files(lake, name)
        if bytes_now > bytes_before:
            # Rare (compression of the merged rows came out worse): keep the old files.
            log.info(
                "%s: compaction grew it (%d -> %d bytes); restored", name, bytes_before, bytes_now
            )
            _restore(spark, lake, name, version)
            added = removed = 0
    files_after, bytes_after, _ = live_files(lake, name)
    vacuumed = _vacuum(lake, name, retain_hours)
    return TableMaintenance(
        table=name,
        files_added=added,
        files_removed=removed,
        vacuumed=int(vacuumed),
        files_before=files_before,
        files_after=files_after,
        bytes_before=bytes_before,
        bytes_after=bytes_after,
        compacted=most >= 2,
    )


# Each change is one commit, by Spark on a local lake and by delta-rs (conditional puts,
# see docs/DESIGN.md) on object storage, where Spark does not write.


def _set_properties(spark: Any, lake: LakeSettings, name: str, fixes: dict[str, str]) -> None:
    if lake.remote:
        table = store.open_table(lake, name)
        table.alter.set_table_properties(fixes, raise_if_not_exists=False)
        return
    props = ", ".join(f"'{k}' = '{v}'" for k, v in fixes.items())
    spark.sql(f"ALTER TABLE {table_sql(lake, name)} SET TBLPROPERTIES ({props})")


def _compact(spark: Any, lake: LakeSettings, name: str) -> tuple[int, int]:
    """Bin-pack small files (no ZORDER); returns (files added, files removed)."""
    if lake.remote:
        metrics = store.open_table(lake, name).optimize.compact()
        return int(metrics["numFilesAdded"]), int(metrics["numFilesRemoved"])
    rows = spark.sql(f"OPTIMIZE {table_sql(lake, name)}").collect()
    found = rows[0]["metrics"] if rows else None
    if not found:
        return 0, 0
    return int(found["numFilesAdded"]), int(found["numFilesRemoved"])


def _restore(spark: Any, lake: LakeSettings, name: str, version: int) -> None:
    if lake.remote:
        store.open_table(lake, name).restore(version)
        return
    spark.sql(f"RESTORE TABLE {table_sql(lake, name)} TO VERSION AS OF {version}")


def _vacuum(lake: LakeSettings, name: str, retain_hours: int) -> int:
    from pipeline.lake.write.jobs import delta_retry

    table = store.open_table(lake, name)
    removed = delta_retry(
        f"vacuum of {name}",
        # full: also files no commit references and older than the retention (data files
        # of an archive job killed before its commit, see pipeline.lake.write.arrowwrite).
        lambda: table.vacuum(
            retention_hours=retain_hours,
            dry_run=False,
            enforce_retention_duration=False,
            full=True,
        ),
    )
    return len(removed)
