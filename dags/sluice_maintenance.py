"""``sluice_maintenance``: daily OPTIMIZE and VACUUM of the lake tables.

Compaction keeps the JVM-free reader fast (fewer, larger files, ordered by
``num``); VACUUM removes files no snapshot younger than ``retain_hours``
needs. Both are safe to repeat.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from airflow.sdk import Param, dag, get_current_context, task
from sluice_dag_common import default_args, lake_job, load_settings

_settings = load_settings()


@dag(
    dag_id="sluice_maintenance",
    schedule="@daily",
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    default_args=default_args(_settings),
    params={
        "retain_hours": Param(
            168, type="integer", minimum=0, description="VACUUM keeps files this many hours"
        ),
    },
    tags=["sluice", "lake"],
    doc_md=__doc__,
)
def sluice_maintenance() -> None:
    @task
    def maintain() -> dict[str, Any]:
        retain = int(get_current_context()["params"]["retain_hours"])
        result: dict[str, Any] = lake_job("maintain", "--retain-hours", str(retain))
        return result

    maintain()


sluice_maintenance()
