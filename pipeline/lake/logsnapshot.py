"""``archive_log`` as one shared archive job sees it: read once, then kept with the job's own rows.

A shared job (:mod:`pipeline.lake.batch`) asks two questions of ``archive_log``
for every stream it archives: which intervals the stream's rows cover (its
catch-up steps, :func:`pipeline.lake.runsteps.run_steps`) and whether the
run's own interval is logged already, with how many entries
(:func:`pipeline.lake.archivelog.logged_entries`). Asked of the table, each
answer opens it and scans every file of the log: a shared MERGE's file holds
several streams' rows, so no file is pruned. With 1,000 streams that is 2,000
scans of a log of hundreds of files per run, the job's largest cost (measured
in the closing note of issue 33). :class:`LogSnapshot` reads the rows of the
job's streams once, before the first stream starts, and answers both
questions from memory; every row the job logs is added as it is logged.

What a caller can rely on:

- the answers are those of the table at the snapshot, plus the job's own rows;
- a row another job logs for one of these streams while this job runs (a
  backfill, a shard's own retry, both holding the stream's lock before this
  job does) is not seen. That interval is then archived again: the write
  finds the lake's rows of it (:func:`pipeline.lake.archivewrite.write_interval`
  reads ``stream_entries`` itself, under the stream's lock) and takes the
  merge writer, which adds none of them again, and the log's MERGE keeps the
  first row. Slower, never wrong;
- it holds the merged coverage runs of each stream, the entry counts read of
  the job's own interval, and those of every row the job logs itself (its
  interval and its catch-up steps), not every row of the table: memory grows
  with the holes in the streams' coverage and the job's steps, not with their
  history.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from pipeline.errors import LakePathError
from pipeline.intervals import merge_intervals
from pipeline.lake.storage import store, tables
from pipeline.settings import LakeSettings


class LogSnapshot:
    """The ``archive_log`` rows of ``streams`` (see the module doc); safe to share across threads."""

    def __init__(
        self, lake: LakeSettings, streams: Sequence[str], start_ms: int, end_ms: int
    ) -> None:
        self._guard = threading.Lock()
        self._own = (start_ms, end_ms)
        self._runs: dict[str, list[tuple[int, int]]] = {name: [] for name in streams}
        self._entries: dict[tuple[str, int, int], int] = {}
        #: rows read from the table when the snapshot was taken
        self.rows = 0
        if streams and store.is_table(lake, tables.ARCHIVE_LOG):
            self._read(lake, list(self._runs))

    def _read(self, lake: LakeSettings, streams: list[str]) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        wanted = pa.array(streams, pa.string())
        try:
            dataset = store.open_table(lake, tables.ARCHIVE_LOG).to_pyarrow_dataset()
            scanner = dataset.scanner(
                columns=["stream", "start_ms", "end_ms", "entries"],
                filter=pc.field("stream").cast(pa.string()).isin(wanted),
            )
            found: dict[str, list[tuple[int, int]]] = {}
            for batch in scanner.to_batches():
                self.rows += batch.num_rows
                names = batch.column("stream").cast(pa.string()).to_pylist()
                starts = batch.column("start_ms").to_pylist()
                ends = batch.column("end_ms").to_pylist()
                counts = batch.column("entries").to_pylist()
                for name, lo, hi, count in zip(names, starts, ends, counts, strict=True):
                    found.setdefault(name, []).append((lo, hi))
                    if (lo, hi) == self._own:
                        self._entries[(name, lo, hi)] = count
                for name, intervals in found.items():  # keep runs, not rows
                    self._runs[name] = merge_intervals([*self._runs[name], *intervals])
                found.clear()
        except OSError as exc:
            uri = lake.table(tables.ARCHIVE_LOG)
            raise LakePathError(f"cannot read {uri}: {store.describe(exc)}") from exc

    def intervals(self, stream: str) -> list[tuple[int, int]]:
        """The merged ``[start_ms, end_ms)`` runs the log covers for ``stream``."""
        with self._guard:
            return list(self._runs.get(stream, ()))

    def entries(self, stream: str, start_ms: int, end_ms: int) -> int | None:
        """The entry count logged for exactly this interval (job's own interval and rows), or None."""
        with self._guard:
            return self._entries.get((stream, start_ms, end_ms))

    def add(self, stream: str, start_ms: int, end_ms: int, entries: int) -> None:
        """The job logged this row (kept as the table keeps it: the first row of an interval)."""
        with self._guard:
            self._entries.setdefault((stream, start_ms, end_ms), entries)
            runs = self._runs.get(stream, [])
            self._runs[stream] = merge_intervals([*runs, (start_ms, end_ms)])
