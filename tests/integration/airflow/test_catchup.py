"""``sluice_archive`` leaves no hole: a run archives the intervals the scheduler skipped.

The lake already records interval 1 of a stream; intervals 2 and 3 hold
entries in Redis. One run for interval 3 (as the scheduler starts it after a
run overran interval 2) must archive interval 2 first, then its own, so that
``archive_log`` is contiguous and the lake holds exactly what Redis held.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
import redis

from pipeline import keys
from pipeline.lake.storage.tables import ARCHIVE_LOG, ARCHIVE_LOG_ARROW
from pipeline.lake.write.jobs import ensure_tables
from pipeline.settings import LakeSettings
from tests.integration.airflow import scenario as sc
from tests.integration.airflow.conftest import AIRFLOW_WARNINGS, DagRunner, task_states

pytestmark = [pytest.mark.airflow, pytest.mark.spark, AIRFLOW_WARNINGS]

STREAM = "events:catchup"
FIRST = datetime(2026, 6, 2, 12, 0, tzinfo=UTC)  # interval 1 starts here
W = timedelta(minutes=5)


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def test_a_run_archives_the_skipped_interval_before_its_own(
    dag_runner: DagRunner, lake_redis: redis.Redis, lake_redis_url: str, tmp_path: Path
) -> None:
    from deltalake import write_deltalake

    lake = str(tmp_path / "lake")
    ensure_tables(LakeSettings.from_url(lake))
    b0, b1, b2, b3 = (_ms(FIRST + k * W) for k in range(4))
    # Interval 1 archived by an earlier run (it held nothing).
    write_deltalake(
        f"{lake}/{ARCHIVE_LOG}",
        pa.Table.from_pylist(
            [
                {
                    "stream": STREAM,
                    "start_ms": b0,
                    "end_ms": b1,
                    "entries": 0,
                    "blocks": 0,
                    "invalid": 0,
                    "first_id": None,
                    "last_id": None,
                    "run_id": "scheduled__earlier",
                    "archived_at": datetime.now(UTC),
                }
            ],
            schema=ARCHIVE_LOG_ARROW,
        ),
        mode="append",
    )
    key = keys.stream(STREAM)
    lake_redis.delete(key)
    ids = [f"{b1 + 1000 * i}-0" for i in range(4)] + [f"{b2 + 7000 * i}-0" for i in range(3)]
    ids.append(f"{b3 + 5}-0")  # after interval 3: not archived by this run
    for entry_id in ids:
        lake_redis.xadd(key, {b"n": entry_id.encode()}, id=entry_id)

    env = {
        "SLUICE_REDIS_URL": lake_redis_url,
        "SLUICE_LAKE_URI": lake,
        "SLUICE_STREAMS": STREAM,
        "SLUICE_CHAIN_STREAMS": "",
        "SLUICE_HOT_RETENTION_S": str(10 * 365 * 86400),
    }
    run = dag_runner.run("sluice_archive", FIRST + 3 * W, env=env)
    states = task_states(run)
    assert str(run.state) == "success", states
    assert (run.data_interval_start, run.data_interval_end) == (FIRST + 2 * W, FIRST + 3 * W)

    log = sorted(
        (r["start_ms"], r["end_ms"], r["entries"]) for r in sc.table_rows(lake, "archive_log")
    )
    assert log == [(b0, b1, 0), (b1, b2, 4), (b2, b3, 3)]
    entries = sorted(
        (r["entry_ms"], r["entry_seq"])
        for r in sc.table_rows(lake, "stream_entries")
        if r["stream"] == STREAM
    )
    assert [f"{ms}-{seq}" for ms, seq in entries] == ids[:-1]

    (result,) = next(  # the one shard's results: one stream
        ti.xcom_pull(task_ids="archive", map_indexes=0)
        for ti in run.get_task_instances()
        if ti.task_id == "publish"
    )
    assert (result["start_ms"], result["end_ms"], result["entries"]) == (b2, b3, 3)
    assert [(s["start_ms"], s["end_ms"], s["entries"]) for s in result["caught_up"]] == [
        (b1, b2, 4)
    ]
