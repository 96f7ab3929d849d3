"""Copy-on-write updates of a few rows with pyarrow and one delta-rs commit (no Spark, no MERGE).

Why not delta-rs' own ``merge``/``update``: delta-rs 1.6 rewrites the files
they touch with ``string_view`` columns, and pyarrow's Parquet statistics
pushdown then fails every reader filter on those columns
(``greater_equal(string, string_view)``). Here the touched files are read
with pyarrow, changed, written back with the table's own types (and the
Delta statistics of :data:`pipeline.lake.storage.tables.STATS_COLUMNS`), and
committed as one transaction that adds the new files and removes the old
ones. A concurrent commit that removed one of those files too (a compaction)
makes delta-rs refuse this one (a concurrent delete conflict); the caller's
:func:`~pipeline.lake.write.jobs.delta_retry` then starts over on the new version.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.lake.storage import store, tables
from pipeline.lake.write.parquetfile import PARTITION_COLUMN, PartFile, partition_dir
from pipeline.settings import LakeSettings

#: Rows of one file to a changed copy, or None when none of its rows changes.
Change = Callable[[pa.Table], pa.Table | None]


def rewrite_partition_range(
    lake: LakeSettings, name: str, stream: str, column: str, lo: int, hi: int, change: Change
) -> int:
    """Apply ``change`` to every live file of ``stream`` whose ``column`` range meets ``[lo, hi]``.

    One commit for all changed files (none when nothing changed); returns how
    many files were rewritten.
    """
    from deltalake.transaction import AddAction, RemoveAction

    table = store.open_table(lake, name)
    live = pa.table(table.get_add_actions(flatten=True))
    if not live.num_rows:
        return 0
    mine = pc.equal(live.column(f"partition.{PARTITION_COLUMN}"), stream)
    low, high = f"min.{column}", f"max.{column}"
    if low in live.column_names:  # files without statistics may hold anything: keep them
        mine = pc.and_(mine, pc.fill_null(pc.less_equal(live.column(low), hi), True))
        mine = pc.and_(mine, pc.fill_null(pc.greater_equal(live.column(high), lo), True))
    chosen = live.filter(mine)
    schema = pa.schema(table.schema().to_arrow())
    file_schema = pa.schema([f for f in schema if f.name != PARTITION_COLUMN])
    fs, root = store.filesystem(lake, lake.table(name))
    stats = tables.STATS_COLUMNS[name].split(",")
    actions: list[AddAction | RemoveAction] = []
    now_ms = int(time.time() * 1000)
    for index, (logged, size) in enumerate(
        zip(chosen.column("path").to_pylist(), chosen.column("size_bytes").to_pylist(), strict=True)
    ):
        path = unquote(logged)  # the log holds paths URI-encoded; actions take them plain
        rows = pq.read_table(f"{root}/{path}", filesystem=fs).select(file_schema.names)
        changed = change(rows.cast(file_schema))
        if changed is None:
            continue
        out = PartFile(f"{root}/{partition_dir(stream)}", index, file_schema, stats, fs)
        for batch in changed.cast(file_schema).to_batches():
            out.add(batch)
        out.close()
        report = out.report("file")
        actions.append(
            AddAction(
                f"{partition_dir(stream)}/{out.name}",
                int(report["file_size"]),
                {PARTITION_COLUMN: stream},
                now_ms,
                True,
                report["file_stats"],
            )  # fmt: skip
        )
        actions.append(RemoveAction(path, True, now_ms, size, {PARTITION_COLUMN: stream}))
    if actions:
        table.create_write_transaction(
            actions, mode="append", schema=table.schema(), partition_by=[PARTITION_COLUMN]
        )
    return len(actions) // 2


__all__ = ["Change", "rewrite_partition_range"]
