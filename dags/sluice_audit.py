"""``sluice_audit``: check the archived chains' continuity after every archive run.

Scheduled on the lake Asset that ``sluice_archive`` emits. For every chain
stream it checks that each canonical block's parent is the canonical hash at
``num - 1`` and lists the missing heights as ranges.

Decision: a broken link (a canonical block whose parent is not the canonical
block below it) fails the task without retries: the canonical marking or the
archive is wrong and a human must look. Gaps are reported (task log and XCom)
but do not fail: a gap is what an interval not archived yet looks like, and
the next archive run or a backfill closes it.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from airflow.sdk import dag, task
from airflow.sdk.exceptions import AirflowFailException
from sluice_airflow.common import LAKE_BLOCKS, default_args, lake_job, load_settings

log = logging.getLogger(__name__)

_settings = load_settings()


@dag(
    dag_id="sluice_audit",
    schedule=[LAKE_BLOCKS],
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    default_args=default_args(_settings),
    tags=["sluice", "lake"],
    doc_md=__doc__,
)
def sluice_audit() -> None:
    @task
    def chain_streams() -> list[str]:
        return list(load_settings().chain_streams)

    @task
    def audit(stream: str) -> dict[str, Any]:
        report: dict[str, Any] = lake_job("audit", "--stream", stream)
        gaps = report.get("gaps") or []
        broken = report.get("broken_links") or []
        if gaps:
            log.warning("stream %s: %d gap(s) in the archive: %s", stream, len(gaps), gaps[:20])
        if broken:
            raise AirflowFailException(
                f"stream {stream}: {len(broken)} broken parent link(s) among canonical "
                f"blocks, first: {broken[:5]}"
            )
        return report

    audit.expand(stream=chain_streams())


sluice_audit()
