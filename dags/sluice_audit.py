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

import logging
from datetime import UTC, datetime
from typing import Any

from airflow.sdk import dag, task
from airflow.sdk.exceptions import AirflowFailException
from sluice_dag_common import LAKE_BLOCKS, default_args, lake_job, load_settings

log = logging.getLogger(__name__)

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
        return list(load_settings().chain_streams)

    @task
    def audit(stream: str) -> dict[str, Any]:
        report: dict[str, Any] = lake_job("audit", "--stream", stream, report_codes=frozenset({1}))
        gaps = report.get("gaps") or []
        broken = report.get("broken_links") or []
        duplicates = report.get("duplicates") or []
        if gaps:
            log.warning("stream %s: %d gap(s) in the archive: %s", stream, len(gaps), gaps[:20])
        if broken or duplicates:
            raise AirflowFailException(
                f"stream {stream}: canonical chain is inconsistent: broken parent links at "
                f"{broken[:5]}, duplicate canonical heights at {duplicates[:5]}"
            )
        log.info(
            "stream %s: %s canonical blocks %s..%s, continuous: %s",
            stream, report.get("canonical_count"), report.get("first"), report.get("last"),
            not gaps,
        )  # fmt: skip
        return report

    audit.expand(stream=chain_streams())


sluice_audit()
