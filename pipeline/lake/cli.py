"""``sluice lake JOB ...``: run one lake job and print its result as one JSON line.

Jobs: ``archive --stream S --start-ms A --end-ms B [--run-id R] [--force]``,
``archive-streams --stream S [--stream T ...] --start-ms A --end-ms B [--run-id R]
[--catchup]`` (several streams in one job: :mod:`pipeline.lake.batch`),
``canonical --stream S``, ``trim --stream S [--now-ms N]``, ``trim-streams --stream S
[--stream T ...] [--now-ms N]`` (:mod:`pipeline.lake.trimstreams`),
``replay --stream S --from N --to M [--target T]``, ``audit --stream S``,
``maintain [--retain-hours H]``, ``backfill --stream S [--since ISO |
--from-coverage] [--until ISO]`` (:mod:`pipeline.lake.backfill`). Settings come from ``Settings.load()``
(``SLUICE_LAKE_URI``, ``SLUICE_REDIS_URL``, ``SLUICE_SPARK_REMOTE``,
``SLUICE_SPARK_MASTER``...).

What a caller (a person, or the Airflow runner reading stderr) can rely on:

- stderr carries the story of the job in a few lines, each starting with its
  level name (``INFO``, ``WARNING``, ``ERROR``): what ran, on which Spark,
  what it read and wrote, how long each stage took. Spark's own output (the
  JVM's log4j, Ivy, py4j, gRPC) goes to a debug file under
  ``$SLUICE_VAR_DIR/logs/`` instead, named in the first line;
- the JSON result carries ``warnings``: how many WARNING-or-worse lines the
  job logged (an archive that kept invalid entries raw says so there too);
- backfill and replay show their progress: a rich bar when stderr is a
  terminal, else an INFO ``progress:`` line (done/total, items, rate, ETA)
  at most every few seconds and one at the end (:mod:`pipeline.lake.progress`);
- a Spark session is started only when the job needs Spark (an interval
  already archived, or with nothing in Redis, never starts one);
- archive, canonical and trim of one stream hold that stream's archive lock
  (:mod:`pipeline.lake.lock`) while they run;
- SIGTERM stops the job at once: its Spark operations are interrupted (on a
  Connect server, only this job's, by tag) and it exits 143 without
  committing anything further.

Exit status: 0 done (for ``audit``: and the chain is continuous), 1 the job
failed or the audit found problems, 2 bad arguments, 143 stopped by SIGTERM.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, suppress
from pathlib import Path
from types import FrameType
from typing import Any

from pipeline.errors import ConfigError, JobCancelled, SluiceError
from pipeline.lake.joblog import WarningCounter, job_logging
from pipeline.lake.progress import reporter
from pipeline.lake.spark.lazyspark import LazySpark
from pipeline.lake.storage import store
from pipeline.lake.story import describe, summary_lines
from pipeline.redisio import check as redischeck
from pipeline.settings import Settings

log = logging.getLogger("pipeline.lake.job")

SPARK_JOBS = frozenset({"archive", "archive-streams", "canonical", "maintain", "backfill"})
#: Jobs that write one stream's lake rows or Redis entries and so hold its archive lock.
LOCKED_JOBS = frozenset({"archive", "canonical", "trim"})
EXIT_CANCELLED = 143
#: Longest a stopped job takes to exit (interrupt, lock release), in seconds.
STOP_GRACE_S = 5.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sluice lake",
        description="Run one lake job and print its result as one JSON line. Settings: "
        "SLUICE_LAKE_URI, SLUICE_REDIS_URL, SLUICE_SPARK_REMOTE (else a local Spark).",
    )
    jobs = parser.add_subparsers(dest="job", required=True, metavar="JOB")

    def job(name: str, text: str) -> argparse.ArgumentParser:
        return jobs.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")

    def stream(p: argparse.ArgumentParser) -> None:
        p.add_argument("--stream", required=True, help="the chain stream, e.g. chain:demo")

    def interval(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--start-ms", type=int, required=True, help="first entry id (ms) of the interval"
        )
        p.add_argument(
            "--end-ms", type=int, required=True, help="end (ms, excluded) of the interval"
        )
        p.add_argument("--run-id", help="the run's id in archive_log (default: a new one)")

    archive = job("archive", "archive one interval of a stream into Delta")
    stream(archive)
    interval(archive)
    archive.add_argument(
        "--force", action="store_true", help="re-read Redis even if archive_log has the interval"
    )
    many = job("archive-streams", "archive one interval of several streams in one job")
    many.add_argument(
        "--stream", dest="streams", action="append", required=True, help="a stream (repeat)"
    )
    interval(many)
    many.add_argument(
        "--catchup",
        action="store_true",
        help="archive each stream's earlier holes in archive_log first (oldest first)",
    )
    stream(job("canonical", "mark the canonical chain of a stream"))
    trim = job("trim", "trim Redis below what archive_log proves archived")
    stream(trim)
    trim.add_argument("--now-ms", type=int, help="the time to trim as of, in ms (default: now)")
    trims = job("trim-streams", "trim several streams in one job (as trim does each)")
    trims.add_argument(
        "--stream", dest="streams", action="append", required=True, help="a stream (repeat)"
    )
    trims.add_argument("--now-ms", type=int, help="the time to trim as of, in ms (default: now)")
    replay = job("replay", "republish canonical blocks from Delta into Redis")
    stream(replay)
    replay.add_argument(
        "--from", dest="from_num", type=int, required=True, help="first block number"
    )
    replay.add_argument(
        "--to", dest="to_num", type=int, required=True, help="last block number (included)"
    )
    replay.add_argument("--target", help="the stream to publish into (default: --stream)")
    stream(job("audit", "check the continuity of the canonical chain"))
    maintain = job("maintain", "compact and VACUUM every table")
    maintain.add_argument(
        "--retain-hours",
        type=int,
        default=168,
        help="VACUUM keeps files younger than this (default: %(default)s)",
    )
    backfill = job(
        "backfill", "archive every missing interval of a stream up to --until (default now)"
    )
    stream(backfill)
    backfill.add_argument("--since", help="ISO time: start at the interval holding it")
    backfill.add_argument(
        "--from-coverage",
        action="store_true",
        help="start where the lake's coverage of what Redis holds ends (the default)",
    )
    backfill.add_argument("--until", help="ISO time: stop at the last interval ending by it")
    return parser


def _check_ranges(args: argparse.Namespace) -> None:
    """Refuse an empty or negative interval or block range (bad input: exit 2)."""
    if args.job in ("archive", "archive-streams") and not 0 <= args.start_ms < args.end_ms:
        raise ConfigError(
            f"--start-ms {args.start_ms} --end-ms {args.end_ms}: "
            "need 0 <= start < end (the end is excluded)"
        )
    if args.job == "replay" and not 0 <= args.from_num <= args.to_num:
        raise ConfigError(
            f"--from {args.from_num} --to {args.to_num}: need 0 <= from <= to (both included)"
        )


def check_args(args: argparse.Namespace, settings: Settings) -> None:
    """Refuse bad input before any work (:class:`ConfigError`: one line, exit 2)."""
    _check_ranges(args)
    if args.job == "maintain" and args.retain_hours < settings.lake.min_retain_hours:
        raise ConfigError(
            f"--retain-hours {args.retain_hours} is below {settings.lake.min_retain_hours}: "
            "VACUUM would delete the files of an archive job still running (a job may run "
            f"up to job_timeout_s = {settings.lake.job_timeout_s} s before it commits them)"
        )
    if args.job != "backfill":
        return
    from pipeline.lake.backfill import iso, parse_time
    from pipeline.lake.intake.streamset import is_configured

    if not is_configured(settings.lake, args.stream):
        raise ConfigError(
            f"unknown stream {args.stream!r} (SLUICE_STREAMS: {', '.join(settings.lake.streams)})"
        )
    if args.since is not None and args.from_coverage:
        raise ConfigError("--since and --from-coverage exclude each other")
    args.since_ms = None if args.since is None else parse_time(args.since, "--since")
    args.until_ms = None if args.until is None else parse_time(args.until, "--until")
    if args.since_ms is not None and args.until_ms is not None and args.until_ms <= args.since_ms:
        raise ConfigError(f"--until {iso(args.until_ms)} is not after --since {iso(args.since_ms)}")


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


# --- running one job ----------------------------------------------------------------


def run(
    args: argparse.Namespace,
    settings: Settings,
    spark: Any = None,
    guard: Callable[[], None] | None = None,
    stopper: Stopper | None = None,
    counter: WarningCounter | None = None,
) -> tuple[Any, bool]:
    """Run the parsed job; returns (result, ok). ``spark`` may be a :class:`LazySpark`;
    ``guard`` is called before a job's last commit (the archive lock's check);
    ``stopper`` (backfill, archive-streams) is told each stream's lock so a stop
    releases it; ``counter`` counts the job's warnings (archive-streams counts
    each stream's on the stream's own worker thread)."""
    if args.job == "backfill":
        return _backfill(args, settings, spark, stopper or Stopper(spark)), True
    if args.job == "archive-streams":
        from pipeline.lake.batch import archive_streams

        stopper = stopper or Stopper(spark)

        def story(result: dict[str, Any], seconds: float) -> None:
            lines = summary_lines("archive", result, seconds)
            lines[-1] = f"stream {result.get('stream')}: {lines[-1]}"  # not the job's "done in"
            for line in lines:
                log.info("%s", line)

        return archive_streams(
            spark,
            settings,
            args.streams,
            args.start_ms,
            args.end_ms,
            run_id=args.run_id,
            catchup=bool(args.catchup),
            locked=lambda stream: _stream_lock(settings, stopper, stream, "archive"),
            check=stopper.check,
            report=story,
        )
    if args.job == "trim-streams":
        from pipeline.lake.trimstreams import trim_streams

        stop = stopper or Stopper(spark)
        return trim_streams(
            settings,
            args.streams,
            now_ms=args.now_ms,
            locked=lambda stream: _stream_lock(settings, stop, stream, "trim"),
            check=stop.check,
        )
    if args.job == "archive":
        from pipeline.lake.archive import archive_interval

        return archive_interval(
            spark,
            settings,
            args.stream,
            args.start_ms,
            args.end_ms,
            run_id=args.run_id,
            force=bool(getattr(args, "force", False)),
            guard=guard,
        ), True
    if args.job == "canonical":
        from pipeline.lake.canonical import mark_canonical

        return mark_canonical(spark, settings, args.stream), True
    if args.job == "maintain":
        from pipeline.lake.maintain import maintain

        return maintain(spark, settings, retain_hours=args.retain_hours), True
    if args.job == "trim":
        from pipeline.lake.trim import safe_trim

        return safe_trim(settings, args.stream, now_ms=args.now_ms), True
    if args.job == "replay":
        from pipeline.lake.replay import replay

        total = max(args.to_num - args.from_num + 1, 0)
        with reporter(
            f"replay {args.stream}", total, "blocks", "blocks", stream=sys.stderr
        ) as shown:
            result = replay(
                settings,
                args.stream,
                args.from_num,
                args.to_num,
                target_stream=args.target,
                progress=lambda n: shown.advance(n, n),
            )
        return result, True
    from pipeline.lake.audit import audit

    report = audit(settings, args.stream)
    return report, report.ok


@contextmanager
def _stream_lock(settings: Settings, stopper: Stopper, stream: str, owner: str) -> Iterator[Any]:
    """Hold ``stream``'s archive lock; the stopper knows it, so a stop releases it."""
    from pipeline.lake.lock import StreamLock

    with StreamLock(
        settings.redis.url, stream, owner=owner, wait_s=settings.lake.lock_wait_s
    ) as lock:
        if lock.waited_s > 0.5:
            log.info("waited %.1fs for the archive lock of %s", lock.waited_s, stream)
        stopper.lock = lock
        try:
            yield lock
        finally:
            stopper.lock = None


def _backfill(args: argparse.Namespace, settings: Settings, spark: Any, stopper: Stopper) -> Any:
    from pipeline.lake import backfill

    logged, oldest_ms, now_ms = backfill.read_state(settings, args.stream)
    until_ms = getattr(args, "until_ms", None)
    todo = backfill.plan(
        settings.lake.archive_cron,
        args.stream,
        logged=logged,
        oldest_ms=oldest_ms,
        now_ms=now_ms,
        since_ms=getattr(args, "since_ms", None),
        until_ms=until_ms,
    )
    if until_ms is not None and until_ms > now_ms:
        log.info("--until is after Redis' clock: stopping at the last closed interval")
    log.info(
        "backfill of %s from %s (%s) to %s: %d intervals of %r to archive, %d archived already",
        args.stream,
        backfill.iso(todo.start_ms),
        todo.origin,
        backfill.iso(todo.end_ms),
        len(todo.todo),
        settings.lake.archive_cron,
        todo.covered,
    )

    def locked() -> AbstractContextManager[Any]:
        return _stream_lock(settings, stopper, args.stream, "backfill")

    # One INFO line per interval from the archive job would drown the progress in
    # the story (they stay in the debug file); its warnings still show.
    story = [
        h
        for h in logging.getLogger().handlers
        if isinstance(h, logging.StreamHandler) and h.stream is sys.stderr
    ]
    for handler in story:
        handler.addFilter(_quiet_archive)
    try:
        with reporter(
            f"backfill {args.stream}", len(todo.todo), "intervals", "entries", stream=sys.stderr
        ) as shown:
            result = backfill.run_backfill(
                spark, settings, todo, progress=shown, locked=locked, check=stopper.check
            )
    finally:
        for handler in story:
            handler.removeFilter(_quiet_archive)
    return result


def _quiet_archive(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING or not record.name.startswith("pipeline.lake.archive")


def main(argv: Sequence[str]) -> int:
    try:
        args = _parser().parse_args(list(argv))
    except SystemExit as exc:
        return int(exc.code or 0)
    settings = Settings.load()
    check_args(args, settings)
    redischeck.check(settings.redis.url)
    with job_logging(settings, args.job) as (counter, debug_path):
        code = _main(args, settings, counter, debug_path)
    if code == EXIT_CANCELLED:
        # Stopped: leave now. The Connect client's exit hooks would otherwise
        # wait on release calls of the interrupted operations (seconds).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _main(
    args: argparse.Namespace, settings: Settings, counter: WarningCounter, debug_path: Path | None
) -> int:
    began = time.perf_counter()
    spark = (
        LazySpark(settings, app_name=f"sluice-lake-{args.job}") if args.job in SPARK_JOBS else None
    )
    where = f" on {spark.mode}" if spark is not None else ""
    log.info(
        "sluice lake %s%s%s",
        describe(args),
        where,
        f" (Spark log: {debug_path})" if debug_path else "",
    )
    stopper = Stopper(spark)
    restore = stopper.install()
    try:
        with ExitStack() as held:
            if args.job in LOCKED_JOBS:
                held.enter_context(_stream_lock(settings, stopper, args.stream, args.job))
            result, ok = run(args, settings, spark, stopper.check, stopper, counter)
            stopper.check()
    except JobCancelled as exc:
        log.error("%s", exc)
        return EXIT_CANCELLED
    except SluiceError as exc:
        if stopper.stopping.is_set():
            return EXIT_CANCELLED  # the interrupt made the Spark work fail: that is the stop
        print(f"sluice lake: {exc}", file=sys.stderr, flush=True)
        return 1
    except store.store_errors() as exc:  # a lake read or write the job did not convert itself
        print(
            f"sluice lake: the lake at {settings.lake.uri} failed: {store.describe(exc)}",
            file=sys.stderr,
            flush=True,
        )
        return 1
    finally:
        restore()
        if spark is not None:
            spark.close()
    seconds = time.perf_counter() - began
    doc = {"job": args.job, **_jsonable(result)}
    for line in summary_lines(args.job, doc, seconds):
        log.info("%s", line)
    doc["warnings"] = counter.count
    doc["job_seconds"] = round(seconds, 3)
    if spark is not None:
        doc["spark"] = spark.mode if spark.started else "not started"
    print(json.dumps(doc), flush=True)
    return 0 if ok else 1


class Stopper:
    """SIGTERM handling of one job: stop at once, commit nothing further.

    The handler itself only sets :attr:`stopping` and starts a thread (it
    never raises into whatever library call the main thread is in: some
    swallow exceptions). That thread interrupts this job's Spark operations
    (on Connect by tag, so the blocked call in the main thread fails at once),
    releases the archive lock and ends the process with exit code 143 after
    at most :data:`STOP_GRACE_S`. :meth:`check` (called before every final
    commit, with the lock's own check) raises :class:`JobCancelled` once
    stopping, so nothing is logged as archived after the signal.
    """

    def __init__(self, spark: LazySpark | None) -> None:
        self.spark = spark
        #: the archive lock each thread holds (archive-streams holds several, one per worker)
        self._locks: dict[int, Any] = {}
        self.stopping = threading.Event()

    @property
    def lock(self) -> Any:
        """The archive lock the calling thread holds, or None."""
        return self._locks.get(threading.get_ident())

    @lock.setter
    def lock(self, lock: Any) -> None:
        if lock is None:
            self._locks.pop(threading.get_ident(), None)
        else:
            self._locks[threading.get_ident()] = lock

    def install(self) -> Callable[[], None]:
        try:
            previous = signal.signal(signal.SIGTERM, self._handler)
        except ValueError:  # not the main thread (in-process callers): no signal handling
            return lambda: None

        def restore() -> None:
            signal.signal(signal.SIGTERM, previous)

        return restore

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if self.stopping.is_set():
            return
        self.stopping.set()
        threading.Thread(target=self._stop, args=(signum,), name="sluice-stop", daemon=True).start()

    def _stop(self, signum: int) -> None:
        log.error("stopped by signal %d: interrupting the job; nothing more is committed", signum)
        deadline = threading.Timer(STOP_GRACE_S, lambda: os._exit(EXIT_CANCELLED))
        deadline.daemon = True
        deadline.start()
        if self.spark is not None:
            self.spark.interrupt()
        for lock in list(self._locks.values()):
            lock.release()
        for stream in (sys.stdout, sys.stderr):
            with suppress(OSError, ValueError):
                stream.flush()
        os._exit(EXIT_CANCELLED)

    def check(self) -> None:
        if self.stopping.is_set():
            raise JobCancelled("stopped by SIGTERM before it committed")
        if self.lock is not None:
            self.lock.check()


if __name__ == "__main__":
    from pipeline.cli import main as sluice_main

    code = sluice_main(["lake", *sys.argv[1:]])
    # The job's result is out and its logs are closed: leave without the
    # interpreter's teardown. Native thread pools (gRPC of the Connect client,
    # Arrow) torn down at exit have aborted a finished job ("terminate called
    # without an active exception", exit -6) after it printed its result.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
