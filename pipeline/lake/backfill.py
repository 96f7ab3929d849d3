"""``sluice lake backfill``: archive every missing interval of a stream, one after another.

The intervals are the archive DAG's: consecutive fire times of
``SLUICE_ARCHIVE_CRON`` in UTC (as ``CronDataIntervalTimetable`` makes
them), so a row the backfill writes to ``archive_log`` is the row the
scheduled run of that interval would write, and that run then finds it
archived and reads nothing.

Where it starts:

- ``--since ISO``: the interval holding that time;
- ``--from-coverage`` (the default): where the lake's coverage of what Redis
  still holds ends, i.e. the end of the archived run that contains the
  oldest entry in Redis (the point the safe trim stops at); if no archived
  run contains it, the interval of the oldest entry itself. Redis empty: the
  end of the newest archived run, so nothing is to do.

It stops at ``--until`` (default: now), at the last interval that is closed
by Redis' clock (no entry can still land in it). Intervals ``archive_log``
already covers are counted and left alone; every other one goes through
:func:`pipeline.lake.archive.archive_interval`, the function the DAG's task
runs, holding the stream's archive lock for that interval only (a scheduled
run of the DAG can slip in between two intervals). Each interval is
idempotent, so a backfill stopped anywhere and run again finishes the job.
The blocks it writes are marked canonical by the next ``sluice_archive`` run
or ``sluice lake canonical``, below canonical ones too (the canonical walk
goes down to any height left unmarked), and trim keeps them in Redis until
then.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from pipeline import keys
from pipeline.errors import ConfigError, RedisUnavailable
from pipeline.lake.progress import Reporter
from pipeline.settings import Settings

log = logging.getLogger("pipeline.lake.job")

#: Most intervals one backfill plans (a week of a one-minute cron is 10,080).
MAX_INTERVALS = 100_000


# --- pure: times, cron intervals, the plan -------------------------------------------


def parse_time(text: str, flag: str) -> int:
    """An ISO 8601 time (``2026-11-26T07:00``, ``...Z``, ``...+01:00``; no zone = UTC) in ms.

    Raises :class:`ConfigError` naming ``flag`` on anything else.
    """
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigError(
            f"{flag}: not an ISO 8601 time: {text!r} (e.g. 2026-11-26T07:00:00Z)"
        ) from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return int(value.timestamp() * 1000)


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _cron(cron: str, ms: int) -> Any:
    from croniter import croniter  # type: ignore[import-untyped]

    if not croniter.is_valid(cron):
        raise ConfigError(f"archive_cron: not a cron expression: {cron!r}")
    # +1 ms: a time exactly on a fire time floors to itself, not to the one before
    return croniter(cron, datetime.fromtimestamp(ms / 1000, UTC) + timedelta(milliseconds=1))


def floor_to_cron(cron: str, ms: int) -> int:
    """The last fire time of ``cron`` (UTC) at or before ``ms``."""
    return int(_cron(cron, ms).get_prev(datetime).timestamp() * 1000)


def cron_intervals(cron: str, start_ms: int, end_ms: int) -> list[tuple[int, int]]:
    """The DAG's intervals from the one holding ``start_ms`` to the last ending by ``end_ms``.

    Raises :class:`ConfigError` past :data:`MAX_INTERVALS`.
    """
    first = floor_to_cron(cron, start_ms)
    it = _cron(cron, first)
    out: list[tuple[int, int]] = []
    lo = first
    while lo < end_ms:
        hi = int(it.get_next(datetime).timestamp() * 1000)
        if hi > end_ms:
            break
        out.append((lo, hi))
        if len(out) > MAX_INTERVALS:
            raise ConfigError(
                f"{iso(first)} to {iso(end_ms)} is over {MAX_INTERVALS:,} archive intervals: "
                "narrow --since/--until"
            )
        lo = hi
    return out


def merge(intervals: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    from pipeline.intervals import merge_intervals

    return merge_intervals(intervals)


def coverage_start(
    runs: Sequence[tuple[int, int]], oldest_ms: int | None
) -> tuple[int | None, str]:
    """Where ``--from-coverage`` starts, and why (see the module docstring)."""
    if oldest_ms is None:
        if runs:
            return runs[-1][1], "the end of the lake's coverage (Redis is empty)"
        return None, "nothing archived and nothing in Redis"
    for start, end in runs:
        if start <= oldest_ms < end:
            return end, "the end of the lake's coverage of what Redis holds"
    return oldest_ms, "the oldest entry in Redis (the lake does not cover it)"


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """What one backfill will do."""

    stream: str
    #: first interval's start and last interval's end (equal when nothing is to do)
    start_ms: int
    end_ms: int
    #: intervals to archive, oldest first
    todo: tuple[tuple[int, int], ...]
    #: intervals of the range that ``archive_log`` covers already (left alone)
    covered: int
    #: where the range starts, in words
    origin: str


def plan(
    cron: str,
    stream: str,
    *,
    logged: Sequence[tuple[int, int]],
    oldest_ms: int | None,
    now_ms: int,
    since_ms: int | None = None,
    until_ms: int | None = None,
) -> Plan:
    """The intervals to archive, from what ``archive_log`` holds and what Redis holds."""
    runs = merge(logged)
    if since_ms is not None:
        start: int | None = since_ms
        origin = "--since"
    else:
        start, origin = coverage_start(runs, oldest_ms)
    end = now_ms if until_ms is None else min(until_ms, now_ms)
    if start is None or start >= end:
        at = end if start is None else start
        return Plan(stream=stream, start_ms=at, end_ms=at, todo=(), covered=0, origin=origin)
    every = cron_intervals(cron, start, end)
    todo = tuple(i for i in every if not _covered(runs, i))
    first = every[0][0] if every else start
    last = every[-1][1] if every else first
    return Plan(
        stream=stream,
        start_ms=first,
        end_ms=last,
        todo=todo,
        covered=len(every) - len(todo),
        origin=origin,
    )


def _covered(runs: Sequence[tuple[int, int]], interval: tuple[int, int]) -> bool:
    return any(a <= interval[0] and interval[1] <= b for a, b in runs)


# --- I/O: what the lake and Redis hold, and the loop ---------------------------------


def read_state(settings: Settings, stream: str) -> tuple[list[tuple[int, int]], int | None, int]:
    """``archive_log``'s intervals of ``stream``, the oldest entry's ms in Redis, Redis' clock (ms)."""

    from pipeline.lake.intake.redisread import connect, parse_id
    from pipeline.lake.trim import logged_intervals
    from pipeline.redisio.conn import UNAVAILABLE

    logged = logged_intervals(settings.lake, stream)
    client = connect(settings.redis.url)
    try:
        oldest = client.xrange(keys.stream(stream), "-", "+", count=1)
        seconds, micros = client.time()
    except UNAVAILABLE as exc:
        raise RedisUnavailable(
            f"redis at {settings.redis.host}:{settings.redis.port} is unavailable: {exc}"
        ) from exc
    finally:
        client.close()
    oldest_ms = parse_id(oldest[0][0])[0] if oldest else None
    return logged, oldest_ms, int(seconds) * 1000 + int(micros) // 1000


@dataclass(frozen=True, slots=True, kw_only=True)
class BackfillResult:
    stream: str
    start_ms: int
    end_ms: int
    #: intervals this run archived (each now has its ``archive_log`` row)
    intervals: int
    #: intervals ``archive_log`` covered before the run
    covered: int
    #: entries the lake holds for the archived intervals, and how many this run read from Redis
    entries: int
    read: int
    blocks: int
    invalid: int


def run_backfill(
    spark: Any,
    settings: Settings,
    todo: Plan,
    *,
    progress: Reporter,
    locked: Callable[[], Any],
    check: Callable[[], None],
) -> BackfillResult:
    """Archive ``todo``'s intervals in order, one :func:`archive_interval` each.

    ``locked()`` returns a context manager holding the stream's archive lock
    (taken per interval) whose value has ``check()``; ``check`` is the job's
    stop guard. Both are called right before each interval's log commit.
    """
    from pipeline.lake.archive import archive_interval

    entries = read = blocks = invalid = 0
    for start_ms, end_ms in todo.todo:
        with locked() as lock:

            def guard(lock: Any = lock) -> None:
                check()
                lock.check()

            result = archive_interval(
                spark,
                settings,
                todo.stream,
                start_ms,
                end_ms,
                run_id=f"backfill__{iso(start_ms)}",
                guard=guard,
            )
        entries += result.entries
        read += result.read
        blocks += result.blocks
        invalid += result.invalid
        progress.advance(1, result.entries)
    return BackfillResult(
        stream=todo.stream,
        start_ms=todo.start_ms,
        end_ms=todo.end_ms,
        intervals=len(todo.todo),
        covered=todo.covered,
        entries=entries,
        read=read,
        blocks=blocks,
        invalid=invalid,
    )
