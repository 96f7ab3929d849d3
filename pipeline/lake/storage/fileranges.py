"""Each data file's ``num`` range, from the Delta log's statistics, keyed as the reader finds the file.

The reader (:mod:`pipeline.lake.storage.reader`) prunes a range scan's files by
these ranges and visits them by their minimum. An add action's path is a URI,
so a partition directory that is already escaped on disk (``stream=chain%3Aa``
for ``chain:a``) is escaped once more in the log (``chain%253Aa``), while the
dataset gives the path on disk: both are compared unescaped (:func:`file_key`).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

import pyarrow as pa


def num_ranges(table: Any) -> dict[str, tuple[int, int | None]]:
    """(min, max) of ``num`` by data file (:func:`file_key`) of a ``deltalake.DeltaTable``'s
    snapshot; a file without statistics is absent."""
    actions = pa.table(table.get_add_actions(flatten=True))
    ranges: dict[str, tuple[int, int | None]] = {}
    if "min.num" in actions.column_names:
        highs = (
            actions.column("max.num").to_pylist()
            if "max.num" in actions.column_names
            else [None] * actions.num_rows
        )
        for p, lo, hi in zip(
            actions.column("path").to_pylist(),
            actions.column("min.num").to_pylist(),
            highs,
            strict=True,
        ):
            if lo is not None:
                ranges[file_key(p)] = (int(lo), None if hi is None else int(hi))
    return ranges


def range_of(ranges: dict[str, tuple[int, int | None]], path: str) -> tuple[int, int | None]:
    """The ``num`` range of the file at ``path`` (a fragment's), (-1, None) when unknown."""
    key = file_key(path)
    # A dataset on a store may name the file from the bucket: the log's path is the tail.
    while key not in ranges and "/" in key:
        key = key.split("/", 1)[1]
    return ranges.get(key, (-1, None))


def file_key(path: str) -> str:
    """A data file's path with every level of percent-escaping undone (see the module docstring)."""
    while True:
        plain = unquote(path)
        if plain == path:
            return path.lstrip("/")
        path = plain
