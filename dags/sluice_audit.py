"""``sluice_audit``: check the archived chains' continuity after every archive run.

Scheduled on the lake Asset that ``sluice_archive`` emits. For every chain
stream it checks that each canonical block's parent is the canonical hash at
``num - 1`` and lists the missing heights as ranges.

Decision: a broken link (a canonical block whose parent is not the canonical
block below it) or a duplicate (two canonical blocks at one height) fails the
task without retries: the canonical marking or the archive is wrong and a
human must look. Gaps are reported (task log and XCom) but do not fail: a gap
is what an interval not archived yet looks like, and the next archive run or
a backfill closes it. (``sluice lake audit`` exits 1 for any problem; its
JSON report still comes back and this task decides.)
"""

from __future__ import annotations

from datetime import UTC, datetime

from airflow.sdk import dag, task
from sluice_dag_common import LAKE_BLOCKS, default_args, load_settings
from sluice_lake_operator import AuditOperator

_settings = load_settings()


@dag(
    dag_id="sluice_audit",
    schedule=[LAKE_BLOCKS],
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    is_paused_upon_creation=False,
    default_args=default_args(_settings),
    tags=["sluice", "lake"],
    doc_md=__doc__,
)
def sluice_audit() -> None:
    @task
    def chain_streams() -> list[str]:
        from pipeline.lake.intake.streamset import resolve_now

        settings = load_settings()
        return list(resolve_now(settings, settings.lake.chain_streams).streams)

    # An operator, not @task: "Mark failed" reaches its on_kill, which stops the job.
    audit = AuditOperator.partial(task_id="audit")

    audit.expand(stream=chain_streams())


sluice_audit()
