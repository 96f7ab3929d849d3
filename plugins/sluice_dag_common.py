"""What the Sluice DAGs share: the lake Asset, settings, intervals and the job call.

Cheap to import (no Spark, no pandas): DAG files import it at parse time.

``plugins/`` is on ``sys.path`` in every Airflow process, so DAGs import these
modules directly. They are flat, uniquely named modules (no package, no
``.airflowignore``) because Airflow's plugin loader also executes every
``.py`` file under ``plugins/`` under its bare file name; these modules have
no import-time side effects, so that second execution is harmless.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import Asset
from sluice_redis_hook import SluiceRedisHook

from pipeline.settings import Settings

log = logging.getLogger(__name__)

#: Updated by every successful ``sluice_archive`` run; schedules ``sluice_audit``.
LAKE_BLOCKS = Asset("sluice://lake/blocks", group="sluice")


#: Most earlier intervals one archive task catches up, oldest first, besides its own.
CATCHUP_MAX_STEPS = 12
#: First retry after this long; each further one waits twice as long, up to the cap.
RETRY_DELAY = timedelta(seconds=30)
RETRY_MAX_DELAY = timedelta(minutes=10)


def default_args(settings: Settings) -> dict[str, Any]:
    """Task defaults of the lake DAGs: Delta commits are atomic and every job is
    idempotent for its interval, so a retry is always safe.

    Retries back off exponentially (30 s, 1 min, 2 min ... capped at 10 min,
    with Airflow's jitter): a Redis or Spark server that is restarting gets
    room, and a long outage does not turn into a retry every minute.
    """
    return {
        "owner": "sluice",
        "retries": settings.lake.task_retries,
        "retry_delay": RETRY_DELAY,
        "retry_exponential_backoff": 2.0,
        "max_retry_delay": RETRY_MAX_DELAY,
        # The job's own limit kills it first; this is the backstop.
        "execution_timeout": timedelta(seconds=settings.lake.job_timeout_s + 120),
    }


def load_settings() -> Settings:
    """Settings from ``SLUICE_*`` and ``sluice.toml``, read when called (not cached)."""
    return Settings.load()


def interval_ms(start: datetime | None, end: datetime | None) -> tuple[int, int]:
    """A data interval as Redis entry-id milliseconds ``[start_ms, end_ms)``."""
    if start is None or end is None:
        raise ValueError("this task needs a data interval (run it through a timetable)")
    start_ms, end_ms = _ms(start), _ms(end)
    if end_ms <= start_ms:
        raise ValueError(f"empty data interval [{start}, {end})")
    return start_ms, end_ms


def archive_steps(
    logged: Iterable[tuple[int, int]],
    start_ms: int,
    end_ms: int,
    *,
    max_steps: int = CATCHUP_MAX_STEPS,
) -> list[tuple[int, int]]:
    """The intervals one archive task archives: earlier holes, oldest first, then its own.

    ``logged`` are the stream's ``archive_log`` intervals. A hole is any part
    of ``[first logged start, start_ms)`` no row covers (an interval the
    scheduler skipped because a run overran, or whose run failed); holes are
    cut on the grid of this run's interval (``end_ms - start_ms`` wide,
    anchored at ``start_ms``), so the rows look like the scheduler's. At most
    ``max_steps`` hole pieces are returned (the oldest: coverage grows
    contiguously, which is what trim needs); the rest is left to the next
    runs, each of which again takes the oldest. A stream with no row yet has
    no hole: its history before the first run is a backfill's business. The
    run's own interval ``[start_ms, end_ms)`` is always last (archiving it
    again is a cheap no-op). Chain streams are no different: the canonical job
    marks blocks filled in below canonical ones, and trim waits for it.
    """
    if not 0 <= start_ms < end_ms:
        raise ValueError(f"bad interval [{start_ms}, {end_ms})")
    width = end_ms - start_ms
    runs: list[list[int]] = []
    for lo, hi in sorted(i for i in logged if i[0] < i[1]):
        if runs and lo <= runs[-1][1]:
            runs[-1][1] = max(runs[-1][1], hi)
        else:
            runs.append([lo, hi])
    holes: list[tuple[int, int]] = []
    if runs and runs[0][0] < start_ms:
        cursor = runs[0][1]
        for lo, hi in runs[1:] + [[start_ms, start_ms]]:
            holes.append((cursor, min(lo, start_ms)))
            cursor = max(cursor, hi)
            if cursor >= start_ms:
                break
    steps: list[tuple[int, int]] = []
    for lo, hi in holes:
        while lo < hi and len(steps) < max_steps:
            # the next grid line above lo (grid: start_ms - k * width)
            edge = start_ms - ((start_ms - lo - 1) // width) * width
            steps.append((lo, min(edge, hi)))
            lo = min(edge, hi)
    return [*steps, (start_ms, end_ms)]


def _ms(moment: datetime) -> int:
    if moment.tzinfo is None:
        raise ValueError(f"naive datetime {moment!r}: data intervals are timezone-aware")
    return int(moment.timestamp() * 1000)


def job_env(
    settings: Settings, redis_conn_id: str = SluiceRedisHook.default_conn_name
) -> dict[str, str]:
    """The ``SLUICE_*`` variables a lake job child gets on top of the task's environment.

    The Redis URL comes from the Airflow connection when there is one; the lake
    URI is made absolute here, so a job does not depend on the worker's cwd.
    """
    return {
        "SLUICE_REDIS_URL": SluiceRedisHook(redis_conn_id, settings=settings).get_url(),
        "SLUICE_LAKE_URI": settings.lake.uri,
    }
