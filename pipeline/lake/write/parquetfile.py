"""One Parquet data file of a lake table being written, named and with statistics as Delta's own.

A file is named like Spark's (``part-<task>-<uuid>.c000.snappy.parquet``) under
its table's partition directory (``stream=<escaped name>``, as Spark escapes
it), and carries the Delta statistics (``numRecords``, ``minValues``,
``maxValues``, ``nullCount``) of the columns it is told to. Nothing here
commits: the writers add the files to the Delta log themselves.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

#: Rows buffered per Parquet row group (pages are 5,000 entries: fewer, larger groups).
ROW_GROUP_ROWS = 65_536
PARTITION_COLUMN = "stream"

# Characters Spark escapes in a partition directory name (ExternalCatalogUtils.escapePathName).
_ESCAPED = frozenset("\"#%'*/:=?\\\x7f{[]^") | frozenset(chr(c) for c in range(1, 32))


def partition_dir(stream: str) -> str:
    """``stream=<name>`` with the characters Spark escapes as ``%XX``, as Spark names it."""
    name = "".join(f"%{ord(c):02X}" if c in _ESCAPED else c for c in stream)
    return f"{PARTITION_COLUMN}={name}"


def fs_path(uri: str) -> str:
    """A table URI as a path of its pyarrow filesystem (``s3://b/k`` -> ``b/k``)."""
    _, sep, rest = uri.partition("://")
    return rest.rstrip("/") if sep else uri.rstrip("/")


def filesystem(storage: dict[str, str]) -> Any:
    """The pyarrow filesystem files are written to: local, or the lake's object store."""
    import pyarrow.fs as pafs

    from pipeline.lake.storage.store import s3_filesystem

    return s3_filesystem(storage) if storage else pafs.LocalFileSystem()


class PartFile:
    """One Parquet file being written: buffered row groups and running Delta stats.

    ``fs``: the pyarrow filesystem ``directory`` is a path of (default: local files).
    """

    def __init__(
        self, directory: str, index: int, schema: pa.Schema, stats: list[str], fs: Any = None
    ) -> None:
        import pyarrow.fs as pafs

        self.fs = fs if fs is not None else pafs.LocalFileSystem()
        if isinstance(self.fs, pafs.LocalFileSystem):
            os.makedirs(directory, exist_ok=True)  # object stores have no directories
        self.name = f"part-{index:05d}-{uuid.uuid4()}.c000.snappy.parquet"
        self.path = f"{directory.rstrip('/')}/{self.name}"
        self.schema = schema
        self.stats = stats
        self.rows = 0
        self.mins: dict[str, Any] = {}
        self.maxs: dict[str, Any] = {}
        self.nulls = dict.fromkeys(stats, 0)
        self.buffer: list[pa.RecordBatch] = []
        self.buffered = 0
        self.writer: Any = None

    def add(self, batch: pa.RecordBatch) -> None:
        if not batch.num_rows:
            return
        for name in self.stats:
            column = batch.column(name)
            self.nulls[name] += column.null_count
            low, high = pc.min_max(column).values()
            if low.is_valid:
                lo, hi = low.as_py(), high.as_py()
                self.mins[name] = min(self.mins.get(name, lo), lo)
                self.maxs[name] = max(self.maxs.get(name, hi), hi)
        self.rows += batch.num_rows
        self.buffer.append(batch)
        self.buffered += batch.num_rows
        if self.buffered >= ROW_GROUP_ROWS:
            self._flush()

    def _flush(self) -> None:
        import pyarrow.parquet as pq

        if not self.buffer:
            return
        if self.writer is None:
            self.writer = pq.ParquetWriter(
                self.path,
                self.schema,
                filesystem=self.fs,
                compression="snappy",
                # Lake columns are mostly unique (hashes, ids, payloads): dictionaries only cost.
                use_dictionary=False,
                write_statistics=self.stats,
            )
        table = pa.Table.from_batches(self.buffer, self.schema)
        self.writer.write_table(table, row_group_size=max(table.num_rows, 1))
        self.buffer = []
        self.buffered = 0

    def close(self) -> None:
        self._flush()
        if self.writer is not None:
            self.writer.close()

    def remove(self) -> None:
        if self.writer is not None:
            self.writer.close()
        with contextlib.suppress(OSError):
            self.fs.delete_file(self.path)

    def report(self, prefix: str) -> dict[str, Any]:
        """``<prefix>_path`` (file name), ``_size`` and ``_stats`` of the closed file, or nulls."""
        if self.writer is None:  # nothing written
            return dict.fromkeys([f"{prefix}_path", f"{prefix}_size", f"{prefix}_stats"])
        return {
            f"{prefix}_path": self.name,
            f"{prefix}_size": self.fs.get_file_info(self.path).size,
            f"{prefix}_stats": self.delta_stats(),
        }

    def delta_stats(self) -> str:
        return json.dumps(
            {
                "numRecords": self.rows,
                "minValues": self.mins,
                "maxValues": self.maxs,
                "nullCount": self.nulls,
            },
            separators=(",", ":"),
        )
