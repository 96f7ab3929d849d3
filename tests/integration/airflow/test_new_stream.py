"""``sluice_archive`` archives a stream it meets for the first time from its first entry.

The stream held entries in Redis for intervals before the run's own (it was
created, or the ``SLUICE_STREAMS`` pattern came to match it, after the
schedule started) and the lake has nothing of it. One run archives it from the
grid interval of its first entry (an empty stretch as one row), then its own
interval, and trim follows: Redis keeps only what came after the interval.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from pipeline import keys
from tests.integration.airflow import scenario as sc
from tests.integration.airflow.conftest import AIRFLOW_WARNINGS, DagRunner, task_states

pytestmark = [pytest.mark.airflow, pytest.mark.spark, AIRFLOW_WARNINGS]

STREAM = "events:newstream"
FIRST = datetime(2026, 6, 3, 12, 0, tzinfo=UTC)  # the grid line below the first entry
W = timedelta(minutes=5)


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def test_a_new_stream_is_archived_from_its_first_entry_and_trimmed_after(
    dag_runner: DagRunner, lake_redis: redis.Redis, lake_redis_url: str, tmp_path: Any
) -> None:
    lake = str(tmp_path / "lake")
    b = [_ms(FIRST + k * W) for k in range(8)]
    key = keys.stream(STREAM)
    lake_redis.delete(key)
    # two intervals with entries, three empty ones, then the run's own [b5, b6)
    before = [f"{b[0] + 1234 + 1000 * i}-0" for i in range(3)] + [f"{b[1] + 5}-0"]
    inside = [f"{b[5] + 7}-0", f"{b[6] - 1}-0"]
    after = [f"{b[6] + 3}-0"]
    for entry_id in before + inside + after:
        lake_redis.xadd(key, {b"n": entry_id.encode()}, id=entry_id)

    env = {
        "SLUICE_REDIS_URL": lake_redis_url,
        "SLUICE_LAKE_URI": lake,
        "SLUICE_STREAMS": STREAM,
        "SLUICE_CHAIN_STREAMS": "",
        "SLUICE_HOT_RETENTION_S": "60",  # the data is months old: trim may cut all it covers
    }
    run = dag_runner.run("sluice_archive", FIRST + 6 * W, env=env)
    states = task_states(run)
    assert str(run.state) == "success", states
    assert (run.data_interval_start, run.data_interval_end) == (FIRST + 5 * W, FIRST + 6 * W)

    # coverage starts at the first entry's interval and is contiguous up to the run's end
    log = sorted(
        (r["start_ms"], r["end_ms"], r["entries"]) for r in sc.table_rows(lake, "archive_log")
    )
    assert log == [(b[0], b[1], 3), (b[1], b[2], 1), (b[2], b[5], 0), (b[5], b[6], 2)]
    entries = sorted(
        (r["entry_ms"], r["entry_seq"])
        for r in sc.table_rows(lake, "stream_entries")
        if r["stream"] == STREAM
    )
    assert [f"{ms}-{seq}" for ms, seq in entries] == before + inside
    # trim followed: only what came after the interval is left in Redis
    assert [i.decode() for i, _ in lake_redis.xrange(key)] == after

    (result,) = next(  # the one shard's results: one stream
        ti.xcom_pull(task_ids="archive", map_indexes=0)
        for ti in run.get_task_instances()
        if ti.task_id == "publish"
    )
    assert [(s["start_ms"], s["end_ms"], s["entries"]) for s in result["caught_up"]] == log[:3]
