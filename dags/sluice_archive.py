"""``sluice_archive``: archive every configured stream's data interval into Delta.

Each run owns exactly its data interval ``[data_interval_start,
data_interval_end)``; Redis entry ids are milliseconds, so the interval is an
id range. Per stream (one mapped task each): archive the range into
``stream_entries`` / ``blocks`` / ``archive_log``; then mark the canonical
chain of every chain stream; then trim Redis below what ``archive_log``
proves archived and older than the hot-retention window. Every step is
idempotent for its interval, so re-runs, retries and Airflow 3 backfills
(``airflow backfill create --dag-id sluice_archive ...``) just work.

The schedule is ``SLUICE_ARCHIVE_CRON`` (default every 5 minutes) as a
``CronDataIntervalTimetable`` in UTC; catchup is off (use a backfill for the
past). The lake jobs run as child processes (plugins/sluice_lake_job.py).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from airflow.sdk import dag, get_current_context, task
from airflow.timetables.interval import CronDataIntervalTimetable
from sluice_dag_common import LAKE_BLOCKS, default_args, interval_ms, lake_job, load_settings

_settings = load_settings()


@dag(
    dag_id="sluice_archive",
    schedule=CronDataIntervalTimetable(_settings.archive_cron, timezone="UTC"),
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    default_args=default_args(_settings),
    tags=["sluice", "lake"],
    doc_md=__doc__,
)
def sluice_archive() -> None:
    @task
    def streams() -> list[str]:
        """The streams to archive (``SLUICE_STREAMS``), read when the run starts."""
        return list(load_settings().streams)

    @task
    def chain_streams() -> list[str]:
        """The archived streams that carry blocks (``SLUICE_CHAIN_STREAMS``)."""
        settings = load_settings()
        return [name for name in settings.chain_streams if name in settings.streams]

    @task(max_active_tis_per_dag=_settings.archive_parallelism)
    def archive(stream: str) -> dict[str, Any]:
        context = get_current_context()
        start_ms, end_ms = interval_ms(
            context.get("data_interval_start"), context.get("data_interval_end")
        )
        result: dict[str, Any] = lake_job(
            "archive",
            "--stream", stream,
            "--start-ms", str(start_ms),
            "--end-ms", str(end_ms),
            "--run-id", str(context["run_id"]),
        )  # fmt: skip
        return result

    @task(max_active_tis_per_dag=_settings.archive_parallelism)
    def canonical(stream: str) -> dict[str, Any]:
        result: dict[str, Any] = lake_job("canonical", "--stream", stream)
        return result

    # No chain stream configured: the mapped canonical task is skipped, not failed.
    @task(trigger_rule="none_failed")
    def trim(stream: str) -> dict[str, Any]:
        result: dict[str, Any] = lake_job("trim", "--stream", stream)
        return result

    @task(trigger_rule="none_failed", outlets=[LAKE_BLOCKS])
    def publish(archived: list[dict[str, Any]], trimmed: list[dict[str, Any]]) -> dict[str, Any]:
        """Emit the lake Asset (schedules ``sluice_audit``) with a summary of the run."""
        context = get_current_context()
        start_ms, end_ms = interval_ms(
            context.get("data_interval_start"), context.get("data_interval_end")
        )
        summary = {
            "start_ms": start_ms,
            "end_ms": end_ms,
            "streams": [r.get("stream") for r in archived],
            "archived": list(archived),
            "trimmed": list(trimmed),
        }
        context["outlet_events"][LAKE_BLOCKS].extra = {
            "start_ms": start_ms,
            "end_ms": end_ms,
            "streams": summary["streams"],
        }
        return summary

    names = streams()
    archived = archive.expand(stream=names)
    marked = canonical.expand(stream=chain_streams())
    trimmed = trim.expand(stream=names)
    archived >> marked >> trimmed
    archived >> trimmed
    publish(archived, trimmed)


sluice_archive()
