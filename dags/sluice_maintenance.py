"""``sluice_maintenance``: daily OPTIMIZE and VACUUM of the lake tables.

Compaction keeps the JVM-free reader fast (fewer, larger files, ordered by
``num``); VACUUM removes files no snapshot younger than ``retain_hours``
needs. Both are safe to repeat.

It runs at 03:00 UTC every day and only then: the schedule is a
``CronTriggerTimetable`` with no ``start_date`` and ``run_immediately`` of
zero, so starting Airflow (or deploying the DAG) does not run a "missed" day
at once. (``run_immediately=False`` is not "never": Airflow 3.3 then still
runs the last 03:00 when the DAG is first seen within a tenth of the period
after it, i.e. before 05:24.) Trigger it by hand to run it now.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import Param, dag
from airflow.timetables.trigger import CronTriggerTimetable
from sluice_dag_common import default_args, load_settings
from sluice_lake_operator import LakeJobOperator

_settings = load_settings()


@dag(
    dag_id="sluice_maintenance",
    # No start_date: with one, the first run would be the last 03:00 already past.
    schedule=CronTriggerTimetable("0 3 * * *", timezone="UTC", run_immediately=timedelta(0)),
    catchup=False,
    max_active_runs=1,
    is_paused_upon_creation=False,
    default_args=default_args(_settings),
    params={
        # Below the longest lake job's limit VACUUM could delete a running archive's
        # files before their commit: refused (the job refuses it too).
        "retain_hours": Param(
            max(168, _settings.lake.min_retain_hours),
            type="integer",
            minimum=_settings.lake.min_retain_hours,
            description="VACUUM keeps files this many hours (at least the longest job's limit)",
        ),
    },
    tags=["sluice", "lake"],
    doc_md=__doc__,
)
def sluice_maintenance() -> None:
    LakeJobOperator(
        task_id="maintain",
        job="maintain",
        extra_args=["--retain-hours", "{{ params.retain_hours }}"],
    )


sluice_maintenance()
