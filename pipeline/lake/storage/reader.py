"""The JVM-free reader of the ``blocks`` table (delta-rs through its pyarrow path).

Theory of operation: a :class:`LakeReader` holds one snapshot of the
``blocks`` Delta table (``refresh()`` moves it to the latest version). A point
query builds a pyarrow dataset of the snapshot's files, pruned by the Delta
min/max statistics and by the ``stream`` partition, and filters rows after
reading; range scans share one dataset per version and stream, with each
file's ``num`` range from the Delta log. ``iter_canonical`` streams a range in ``num`` order
without sorting the whole range: files are visited by their minimum ``num``
and a row is emitted once no unread file can still hold a smaller ``num``.

With ``cache_bytes > 0`` (the resumption server's shared reader), each data
file's canonical rows of a stream are kept after the first read, sorted by
``num``, in an LRU bounded by their arrow size. Delta data files are
immutable, so an entry keyed by file path never goes stale; a range read
from a cached file is a binary search and a zero-copy slice.

This module never imports Spark: the resumption server reads history through
it without starting a JVM. The table must keep deletion vectors and column
mapping off (``tables.TABLE_PROPERTIES``); a table that has either is refused
with :class:`~pipeline.errors.LakeError`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from pipeline.errors import LakeError, LakePathError
from pipeline.lake.storage import store, tables
from pipeline.lake.storage.filecache import FileCache
from pipeline.lake.storage.fileranges import num_ranges, range_of
from pipeline.settings import LakeSettings

#: Columns of the arrow fast path, in this order.
ARROW_COLUMNS = ("num", "hash", "parent", "payload")
_ROW_COLUMNS = ["num", "hash", "parent", "canonical", "payload"]


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockRow:
    """One row of ``blocks``: hashes as raw bytes, payload as ``encode_block`` bytes."""

    num: int
    hash: bytes
    parent: bytes
    canonical: bool
    payload: bytes
    #: the stored weight, None for rows written before weights: use ``effective_weight``
    weight: int | None = None


class LakeReader:
    """Reads canonical (and reorged) blocks of any stream from the lake, without Spark."""

    def __init__(
        self,
        lake: LakeSettings | str,
        storage_options: dict[str, str] | None = None,
        *,
        cache_bytes: int = 0,
    ) -> None:
        """``lake``: the lake's settings (storage options come with them), or a bare URI
        with ``storage_options`` given here (delta-rs' names)."""
        if cache_bytes < 0:
            raise ValueError("cache_bytes must be non-negative")
        settings = LakeSettings.from_url(lake) if isinstance(lake, str) else lake
        self._uri = settings.table(tables.BLOCKS)
        self._storage_options = (
            storage_options if storage_options is not None else store.delta_options(settings)
        )
        self._table: Any = None  # deltalake.DeltaTable once the table exists
        #: (table version, stream -> its dataset and files), see :meth:`_stream_files`
        self._files: tuple[int, dict[str, tuple[ds.Dataset, _Files]]] | None = None
        self._ranges: tuple[int, dict[str, tuple[int, int | None]]] | None = None
        self._cache = FileCache(cache_bytes)
        self._files_read = 0
        self._datasets = 0
        self.refresh()

    @property
    def version(self) -> int | None:
        """The Delta version of the snapshot read, or None when there is no table yet."""
        return None if self._table is None else int(self._table.version())

    def statistics(self) -> ReaderStatistics:
        """Counters of this reader's work so far (data files read, the cache's use)."""
        return ReaderStatistics(
            files_read=self._files_read,
            datasets=self._datasets,
            cache_files=len(self._cache),
            cache_bytes=self._cache.size,
            cache_limit=self._cache.limit,
        )

    def refresh(self) -> None:
        """Move to the latest version of the table (or notice that it now exists)."""
        from deltalake import DeltaTable

        try:
            if self._table is not None:
                self._table.update_incremental()
            elif DeltaTable.is_deltatable(self._uri, self._storage_options):
                self._table = DeltaTable(self._uri, storage_options=self._storage_options)
            else:
                return
        except OSError as exc:
            raise LakePathError(
                f"cannot read the lake table {self._uri}: {store.describe(exc)}"
            ) from exc
        _check_readable(self._table, self._uri)

    def drop_idle_cache(self, idle_s: float) -> int:
        """Drop cached files not used for ``idle_s`` seconds (their memory can then be
        given back); how many were dropped."""
        return self._cache.drop_idle(idle_s)

    # --- point queries -------------------------------------------------------

    def head(self, stream: str) -> BlockRow | None:
        """The canonical block with the highest ``num``, or None when there is none."""
        dataset = self._dataset([("stream", "=", stream)])
        if dataset is None:
            return None
        nums = _canonical_only(
            dataset.to_table(columns=["num", "canonical"], filter=_stream(stream))
        ).column("num")
        if len(nums) == 0:
            return None
        top = pc.max(nums).as_py()
        return self.canonical_at(stream, int(top))

    def canonical_at(self, stream: str, num: int) -> BlockRow | None:
        """The canonical block at height ``num``, or None."""
        rows = self._select(stream, [("num", "=", num)], pc.field("num") == num)
        canonical = [row for row in rows if row.canonical]
        return canonical[0] if canonical else None

    def find_hash(self, stream: str, hash: bytes) -> BlockRow | None:
        """The block with this hash, canonical or reorged, or None."""
        hexed = hash.hex()
        rows = self._select(stream, [("hash", "=", hexed)], pc.field("hash") == hexed)
        if not rows:
            return None
        # (stream, hash) is unique in the table; prefer canonical if a bad write ever duplicated it.
        return max(rows, key=lambda r: r.canonical)

    # --- range scans ---------------------------------------------------------

    def iter_canonical(
        self, stream: str, start: int, stop: int | None = None, batch_rows: int = 8192
    ) -> Iterator[list[BlockRow]]:
        """Canonical blocks with ``start <= num < stop`` in ``num`` order, in lists of at most ``batch_rows``."""
        for table in self.iter_canonical_arrow(stream, start, stop, batch_rows=batch_rows):
            yield _rows(table, canonical=True)

    def iter_canonical_arrow(
        self, stream: str, start: int, stop: int | None = None, batch_rows: int = 8192
    ) -> Iterator[pa.Table]:
        """Like :meth:`iter_canonical`, as arrow tables of :data:`ARROW_COLUMNS`.

        ``hash`` and ``parent`` are the stored lower-case hex strings here;
        ``num`` is strictly increasing across all yielded tables.
        """
        if batch_rows < 1:
            raise ValueError("batch_rows must be at least 1")
        if start < 0 or (stop is not None and stop < start):
            raise ValueError(f"bad block range [{start}, {stop})")
        row_filter = _stream(stream) & (pc.field("num") >= start)
        if stop is not None:
            row_filter = row_filter & (pc.field("num") < stop)
        found = self._stream_files(stream)
        if found is None:
            return
        dataset, files = found
        fragments = [
            (lo, fragment)
            for lo, hi, fragment in files
            if (hi is None or hi >= start) and (stop is None or lo < stop)
        ]
        pending: pa.Table | None = None
        for index, (_, fragment) in enumerate(fragments):
            loaded = self._load(dataset, fragment, stream, start, stop, row_filter)
            if pending is None or pending.num_rows == 0:
                pending = loaded
            elif loaded.num_rows:
                pending = pa.concat_tables([pending, loaded])
                if _last_num(pending.slice(0, pending.num_rows - loaded.num_rows)) >= _first_num(
                    loaded
                ):
                    pending = pending.sort_by("num")
            # Rows below the next file's minimum num can no longer be preceded by anything.
            bound = fragments[index + 1][0] if index + 1 < len(fragments) else None
            if bound is None:
                ready, pending = pending, None
            else:
                cut = _count_below(pending, bound)
                ready, pending = pending.slice(0, cut), pending.slice(cut)
            for offset in range(0, ready.num_rows, batch_rows):
                yield ready.slice(offset, batch_rows)

    # --- internals -----------------------------------------------------------

    def _load(
        self,
        dataset: ds.Dataset,
        fragment: Any,
        stream: str,
        start: int,
        stop: int | None,
        row_filter: pc.Expression,
    ) -> pa.Table:
        """The canonical rows of one file with ``start <= num < stop``, sorted by ``num``."""
        columns = [*ARROW_COLUMNS, "canonical"]
        if not self._cache.enabled:
            self._files_read += 1
            table = fragment.to_table(schema=dataset.schema, columns=columns, filter=row_filter)
            return _by_num(_canonical_only(table).select(list(ARROW_COLUMNS)))
        key = (fragment.path, stream)
        whole = self._cache.get(key)
        if whole is None:
            self._files_read += 1
            table = fragment.to_table(
                schema=dataset.schema, columns=columns, filter=_stream(stream)
            )
            whole = _by_num(_canonical_only(table).select(list(ARROW_COLUMNS)))
            self._cache.put(key, whole)
        lo = _count_below(whole, start)
        hi = whole.num_rows if stop is None else _count_below(whole, stop)
        return whole.slice(lo, max(0, hi - lo))

    def _dataset(self, pruning: Sequence[tuple[str, str, Any]]) -> ds.Dataset | None:
        if self._table is None:
            return None
        self._datasets += 1
        try:
            dataset: ds.Dataset = self._table.to_pyarrow_dataset(
                file_pruning_predicate=list(pruning)
            )
        except OSError as exc:
            raise LakePathError(
                f"cannot read the lake table {self._uri}: {store.describe(exc)}"
            ) from exc
        return dataset

    def _select(
        self, stream: str, pruning: Sequence[tuple[str, str, Any]], row_filter: pc.Expression
    ) -> list[BlockRow]:
        dataset = self._dataset([("stream", "=", stream), *pruning])
        if dataset is None:
            return []
        columns = list(_ROW_COLUMNS)
        if tables.WEIGHT_COLUMN in dataset.schema.names:  # absent in pre-weight tables
            columns.append(tables.WEIGHT_COLUMN)
        table = dataset.to_table(columns=columns, filter=_stream(stream) & row_filter)
        return _rows(table, canonical=None)

    def _stream_files(self, stream: str) -> tuple[ds.Dataset, _Files] | None:
        """The dataset of ``stream``'s files and each file's ``num`` range, sorted by minimum.

        Built once per table version and stream: a delta-rs dataset costs about
        a millisecond, which every subscription's first page paid (about half of
        ``subscribe_cpu_ms`` in ``make bench B=resume``). Range reads prune
        files by these Delta statistics, as ``file_pruning_predicate`` would.
        A file without statistics may hold anything: it is read, first.
        """
        version = self.version
        if version is None:
            return None
        cached = self._files
        if cached is None or cached[0] != version:
            cached = self._files = (version, {})
        hit = cached[1].get(stream)
        if hit is not None:
            return hit
        dataset = self._dataset([("stream", "=", stream)])
        if dataset is None:
            return None
        ranges = self._num_ranges(version)
        files = sorted(
            ((*range_of(ranges, f.path), f) for f in dataset.get_fragments()),
            key=lambda item: item[0],
        )
        if len(cached[1]) >= _STREAMS_KEPT:
            cached[1].clear()
        cached[1][stream] = (dataset, files)
        return dataset, files

    def _num_ranges(self, version: int) -> dict[str, tuple[int, int | None]]:
        """(min, max) of ``num`` by data file of this version (:func:`~pipeline.lake.storage.fileranges.num_ranges`)."""
        cached = self._ranges
        if cached is not None and cached[0] == version:
            return cached[1]
        ranges = num_ranges(self._table)
        self._ranges = (version, ranges)
        return ranges


#: (data file's min num, max num or None, its fragment), sorted by min.
_Files = list[tuple[int, int | None, Any]]
#: Streams whose file lists one reader keeps per table version.
_STREAMS_KEPT = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class ReaderStatistics:
    """What :meth:`LakeReader.statistics` reports."""

    #: data files read by range scans (a cached file is read once)
    files_read: int
    #: delta-rs datasets built (each costs about a millisecond)
    datasets: int
    #: files held by the per-file cache, their arrow bytes, and its bound (0: no cache)
    cache_files: int
    cache_bytes: int
    cache_limit: int


def _canonical_only(table: pa.Table) -> pa.Table:
    """Keep canonical rows.

    Done after reading, never in a dataset filter: delta-rs gives each file a
    guarantee built from its statistics, and a file with no min/max on the
    boolean ``canonical`` (Spark collects none) turns any filter on it into null.
    """
    flags = table.column("canonical")
    if flags.null_count == 0 and pc.all(flags).as_py() is not False:
        return table  # all canonical (the usual file): no copy of every payload
    return table.filter(pc.fill_null(flags, False))


def _by_num(table: pa.Table) -> pa.Table:
    """``table`` sorted by ``num``; as it is when it already is (no copy of its payloads).

    Archived files are mostly written in block order: sorting one anyway copied
    every payload (``take``), 7% of a cold catch-up in ``make bench B=resume``.
    """
    nums = table.column("num")
    if len(nums) < 2 or not pc.any(pc.less(nums.slice(1), nums.slice(0, len(nums) - 1))).as_py():
        return table
    return table.sort_by("num")


def _stream(stream: str) -> pc.Expression:
    return pc.field("stream") == stream


def _count_below(table: pa.Table, bound: int) -> int:
    """How many leading rows of a num-sorted table have ``num < bound`` (binary search)."""
    nums = table.column("num")
    lo, hi = 0, len(nums)
    while lo < hi:
        mid = (lo + hi) // 2
        if nums[mid].as_py() < bound:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _first_num(table: pa.Table) -> int:
    return int(table.column("num")[0].as_py())


def _last_num(table: pa.Table) -> int:
    return int(table.column("num")[-1].as_py())


def _rows(table: pa.Table, *, canonical: bool | None) -> list[BlockRow]:
    nums = table.column("num").to_pylist()
    hashes = table.column("hash").to_pylist()
    parents = table.column("parent").to_pylist()
    payloads = table.column("payload").to_pylist()
    flags = (
        [canonical] * len(nums) if canonical is not None else table.column("canonical").to_pylist()
    )
    weights: list[bytes | None] = (
        table.column(tables.WEIGHT_COLUMN).to_pylist()
        if tables.WEIGHT_COLUMN in table.column_names
        else [None] * len(nums)
    )
    fromhex = bytes.fromhex
    return [
        BlockRow(
            num=n,
            hash=fromhex(h),
            parent=fromhex(p),
            canonical=c,
            payload=b,
            weight=None if w is None else int.from_bytes(w, "big"),
        )
        for n, h, p, c, b, w in zip(nums, hashes, parents, flags, payloads, weights, strict=True)
    ]


def _check_readable(table: Any, uri: str) -> None:
    protocol = table.protocol()
    features = set(protocol.reader_features or ())
    bad = features & {"deletionVectors", "columnMapping"}
    config = table.metadata().configuration
    if config.get("delta.enableDeletionVectors", "false").lower() == "true":
        bad.add("deletionVectors")
    if config.get("delta.columnMapping.mode", "none").lower() != "none":
        bad.add("columnMapping")
    if bad:
        raise LakeError(
            f"{uri} uses {sorted(bad)}: the JVM-free reader needs deletion vectors and "
            "column mapping off (see pipeline.lake.storage.tables.TABLE_PROPERTIES)"
        )
