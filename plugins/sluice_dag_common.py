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
from sluice_lake_job import run_lake_job
from sluice_redis_hook import SluiceRedisHook

from pipeline.settings import Settings

log = logging.getLogger(__name__)

#: Updated by every successful ``sluice_archive`` run; schedules ``sluice_audit``.
LAKE_BLOCKS = Asset("sluice://lake/blocks", group="sluice")


def default_args(settings: Settings) -> dict[str, Any]:
    """Task defaults of the lake DAGs: Delta commits are atomic and every job is
    idempotent for its interval, so a retry is always safe."""
    return {
        "owner": "sluice",
        "retries": settings.lake_task_retries,
        "retry_delay": timedelta(seconds=60),
        # The job's own limit kills it first; this is the backstop.
        "execution_timeout": timedelta(seconds=settings.lake_job_timeout_s + 120),
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


def lake_job(
    job: str,
    *args: str,
    settings: Settings | None = None,
    report_codes: frozenset[int] = frozenset(),
) -> Any:
    """Run one lake job for the current task and return its JSON result (the XCom)."""
    settings = settings or load_settings()
    return run_lake_job(
        job,
        list(args),
        env=job_env(settings),
        timeout_s=float(settings.lake_job_timeout_s),
        report_codes=report_codes,
    )
