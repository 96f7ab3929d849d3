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
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import Asset
from sluice_redis_hook import SluiceRedisHook

from pipeline.settings import Settings

log = logging.getLogger(__name__)

#: Updated by every successful ``sluice_archive`` run; schedules ``sluice_audit``.
LAKE_BLOCKS = Asset("sluice://lake/blocks", group="sluice")


#: First retry after this long; each further one waits twice as long, up to the cap.
RETRY_DELAY = timedelta(seconds=10)
RETRY_MAX_DELAY = timedelta(minutes=10)


def default_args(settings: Settings) -> dict[str, Any]:
    """Task defaults of the lake DAGs: Delta commits are atomic and every job is
    idempotent for its interval, so a retry is always safe.

    Retries back off exponentially (10 s, 20 s, 40 s ... capped at 10 min,
    each up to twice that with Airflow's jitter): a task lost with its worker
    is retried within about a minute of the loss (docs/operations/celery.md),
    the default three retries still span more than a minute of a Redis, Spark
    or store outage, and a long outage does not turn into a retry every
    minute.
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
