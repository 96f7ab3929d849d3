"""The writes of a shared archive job's streams, run together: one Spark job, one commit.

A shared archive job (:mod:`pipeline.lake.batch`) archives streams on several
worker threads. Alone, each stream's Arrow write costs one Spark job of a few
short tasks, one append commit per table and one ``archive_log`` MERGE, and
each of those costs mostly its round trip (through the Spark Connect server,
or a Delta commit racing the other threads' commits for the next table
version), not its work: measured with 100 streams of 6,000 entries on two
busy cores, about 0.5 s of Spark round trip a stream against tens of
milliseconds of task time, and commit retries once eight threads commit at
once. :class:`SharedWrites` takes those three calls' place for the job's
threads and runs what several threads ask for at the same moment as one.

Theory of operation (:class:`Coalescer`): a thread queues its request; if no
batch of that kind is running it becomes the leader, takes every queued
request (up to a bound) and runs them as one, then hands each request its own
outcome (or the batch's error) and wakes the others. Requests queued
meanwhile wait for the next leader, so while one batch runs the next one
gathers: no timer and no thread of its own, and a lone stream pays what it
did before. Every request gets exactly its own stream's outcome; what the
driver plans between these calls is unchanged (:mod:`pipeline.lake.archive`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Generic, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.lake.write.arrowtask import RESULT_ARROW, RESULT_DDL, write_ranges
from pipeline.lake.write.arrowwrite import (
    DataFile,
    WriteOptions,
    Written,
    collect,
    commit_many,
    nothing_written,
    plan_task,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

#: The rows of one batched Spark job: each task's row and the index of its request.
BATCH_DDL = RESULT_DDL + ", request BIGINT"
#: Most id ranges one batched Spark job writes; further requests wait for the next job.
MAX_RANGES = 512
#: Ranges one Spark task of a batched job writes, at most (more tasks when one stream's
#: interval has more ranges).
RANGES_PER_TASK = 32
#: Most streams' rows (or files) one batched commit takes.
MAX_COMMIT = 256


@dataclass(slots=True)
class _Request(Generic[T, R]):
    item: T
    done: bool = False
    outcome: R | None = None
    error: BaseException | None = field(default=None, repr=False)


class Coalescer(Generic[T, R]):
    """Runs what several threads submit at the same moment as one batch; see the module doc.

    ``run(items)`` returns one outcome per item, in order; when it raises,
    every item of that batch raises the same error in its own thread.
    ``weight(item)`` counts against ``limit`` per batch (a batch takes at
    least one item).
    """

    def __init__(
        self,
        run: Callable[[list[T]], list[R]],
        *,
        limit: int,
        weight: Callable[[T], int] = lambda _: 1,
    ) -> None:
        self._run = run
        self._limit = limit
        self._weight = weight
        self._cond = threading.Condition()
        self._queue: list[_Request[T, R]] = []
        self._running = False
        #: batches run and items they served
        self.batches = 0
        self.items = 0

    def submit(self, item: T) -> R:
        mine: _Request[T, R] = _Request(item)
        with self._cond:
            self._queue.append(mine)
        while True:
            with self._cond:
                while not mine.done and self._running:
                    self._cond.wait()
                if mine.done:
                    break
                batch = self._take()
                self._running = True
            try:
                self._serve(batch)
            finally:
                with self._cond:
                    self._running = False
                    self._cond.notify_all()
        if mine.error is not None:
            raise mine.error
        return mine.outcome  # type: ignore[return-value]

    def _take(self) -> list[_Request[T, R]]:
        batch: list[_Request[T, R]] = []
        weight = 0
        while self._queue:
            more = self._weight(self._queue[0].item)
            if batch and weight + more > self._limit:
                break
            batch.append(self._queue.pop(0))
            weight += more
        return batch

    def _serve(self, batch: list[_Request[T, R]]) -> None:
        try:
            outcomes = self._run([req.item for req in batch])
            for req, outcome in zip(batch, outcomes, strict=True):
                req.outcome = outcome
        except BaseException as exc:  # noqa: BLE001 - raised again in each requester's thread
            for req in batch:
                req.error = exc
        finally:
            for req in batch:
                req.done = True
            self.batches += 1
            self.items += len(batch)


class SharedWrites:
    """The Arrow writer's Spark jobs, append commits and ``archive_log`` MERGEs of a job's
    threads, coalesced (:class:`Coalescer`); each method takes the place of the call it names."""

    def __init__(self, spark: Any) -> None:
        self._spark = spark
        self.files: Coalescer[Any, Written] = Coalescer(
            self._write, limit=MAX_RANGES, weight=lambda task: len(task.ranges)
        )
        self._commits: dict[str, Coalescer[tuple[tuple[DataFile, ...], str], None]] = {}
        self._guard = threading.Lock()
        self.logs: Coalescer[pa.Table, None] | None = None
        self._once: dict[str, Any] = {}
        self._once_guard = threading.Lock()

    def once(self, key: str, work: Callable[[], R]) -> R:
        """``work()``, run once per job for ``key`` (the lake's layout checks, the same for
        every stream): the first thread runs it while the others wait, and all get its
        result. A failure is raised to that thread and not kept: the next one tries again."""
        with self._once_guard:
            if key not in self._once:
                self._once[key] = work()
            return self._once[key]  # type: ignore[no-any-return]

    def write_files(self, spark: Any, options: WriteOptions) -> Written:
        """:func:`pipeline.lake.write.arrowwrite.write_files`, in one Spark job with other threads'
        (``spark`` is ignored: the job's session runs it)."""
        del spark
        task = plan_task(options)
        if task is None:
            return nothing_written()
        return self.files.submit(task)

    def commit(
        self,
        table_uri: str,
        files: tuple[DataFile, ...],
        stream: str,
        storage_options: dict[str, str] | None = None,
    ) -> None:
        """:func:`pipeline.lake.write.arrowwrite.commit`, in one commit with other threads' files of
        the same table."""
        if not files:
            return
        with self._guard:
            shared = self._commits.get(table_uri)
            if shared is None:
                run = partial(_commit, table_uri, storage_options)
                shared = self._commits[table_uri] = Coalescer(run, limit=MAX_COMMIT)
        shared.submit((files, stream))

    def write_log(self, merge: Callable[[pa.Table], None], row: pa.Table) -> None:
        """``merge(rows)`` (the ``archive_log`` MERGE) of ``row`` with other threads' rows."""
        with self._guard:
            if self.logs is None:

                def run(rows: list[pa.Table]) -> list[None]:
                    # one chunk: delta-rs' MERGE misreads a chunked source (null keys)
                    merge(pa.concat_tables(rows).combine_chunks())
                    return [None] * len(rows)

                self.logs = Coalescer(run, limit=MAX_COMMIT)
            logs = self.logs
        logs.submit(row)

    def _write(self, tasks: list[Any]) -> list[Written]:
        """One Spark job for the id ranges of every task: as many Spark tasks as one
        stream's interval gets, and one more per :data:`RANGES_PER_TASK` ranges, each
        writing its share of the ranges (a Spark task costs more to start, 0.1-0.2 s on
        two busy cores, than a small range costs to write; a few hundred ranges on one
        task left every core but one idle)."""
        flat = tuple((i, r) for i, task in enumerate(tasks) for r in range(len(task.ranges)))
        n = len(flat)
        widest = max(len(task.ranges) for task in tasks)
        slots = min(n, max(widest, -(-n // RANGES_PER_TASK)))
        began = time.perf_counter()
        rows = (
            self._spark.range(0, n, 1, slots)
            .mapInArrow(partial(write_many, tuple(tasks), flat), BATCH_DDL)
            .toArrow()
        )
        ran = time.perf_counter()
        index = rows.column("request")
        written = [
            collect(
                rows.filter(pc.equal(index, i)).drop_columns(["request"]).cast(RESULT_ARROW),
                task.partition,
            )
            for i, task in enumerate(tasks)
        ]
        log.debug(
            "one Spark job wrote %d range(s) of %d stream(s) in %d task(s): %.2fs, then %.2fs "
            "to sort its rows", n, len(tasks), slots, ran - began, time.perf_counter() - ran,
        )  # fmt: skip
        return written


def _commit(
    table_uri: str,
    storage_options: dict[str, str] | None,
    items: list[tuple[tuple[DataFile, ...], str]],
) -> list[None]:
    commit_many(table_uri, items, storage_options)
    return [None] * len(items)


def write_many(tasks: tuple[Any, ...], flat: tuple[tuple[int, int], ...], batches: Any) -> Any:
    """``mapInArrow`` body of a batched job: input row ``i`` is range ``flat[i][1]`` of
    task ``flat[i][0]``; each output row is :func:`~pipeline.lake.write.arrowtask.write_ranges`'
    row with its task's index."""
    for batch in batches:
        for i in batch.column(0).to_pylist():
            request, index = flat[int(i)]
            one = pa.RecordBatch.from_arrays([pa.array([index], pa.int64())], names=["id"])
            for row in write_ranges(tasks[request], iter([one])):
                yield pa.RecordBatch.from_arrays(
                    [*row.columns, pa.array([request], pa.int64())],
                    names=[*row.schema.names, "request"],
                )
