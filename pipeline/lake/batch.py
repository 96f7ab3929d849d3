"""Archive one data interval of several streams in one job: one process, one Spark session.

``sluice lake archive-streams --stream A --stream B ... --start-ms S --end-ms E
[--run-id R] [--catchup]`` is what each ``sluice_archive`` DAG run starts once,
instead of one job per stream (each job pays for its process and its Spark
session: see the DAG's docstring for the figures). Up to ``archive_job_workers``
(``SLUICE_ARCHIVE_JOB_WORKERS``, default 256) streams are archived at once, each
on a worker thread of the job, chain streams started first: a slow stream (a
MERGE, a long catch-up) holds one worker while the others go on with the rest,
and each stream's result is reported as soon as that stream is done. Per stream:

- with ``catchup``: first the holes ``archive_log`` shows for the stream before
  the interval, and a stream's entries older than its coverage (a new stream's
  first run: :func:`pipeline.lake.runsteps.run_steps`), oldest first,
  while the job is within its catch-up budget (half the job's time limit, for
  all streams together); then the interval itself, always;
- all of it under the stream's archive lock, taken for this stream and
  released when it is done; what ``archive_log`` holds of the streams is read
  once for the whole job, before the first stream starts
  (:mod:`pipeline.lake.logsnapshot`);
- a stream that fails is recorded with its error and the job goes on with the
  next one. A Spark Connect server lost mid-job is waited for instead: the
  first stream that lost it waits up to ``spark.reconnect_s``
  (``SLUICE_SPARK_RECONNECT_S``, within 90% of the job's time limit) for it
  to listen again, the streams that lost it meanwhile wait for that outcome,
  and once it is back the job drops its session, builds one on the server that
  is back, and archives every stream it had not finished from the start of
  that stream (each step is idempotent: what was committed is found, not
  written again). Not back in time, or lost once too often
  (:data:`~pipeline.lake.spark.lazyspark.MAX_REJOINS`), or Redis lost: the
  streams not tried yet are recorded as failed with that cause (each would
  wait and fail the same way); so are the streams left when 90% of the job's
  time limit has passed (the limit kills the job as a whole, and what it
  finished must still be reported).

What a caller can rely on: the result names every stream it was given, each
with its own archive result (what ``sluice lake archive`` prints, plus
``caught_up`` and the ``warnings`` it logged) or with ``error``; ``failed``
lists the streams that failed, and the job's ``ok`` is False when one did (the
CLI still prints the JSON and exits 1). The DAG's per-stream task then
archives that stream on its own, with its own retries. A stop (SIGTERM) is not
a stream failure: :class:`JobCancelled` ends the whole job, and nothing is
logged as archived after it.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import Any

from pipeline.errors import JobCancelled, RedisUnavailable, SluiceError, SparkUnavailable
from pipeline.lake.catchup import CAUGHT_UP_FIELDS
from pipeline.lake.intake import streamset
from pipeline.lake.logsnapshot import LogSnapshot
from pipeline.settings import Settings

log = logging.getLogger(__name__)

#: Errors after which the streams not tried yet are not tried (they would fail the same way).
FATAL = (SparkUnavailable, RedisUnavailable)
#: Share of the job's time limit after which no further stream is started.
START_WITHIN = 0.9


def archive_streams(
    spark: Any,
    settings: Settings,
    streams: Sequence[str],
    start_ms: int,
    end_ms: int,
    *,
    run_id: str | None = None,
    catchup: bool = False,
    locked: Callable[[str], AbstractContextManager[Any]],
    check: Callable[[], None],
    report: Callable[[dict[str, Any], float], None] | None = None,
) -> tuple[dict[str, Any], bool]:
    """Archive ``[start_ms, end_ms)`` of every stream; returns (result, ok). See the module doc.

    ``locked(stream)`` holds the stream's archive lock; ``check`` is called
    before each commit of the log and after a failure (it raises
    :class:`JobCancelled` once the job is being stopped); ``report(result,
    seconds)`` is told each stream's own-interval result as soon as the stream
    is done (the CLI logs its summary lines). Each result's ``warnings`` counts
    the WARNING-or-worse records its stream's worker logged.
    """
    if not 0 <= start_ms < end_ms:
        raise SluiceError(f"bad interval [{start_ms}, {end_ms})")
    names = list(dict.fromkeys(streams))
    run = _Run(settings, start_ms, end_ms, run_id, catchup, locked, check, report, spark)
    run.snapshot = _snapshot(settings, names, start_ms, end_ms)
    workers = max(1, min(settings.lake.archive_job_workers, len(names)))
    with _ThreadWarnings() as counted:
        run.counted = counted
        if workers == 1:
            for stream in names:
                run.one(stream)
        else:
            # Chain streams first: they are the ones that may take the slow (MERGE) path,
            # and started early they end before the plain streams do.
            ordered = sorted(names, key=lambda name: not streamset.is_chain(settings.lake, name))
            with ThreadPoolExecutor(workers, thread_name_prefix="sluice-archive") as pool:
                futures = [pool.submit(run.one, stream) for stream in ordered]
                try:
                    for done in futures:
                        done.result()  # a JobCancelled (a stop) ends the job here
                except BaseException:
                    pool.shutdown(wait=False, cancel_futures=True)  # start no further stream
                    raise
    files, logs = run.shared.files, run.shared.logs
    if files.batches:
        log.info(
            "%d Spark job(s) wrote the files of %d stream interval(s); %d archive_log "
            "commit(s) logged %d", files.batches, files.items, logs.batches if logs else 0,
            logs.items if logs else 0,
        )  # fmt: skip
    results = {name: run.results[name] for name in names}
    failed = [name for name, result in results.items() if "error" in result]
    return {
        "start_ms": start_ms,
        "end_ms": end_ms,
        "streams": results,
        "failed": failed,
    }, not failed


def _snapshot(settings: Settings, names: list[str], start_ms: int, end_ms: int) -> LogSnapshot:
    """The job's one read of ``archive_log`` (:mod:`pipeline.lake.logsnapshot`), with its line."""
    began = time.perf_counter()
    snapshot = LogSnapshot(settings.lake, names, start_ms, end_ms)
    log.info(
        "archive_log: %d row(s) of %d stream(s) read once in %.2fs", snapshot.rows, len(names),
        time.perf_counter() - began,
    )  # fmt: skip
    return snapshot


class _Run:
    """One job's streams, archived by :meth:`one` from any number of worker threads."""

    def __init__(
        self,
        settings: Settings,
        start_ms: int,
        end_ms: int,
        run_id: str | None,
        catchup: bool,
        locked: Callable[[str], AbstractContextManager[Any]],
        check: Callable[[], None],
        report: Callable[[dict[str, Any], float], None] | None,
        spark: Any,
    ) -> None:
        self.settings, self.start_ms, self.end_ms, self.run_id = settings, start_ms, end_ms, run_id
        self.catchup, self.locked, self.check, self.report = catchup, locked, check, report
        self.spark = spark
        from pipeline.lake.write.arrowbatch import SharedWrites

        #: the streams' Spark jobs, commits and log rows, coalesced across the workers
        self.shared = SharedWrites(spark)
        began = time.monotonic()
        self.budget = began + settings.lake.job_timeout_s / 2
        self.last_start = began + settings.lake.job_timeout_s * START_WITHIN
        self.results: dict[str, dict[str, Any]] = {}
        self.fatal: str | None = None
        self.guard = threading.Lock()
        self.counted: _ThreadWarnings | None = None
        self.snapshot: LogSnapshot | None = None

    def warnings(self) -> int:
        return self.counted.mine() if self.counted is not None else 0

    def step(self, stream: str, lo: int, hi: int) -> tuple[dict[str, Any], int]:
        from pipeline.lake.archive import archive_interval

        before = self.warnings()
        result = archive_interval(
            self.spark, self.settings, stream, lo, hi, run_id=self.run_id, guard=self.check,
            shared=self.shared, snapshot=self.snapshot,
        )  # fmt: skip
        return dataclasses.asdict(result), self.warnings() - before

    def _skip(self, stream: str) -> bool:
        """Record ``stream`` as not tried when the job must not start it; True then."""
        with self.guard:
            if self.fatal is None and time.monotonic() > self.last_start:
                self.fatal = (
                    f"{START_WITHIN:.0%} of the job's {self.settings.lake.job_timeout_s}s "
                    "limit passed"
                )
                log.warning(
                    "%s: the streams not started yet are left to their own tasks", self.fatal
                )
            if self.fatal is None:
                return False
            self.results[stream] = {
                "stream": stream, "error": f"not tried: {self.fatal}", "warnings": 0
            }  # fmt: skip
            return True

    def one(self, stream: str) -> None:
        """Archive one stream; again from the start after the Connect server it lost is back."""
        if self._skip(stream):
            return
        began, before = time.perf_counter(), self.warnings()
        while True:
            seen = self.generation()
            try:
                own, caught_up = self.attempt(stream)
                break
            except JobCancelled:
                raise
            except Exception as exc:  # noqa: BLE001 - one stream's failure must not stop the others
                self.check()  # a stop made the work fail: that is the stop, not this stream's error
                if self.rejoined(exc, seen):
                    continue  # every step is idempotent: what was committed is found, not redone
                self.failed(stream, exc, before)
                return
        seconds = time.perf_counter() - began
        if self.catchup:
            own["caught_up"] = caught_up
        own["warnings"] = self.warnings() - before
        if self.report is not None:
            self.report(own, seconds)
        with self.guard:
            self.results[stream] = own

    def generation(self) -> int:
        """How many times the job's session was dropped after its server was lost."""
        return int(getattr(self.spark, "generation", 0))

    def rejoined(self, exc: Exception, seen: int) -> bool:
        """True when the stream is to be tried again: its work ran on a session dropped since
        (whatever it raised), or it lost the Connect server and the server came back within
        ``spark.reconnect_s`` (and the job's time to start streams)."""
        if self.generation() != seen:
            return True
        rejoin = getattr(self.spark, "rejoin", None)
        if not isinstance(exc, SparkUnavailable) or rejoin is None:
            return False
        left = self.last_start - time.monotonic()
        wait_s = max(0.0, min(self.settings.spark.reconnect_s, left))
        return bool(rejoin(seen, wait_s, self.check))

    def failed(self, stream: str, exc: Exception, before: int) -> None:
        """Record ``stream``'s failure (after Redis or the Spark server was lost, the streams
        not started yet are not tried)."""
        text = message(exc)
        gave_up = str(getattr(self.spark, "gave_up", ""))
        if isinstance(exc, SparkUnavailable) and gave_up:
            text = f"{text}; {gave_up}"
        log.error("stream %s: archive failed: %s", stream, text)
        log.debug("stream %s: archive failed", stream, exc_info=True)
        with self.guard:
            if isinstance(exc, FATAL) and self.fatal is None:
                self.fatal = text
            self.results[stream] = {
                "stream": stream, "error": text, "warnings": self.warnings() - before
            }  # fmt: skip

    def attempt(self, stream: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Archive one stream (its catch-up steps, then the interval) under its lock."""
        from pipeline.lake.runsteps import run_steps

        start_ms, end_ms = self.start_ms, self.end_ms
        with self.locked(stream):
            steps = [(start_ms, end_ms)]
            if self.catchup:
                steps = run_steps(self.settings, stream, start_ms, end_ms, self.snapshot)
            if len(steps) > 1:
                log.info(
                    "stream %s: archiving %d earlier interval(s) no run archived yet, "
                    "first [%d, %d)", stream, len(steps) - 1, *steps[0],
                )  # fmt: skip
            caught_up: list[dict[str, Any]] = []
            for done, (lo, hi) in enumerate(steps[:-1]):
                if time.monotonic() > self.budget:
                    log.warning(
                        "stream %s: %d earlier interval(s) left for the next run (time budget)",
                        stream, len(steps) - 1 - done,
                    )  # fmt: skip
                    break
                earlier, warned = self.step(stream, lo, hi)
                caught_up.append(
                    {k: earlier.get(k) for k in CAUGHT_UP_FIELDS} | {"warnings": warned}
                )
            own, _ = self.step(stream, start_ms, end_ms)
        return own, caught_up


class _ThreadWarnings(logging.Handler):
    """Counts the WARNING-or-worse records each thread logs while installed (on the root logger).

    Streams are archived on several threads at once, so a stream's share of
    the job's warnings is what its own thread logged.
    """

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self._counts: dict[int, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        ident = record.thread or 0
        self._counts[ident] = self._counts.get(ident, 0) + 1

    def mine(self) -> int:
        return self._counts.get(threading.get_ident(), 0)

    def __enter__(self) -> _ThreadWarnings:
        logging.getLogger().addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger().removeHandler(self)


def message(exc: BaseException) -> str:
    """One line naming what failed (Sluice errors carry their own; others their type)."""
    text = str(exc).strip().splitlines()[0][:500] if str(exc).strip() else ""
    if isinstance(exc, SluiceError):
        return text or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
