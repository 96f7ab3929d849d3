"""Sluice's DAGs under a real scheduler: backfill, task logs and "Mark failed" through the API.

One system for the module: ``airflow api-server`` and ``airflow scheduler``
(LocalExecutor, parallelism 3) on PostgreSQL, the lake jobs as thin clients of the
session's Spark Connect server, one plain stream in a private Redis. The
archive DAG runs daily (``0 0 * * *``) so the scheduler starts exactly one
run on its own, for yesterday, when the DAG first appears; the data sits in
the days before it:

- days -7..-2: six intervals the backfill test archives;
- day -1: the scheduled run's interval;
- day -9: the interval of the run whose task the test marks failed;
- days -30..-19: one entry each. The scheduled run is the stream's first, so
  it archives the stream from its first entry, at most
  ``CATCHUP_MAX_STEPS`` (12) intervals holding entries per run: these twelve,
  leaving the days above to the backfill and the manual run.

Everything is written before Airflow starts, so no run can see a half-written
interval. Wall time: about 2-4 minutes for the module on a loaded 2-core
machine, most of it the scheduler's round trips.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from pipeline.lake.catchup import CATCHUP_MAX_STEPS
from pipeline.local.redisserver import LocalRedis

from .deployment import (
    DAG,
    DAY,
    Deployment,
    dag_runs,
    failures,
    get,
    lake_ids,
    local_deployment,
    log_rows,
    ms,
    wait,
)

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.timeout(900)]

log = logging.getLogger(__name__)

STREAM = "events:sched"
SCHED_REDIS_DB = 12
BACKFILL_DAYS = 6
#: The oldest days, one entry each: all the scheduled run catches up of the stream's past.
FILLER_DAYS = tuple(range(-30, -30 + CATCHUP_MAX_STEPS))


@pytest.fixture(scope="module")
def system(
    request: pytest.FixtureRequest,
    view_redis: LocalRedis,
    airflow_database: Callable[[], str],
) -> Iterator[Deployment]:
    days = (*FILLER_DAYS, -9, *range(-7, 0))
    with local_deployment(
        request,
        view_redis,
        airflow_database(),
        stream=STREAM,
        db=SCHED_REDIS_DB,
        counts={day: 1 if day in FILLER_DAYS else 3 + day % 3 for day in days},
        seqs=2,
        parallelism=3,
        # The task's supervisor learns of "Mark failed" at its next heartbeat (default
        # every 5 s), then SIGTERMs the task (on_kill) and SIGKILLs it 5 s later.
        extra={"AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "1"},
    ) as deployment:
        yield deployment


def test_backfill_of_six_intervals_beside_the_scheduled_run(system: Deployment) -> None:
    began = time.monotonic()
    first = system.today - BACKFILL_DAYS * DAY - DAY
    with system.client() as http:
        body = {
            "dag_id": DAG,
            "from_date": first.isoformat(),
            "to_date": (first + (BACKFILL_DAYS - 1) * DAY).isoformat(),
            # the default (10): all six at once, next to the scheduled run
            "max_active_runs": 10,
        }

        # SQLite: the scheduler's writes can hold the lock the creation needs. The API
        # answers 503, or 500 "Database error" when the lock times out inside the
        # creation's one transaction (rolled back, so a retry cannot create two); retry.
        def locked(r: Any) -> bool:
            return r.status_code == 503 or (r.status_code == 500 and "Database error" in r.text)

        reply = wait(
            "a backfill the database accepts",
            lambda: not locked(r := http.post("/api/v2/backfills", json=body)) and r,
            deadline_s=120,  # a locked attempt answers after the 15 s busy timeout
        )
        assert reply.status_code == 200, reply.text

        def settled() -> list[dict[str, Any]] | None:
            runs = [r for r in dag_runs(http) if r["run_type"] == "backfill"]
            done = [r for r in runs if r["state"] in ("success", "failed")]
            return runs if len(runs) == BACKFILL_DAYS and len(done) == len(runs) else None

        backfill = wait("the backfill runs", settled)
        scheduled = wait(
            "the scheduled run",
            lambda: [
                r
                for r in dag_runs(http)
                if r["run_type"] == "scheduled" and r["state"] in ("success", "failed")
            ],
        )
        # Every Sluice DAG came up unpaused (a paused DAG's runs sit queued, silently).
        for dag_id in ("sluice_archive", "sluice_audit", "sluice_maintenance", "sluice_replay"):
            assert get(http, f"/api/v2/dags/{dag_id}")["is_paused"] is False, dag_id
        # The maintenance DAG runs at 03:00 only: starting Airflow did not run it.
        assert get(http, "/api/v2/dags/sluice_maintenance/dagRuns")["total_entries"] == 0
        failed = failures(http, [*backfill, *scheduled])
    log.info("backfill of %d intervals: %.1fs", BACKFILL_DAYS, time.monotonic() - began)
    assert not failed, "\n\n".join(failed)
    assert {r["state"] for r in backfill} == {"success"}, backfill
    assert [r["state"] for r in scheduled] == ["success"], scheduled
    starts = sorted(r["data_interval_start"] for r in backfill)
    assert [datetime.fromisoformat(s) for s in starts] == [
        first + k * DAY for k in range(BACKFILL_DAYS)
    ]
    # The lake holds exactly what Redis held, interval by interval, and the log has no hole.
    for day in range(-7, 0):
        lo, hi = system.interval(day)
        assert lake_ids(system.lake, STREAM, lo, hi) == system.ids[day], f"day {day}"
    # The scheduled run, the stream's first, archived the twelve oldest days holding entries
    # (its bound) with its own; the backfill the six days after them.
    split = system.interval(-9)[0]
    old = [r for r in log_rows(system.lake, STREAM) if r[0] < split]
    rows = [r for r in log_rows(system.lake, STREAM) if r[0] >= split]
    assert [(lo, hi) for lo, hi, _ in old] == [system.interval(d) for d in FILLER_DAYS]
    assert [(lo, hi) for lo, hi, _ in rows] == [system.interval(d) for d in range(-7, 0)]
    assert [n for _, _, n in rows] == [len(system.ids[d]) for d in range(-7, 0)]


def test_task_log_tells_the_job_story_without_spark_noise(system: Deployment) -> None:
    lo, _ = system.interval(-5)
    with system.client() as http:
        run = next(
            r
            for r in dag_runs(http)
            if r["run_type"] == "backfill"
            and ms(datetime.fromisoformat(r["data_interval_start"])) == lo
        )
        base = f"/api/v2/dags/{DAG}/dagRuns/{quote(run['dag_run_id'], safe='')}/taskInstances"
        # the story is the shared job's (archive_streams); the stream's shard task has its result
        content = get(http, f"{base}/archive_streams/logs/1", map_index=-1, full_content="true")[
            "content"
        ]
        mine = get(http, f"{base}/archive/logs/1", map_index=0, full_content="true")["content"]
        result = get(http, f"{base}/archive/xcomEntries/return_value", map_index=0)["value"]
    events = [str(e.get("event", "")) for e in content if isinstance(e, dict)]
    text = "\n".join(events)
    told = "\n".join(str(e.get("event", "")) for e in mine if isinstance(e, dict))
    # The job's story: what ran on which Spark, what it read and wrote, stages, rate.
    assert f"sluice lake archive of {STREAM}" in text and "Spark Connect" in text, text[-3000:]
    entries = len(system.ids[-5])
    assert f"{entries} entries read, {entries} in the lake for the interval" in text, text[-3000:]
    assert "0 invalid" in text and "stages: check " in text and "entries/s)" in text
    # No Spark, Ivy or log4j chatter (it goes to the job's debug file).
    for noise in ("ivy", "log4j", ":: resolving", "org.apache.spark", "sparkcontext"):
        assert noise not in text.lower(), noise
    assert len(events) < 60, f"{len(events)} log lines"
    assert isinstance(result, list) and len(result) == 1, result  # the shard of one stream
    (result,) = result
    assert result["entries"] == entries and result["warnings"] == 0
    assert f"stream {STREAM}: archived by archive_streams: {entries} entries read" in told, told
    assert "caught_up" not in result  # a backfill run archives only its own interval


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def test_mark_failed_stops_the_job_at_once_and_nothing_is_committed(system: Deployment) -> None:
    lo, hi = system.interval(-9)
    start = system.today - 9 * DAY
    with system.client() as http:

        def quiet() -> bool:
            runs = dag_runs(http)
            active = [r for r in runs if r["state"] in ("queued", "running")]
            return any(r["run_type"] == "scheduled" for r in runs) and not active

        wait("the scheduled run to end and no run active", quiet)
        # Arm the hold: the archive job of this interval stops before its Spark work.
        system.hold.write_text(f"--start-ms {lo} ")
        try:
            reply = http.post(
                f"/api/v2/dags/{DAG}/dagRuns",
                json={
                    "dag_run_id": "manual__mark-failed",
                    "logical_date": start.isoformat(),
                    "data_interval_start": start.isoformat(),
                    "data_interval_end": (start + DAY).isoformat(),
                },
            )
            assert reply.status_code == 200, reply.text
            held = wait("the job to hold", lambda: system.hold.read_text().startswith("pid:"))
            assert held
            pid = int(system.hold.read_text().removeprefix("pid:"))
            assert _alive(pid)
            marked = time.monotonic()
            reply = http.patch(
                f"/api/v2/dags/{DAG}/dagRuns/manual__mark-failed/taskInstances/archive_streams",
                json={"new_state": "failed"},
            )
            assert reply.status_code == 200, reply.text
            wait("the job to stop", lambda: not _alive(pid), deadline_s=10)
            stopped = time.monotonic() - marked
        finally:
            system.hold.unlink(missing_ok=True)
        log.info("job stopped %.2fs after the mark", stopped)
        # The mark reaches the task at its next heartbeat (1 s here); the job is gone
        # at once after that, well before Airflow's SIGKILL 5 s after its SIGTERM.
        assert stopped < 3.0, stopped
        run = wait(
            "the run to end",
            lambda: (
                (r := get(http, f"/api/v2/dags/{DAG}/dagRuns/manual__mark-failed"))["state"]
                in ("failed", "success")
                and r
            ),
        )
        assert run["state"] == "failed"
        base = f"/api/v2/dags/{DAG}/dagRuns/manual__mark-failed/taskInstances/archive_streams"
        content = get(http, f"{base}/logs/1", map_index=-1, full_content="true")["content"]
        # the per-stream tasks after the stopped job did not run (nothing archived them)
        after = get(http, f"/api/v2/dags/{DAG}/dagRuns/manual__mark-failed/taskInstances")
        states = {t["task_id"]: t["state"] for t in after["task_instances"]}
        assert states.get("archive") == "upstream_failed", states
    text = "\n".join(str(e.get("event", "")) for e in content if isinstance(e, dict))
    assert "task killed: stopped 1 running lake job(s)" in text, text[-3000:]
    # Nothing of the interval was committed, then or later.
    assert (lo, hi) not in [(a, b) for a, b, _ in log_rows(system.lake, STREAM)]
    assert lake_ids(system.lake, STREAM, lo, hi) == []
