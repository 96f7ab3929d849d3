"""Run one parsed lake job: the function each job calls, with its locks and its story lines.

:func:`run` is what ``sluice lake`` runs once the arguments are checked and
the job's logging is set up (:mod:`pipeline.lake.cli`); each job's function
is imported only when that job runs.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from pipeline.lake.joblog import WarningCounter
from pipeline.lake.progress import reporter
from pipeline.lake.stopper import Stopper, stream_lock
from pipeline.lake.story import summary_lines
from pipeline.settings import Settings

log = logging.getLogger("pipeline.lake.job")


@dataclass(frozen=True, slots=True)
class _Job:
    """One call of :func:`run`: what every job's runner takes."""

    args: argparse.Namespace
    settings: Settings
    spark: Any
    guard: Callable[[], None] | None
    given: Stopper | None

    def stopper(self) -> Stopper:
        """The stopper :func:`run` was given, else a new one."""
        return self.given or Stopper(self.spark)


#: A job's runner: the job's ``(result, ok)``.
_Runner = Callable[[_Job], tuple[Any, bool]]


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
    runner = _RUNNERS.get(args.job, _audit)
    return runner(_Job(args, settings, spark, guard, stopper))


def _backfill(job: _Job) -> tuple[Any, bool]:
    return _run_backfill(job.args, job.settings, job.spark, job.stopper()), True


def _archive_streams(job: _Job) -> tuple[Any, bool]:
    from pipeline.lake.batch import archive_streams

    stop = job.stopper()

    def story(result: dict[str, Any], seconds: float) -> None:
        lines = summary_lines("archive", result, seconds)
        lines[-1] = f"stream {result.get('stream')}: {lines[-1]}"  # not the job's "done in"
        for line in lines:
            log.info("%s", line)

    return archive_streams(
        job.spark,
        job.settings,
        job.args.streams,
        job.args.start_ms,
        job.args.end_ms,
        run_id=job.args.run_id,
        catchup=bool(job.args.catchup),
        locked=lambda stream: stream_lock(job.settings, stop, stream, "archive"),
        check=stop.check,
        report=story,
    )


def _trim_streams(job: _Job) -> tuple[Any, bool]:
    from pipeline.lake.trimstreams import trim_streams

    stop = job.stopper()
    return trim_streams(
        job.settings,
        job.args.streams,
        now_ms=job.args.now_ms,
        locked=lambda stream: stream_lock(job.settings, stop, stream, "trim"),
        check=stop.check,
    )


def _archive(job: _Job) -> tuple[Any, bool]:
    from pipeline.lake.archive import archive_interval

    return archive_interval(
        job.spark,
        job.settings,
        job.args.stream,
        job.args.start_ms,
        job.args.end_ms,
        run_id=job.args.run_id,
        force=bool(getattr(job.args, "force", False)),
        guard=job.guard,
    ), True


def _canonical(job: _Job) -> tuple[Any, bool]:
    from pipeline.lake.canonical import mark_canonical

    return mark_canonical(job.spark, job.settings, job.args.stream), True


def _maintain(job: _Job) -> tuple[Any, bool]:
    from pipeline.lake.maintain import maintain

    return maintain(job.spark, job.settings, retain_hours=job.args.retain_hours), True


def _trim(job: _Job) -> tuple[Any, bool]:
    from pipeline.lake.trim import safe_trim

    return safe_trim(job.settings, job.args.stream, now_ms=job.args.now_ms), True


def _replay(job: _Job) -> tuple[Any, bool]:
    from pipeline.lake.replay import replay

    total = max(job.args.to_num - job.args.from_num + 1, 0)
    with reporter(
        f"replay {job.args.stream}", total, "blocks", "blocks", stream=sys.stderr
    ) as shown:
        result = replay(
            job.settings,
            job.args.stream,
            job.args.from_num,
            job.args.to_num,
            target_stream=job.args.target,
            progress=lambda n: shown.advance(n, n),
        )
    return result, True


def _audit(job: _Job) -> tuple[Any, bool]:
    from pipeline.lake.audit import audit

    report = audit(job.settings, job.args.stream)
    return report, report.ok


#: The runner of each job (any other job name: the audit, as ``sluice lake audit``).
_RUNNERS: dict[str, _Runner] = {
    "backfill": _backfill,
    "archive-streams": _archive_streams,
    "trim-streams": _trim_streams,
    "archive": _archive,
    "canonical": _canonical,
    "maintain": _maintain,
    "trim": _trim,
    "replay": _replay,
}


def _run_backfill(
    args: argparse.Namespace, settings: Settings, spark: Any, stopper: Stopper
) -> Any:
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
        return stream_lock(settings, stopper, args.stream, "backfill")

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
