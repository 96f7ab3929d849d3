"""``sluice_archive``: archive every configured stream's data interval into Delta.

Each run owns exactly its data interval ``[data_interval_start,
data_interval_end)``; Redis entry ids are milliseconds, so the interval is an
id range. ``archive_streams`` archives the range of every stream into
``stream_entries`` / ``blocks`` / ``archive_log`` in one lake job (one
process and Spark session for all streams); ``archive`` (mapped, one task per
stream) is each stream's result, and archives the stream again on its own
when it failed in the shared job, with its own retries. Then the canonical
chain of every chain stream is marked, and Redis trimmed below what
``archive_log`` proves archived and older than the hot-retention window: one
``trim`` job for every stream (each stream's result in its XCom and its log
lines; the task fails, and is retried, when a stream failed). Every step is
idempotent for its interval, so re-runs, retries and Airflow 3 backfills
(``airflow backfill create --dag-id sluice_archive ...``) just work.

The schedule is ``SLUICE_ARCHIVE_CRON`` (default every 5 minutes) as a
``CronDataIntervalTimetable`` in UTC. The DAG is unpaused on creation:
archiving is what a user deploying Sluice expects to start.

No interval is ever left out. Airflow's catchup is off and one run is active
at a time, so when a run overruns its interval the scheduler skips the
intervals in between and starts the newest one. Each run therefore
archives, per stream and before its own interval, the holes ``archive_log`` shows for its
stream since the stream's first row (skipped intervals, or intervals whose
run failed), oldest first, in interval-wide steps, at most
``CATCHUP_MAX_STEPS`` (12) per stream; what is left waits for the next run,
which again takes the oldest. Coverage thus stays contiguous, which is what
lets trim advance. Chain streams too: the canonical job walks down through
marked blocks to any height left unmarked, so blocks filled in below
canonical ones are marked, and trim keeps them in Redis until they are.
A stream's history before its first archived interval is
not chased: backfill it (below). Catchup=True was rejected: it would start
one run per interval since ``start_date`` on a fresh deployment, and a
skipped interval would still cost a whole DAG run.

One lake job for all streams, and a mapped task per stream for the results:
measured with ``make bench B=airflow`` (``archive_streams_per_task_s``), four
streams archived as four job children took 4.7 s against 2.2 s in one job
(load 1.3): each child pays for its process and Spark session (about 0.6 s
per stream and run through Connect, seconds more in local mode), while the
archive itself costs about half a second. The mapped per-stream tasks start
no job when their stream succeeded in the shared one, so results, warnings,
failures and retries stay visible per stream (a stream failing there is
archived again by its own task; a retry of that task runs its own job too).

A run of 100 streams (``make bench B=airflow``, ``airflow_run_100_streams_s``)
took 266-268 s when the shared job archived one stream after another, 100
``trim`` jobs ran one child each, and the mapped tasks ran one at a time.
Now the shared job archives ``SLUICE_ARCHIVE_JOB_WORKERS`` streams at once
(a slow stream, such as a chain interval taking the MERGE path, holds one
worker, not the others) and runs what its workers write at the same moment
as one Spark job and one commit (:mod:`pipeline.lake.write.arrowbatch`), one job
trims every stream (a task per stream cost more than its trim), and the
mapped ``archive`` tasks, which only read the shared job's XCom, are not
bounded: only the tasks that start Spark jobs (``archive_streams``,
``canonical``) are.

Through a real scheduler (LocalExecutor on PostgreSQL, ``SLUICE_BENCH_ONLY=sched``,
``airflow_run_100_streams_sched_s``) the 100-stream run took 96 s at
``AIRFLOW__CORE__PARALLELISM=4`` and 38 s at 8 (load 2-4): the mapped tasks
run in 0.3 s each, but Airflow spends about 2.5 s per task instance between
slots, so at 4 slots they took 71 s. Every task process also parses this file
and runs every module of the plugins folder (Airflow loads the plugins for
their macros): the coverage plugin builds its FastAPI app only when the API
server asks for it, and the hook imports redis-py only for its connection
test (together 0.3 CPU-s less per task; tests/unit/airflow/test_task_imports.py).

Retries back off exponentially: 30 s, 1 min, 2 min, ... capped at 10 min
(``SLUICE_LAKE_TASK_RETRIES`` retries).

The lake jobs run as child processes (plugins/sluice_lake_job.py) through
``LakeJobOperator`` and its archive subclasses, whose ``on_kill`` stops the
job at once when the task is marked failed (marking ``archive_streams``
failed stops the shared job, and the per-stream tasks after it do not run). With ``SLUICE_SPARK_REMOTE`` (a ``sluice spark`` server, or
the Connect service of docker/) each child is a thin client: a task costs
seconds. An interval already archived (a manual trigger repeats the last
scheduled interval) or with no entry in Redis never touches Spark.

Backfills: ``airflow backfill create`` runs up to its own
``--max-active-runs`` (default 10) runs at once, next to the scheduled run.
A backfill run archives only its own interval (no catch-up steps).
That is safe: archive, canonical and trim of one stream hold the stream's
archive lock in Redis (a second job on the stream waits for it, up to
``SLUICE_LAKE_LOCK_WAIT_S``), every step is idempotent per interval, and
``SLUICE_ARCHIVE_PARALLELISM`` (default 1) bounds how many
``archive_streams``/``canonical`` tasks of this DAG run at once across all runs. Pass ``--max-active-runs`` to
bound the runs themselves. Chain streams are no exception: blocks a
backfill archives below canonical ones are marked by the next canonical job,
and trim keeps every block that job has yet to mark.
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

_settings = load_settings()


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


# No chain stream configured: the mapped canonical task is skipped, not failed.
@task(trigger_rule="none_failed", outlets=[LAKE_BLOCKS])
def publish(archived: list[dict[str, Any]], trimmed: dict[str, Any]) -> dict[str, Any]:
    """Emit the lake Asset (schedules ``sluice_audit``) with a summary of the run."""
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
    max_active_runs=1,
    is_paused_upon_creation=False,
    default_args=default_args(_settings),
    tags=["sluice", "lake"],
    doc_md=__doc__,
)
def sluice_archive() -> None:
    # Each stream's result: read from the shared job's XCom, no job of its own unless the
    # stream failed there (or on a retry). Not bounded: 100 of them would otherwise run
    # one after another, each costing a task's start-up to read one XCom.
    archive = StreamArchiveOperator.partial(task_id="archive", batch_task_id="archive_streams")
    canonical = LakeJobOperator.partial(
        task_id="canonical",
        job="canonical",
        max_active_tis_per_dag=_settings.lake.archive_parallelism,
    )
    names = streams()
    # One job for every stream (a retry of it skips what it archived already), then
    # each stream's result; a stream that failed in the job is archived by its task.
    shared = ArchiveStreamsOperator(
        task_id="archive_streams",
        streams=names,
        max_active_tis_per_dag=_settings.lake.archive_parallelism,
    )
    archived = archive.expand(stream=names)
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
