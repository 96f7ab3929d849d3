"""``sluice_archive``: archive every configured stream's data interval into Delta.

Each run owns exactly its data interval: one lake job archives every stream
(``archive_streams``), a task per shard of at most ``SLUICE_ARCHIVE_SHARD_STREAMS``
streams reports each one's result and archives those that failed (``archive``),
chain streams are marked canonical, Redis is trimmed below what ``archive_log``
proves archived, and the lake Asset is emitted; every step is idempotent.
Schedule ``SLUICE_ARCHIVE_CRON`` (UTC), two runs at a time (a manual run starts
beside the scheduled one), unpaused; every task runs in the ``sluice_archive``
pool (plugins/sluice_pools.py), so the other DAGs always find an executor
slot. How it runs, backfills and retries: docs/guide/lake.md; the pool:
docs/operations/airflow.md; the measurements behind its shape: docs/benchmarks.md.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

from airflow.sdk import dag, get_current_context, task
from airflow.timetables.interval import CronDataIntervalTimetable
from sluice_dag_common import LAKE_BLOCKS, default_args, interval_ms, load_settings
from sluice_lake_operator import (
    ArchiveStreamsOperator,
    LakeJobOperator,
    StreamArchiveOperator,
    TrimStreamsOperator,
)
from sluice_pools import ARCHIVE_POOL, WEIGHT_RULE

_settings = load_settings()
#: Runs of the DAG at once, backfill runs aside (a backfill has its own ``max_active_runs``).
MAX_ACTIVE_RUNS = 2


# The tasks that run Python here; the DAG below wires them to the lake job operators.


@task
def streams() -> list[str]:
    """The streams to archive (``SLUICE_STREAMS``: names and glob patterns), resolved
    in Redis when the run starts (:mod:`pipeline.lake.intake.streamset`)."""
    from pipeline.lake.intake.streamset import resolve_now

    return list(resolve_now(load_settings()).streams)


@task
def chain_streams(names: list[str]) -> list[str]:
    """The run's streams that carry blocks (``SLUICE_CHAIN_STREAMS``: names, patterns)."""
    from pipeline.lake.intake.streamset import is_chain

    lake = load_settings().lake
    return [name for name in names if is_chain(lake, name)]


@task
def shards(names: list[str]) -> list[list[str]]:
    """The run's streams in shards of at most ``SLUICE_ARCHIVE_SHARD_STREAMS``: one
    ``archive`` task each (the coverage board links a stream to its shard's task)."""
    from pipeline.lake.intake.streamset import shards as cut

    return cut(names, load_settings().lake.archive_shard_streams)


# No chain stream configured: the mapped canonical task is skipped, not failed.
@task(trigger_rule="none_failed", outlets=[LAKE_BLOCKS])
def publish(by_shard: list[list[dict[str, Any]]], trimmed: dict[str, Any]) -> dict[str, Any]:
    """Emit the lake Asset (schedules ``sluice_audit``) with a summary of the run."""
    archived = [result for shard in by_shard for result in shard]
    context = get_current_context()
    start_ms, end_ms = interval_ms(
        context.get("data_interval_start"), context.get("data_interval_end")
    )
    summary: dict[str, Any] = {
        "start_ms": start_ms,
        "end_ms": end_ms,
        "streams": [r.get("stream") for r in archived],
        "archived": list(archived),
        "trimmed": list((trimmed or {}).get("streams", {}).values()),
    }
    context["outlet_events"][LAKE_BLOCKS].extra = {
        "start_ms": start_ms,
        "end_ms": end_ms,
        "streams": summary["streams"],
    }
    return summary


@dag(
    dag_id="sluice_archive",
    schedule=CronDataIntervalTimetable(_settings.lake.archive_cron, timezone="UTC"),
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    # Two: an API-triggered run starts beside the scheduled one instead of queueing
    # behind it. When the schedule overruns, the next scheduled run starts beside it:
    # harmless, each stream's steps are planned under its lock after the other run's
    # commits, so no interval is archived twice (docs/guide/lake.md).
    max_active_runs=MAX_ACTIVE_RUNS,
    is_paused_upon_creation=False,
    # The pool bounds all runs' tasks together (backfills too), below the executor's slots;
    # in it manual runs go first, then scheduled ones, then backfills (plugins/sluice_pools.py).
    default_args={**default_args(_settings), "pool": ARCHIVE_POOL, "weight_rule": WEIGHT_RULE},
    tags=["sluice", "lake"],
    doc_md=__doc__,
)
def sluice_archive() -> None:
    # Each shard's results: read from the shared job's XCom, no job of its own unless a
    # stream failed there (or on a retry). A task per shard, not per stream: 1,000 streams
    # made 1,000 task start-ups to read one XCom each (issue 33). Not bounded.
    archive = StreamArchiveOperator.partial(task_id="archive", batch_task_id="archive_streams")
    canonical = LakeJobOperator.partial(
        task_id="canonical",
        job="canonical",
        max_active_tis_per_dag=_settings.lake.archive_parallelism,
    )
    names = streams()
    # One job for every stream (a retry of it skips what it archived already), then
    # each shard's results; a stream that failed in the job is archived by its shard's task.
    # Bounded by the pool and the runs, not across runs: a backfill's runs go beside the
    # scheduled one (each stream's archive lock keeps their writes apart).
    shared = ArchiveStreamsOperator(task_id="archive_streams", streams=names)
    archived = archive.expand(streams=shards(cast(Any, names)))
    shared >> archived
    marked = canonical.expand(stream=chain_streams(cast(Any, names)))
    # One trim job for every stream: each stream's result in its XCom and log lines (a
    # trim costs milliseconds; a task per stream would cost more than the trims).
    # No chain stream configured: the mapped canonical task is skipped, not failed.
    trimmed = TrimStreamsOperator(task_id="trim", streams=names, trigger_rule="none_failed")
    archived >> marked >> trimmed
    archived >> trimmed
    # XComArgs: Airflow resolves them to the mapped tasks' results when publish runs
    publish(cast(Any, archived.output), cast(Any, trimmed.output))


sluice_archive()
