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
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse, urlunparse

import httpx
import pytest
import redis

from pipeline import keys
from pipeline.lake.catchup import CATCHUP_MAX_STEPS
from pipeline.local.redisserver import LocalRedis
from pipeline.runtime.ports import free_port
from tests.integration.lake.connect import shared_server
from tests.support.poll import until_sync

from .conftest import airflow_env, start_api_server

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.timeout(900)]

log = logging.getLogger(__name__)

DAG = "sluice_archive"
STREAM = "events:sched"
SCHED_REDIS_DB = 12
DAY = timedelta(days=1)
BACKFILL_DAYS = 6
#: The oldest days, one entry each: all the scheduled run catches up of the stream's past.
FILLER_DAYS = tuple(range(-30, -30 + CATCHUP_MAX_STEPS))
#: Longest the module waits for one piece of scheduler work.
DEADLINE_S = 600.0


@dataclass
class System:
    url: str
    token: str
    home: Path
    lake: str
    redis: redis.Redis
    today: datetime
    ids: dict[int, list[str]]  # day offset (-9, -7..-1) -> entry ids written that day
    hold: Path

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=30.0
        )

    def interval(self, day: int) -> tuple[int, int]:
        start = self.today + day * DAY
        return _ms(start), _ms(start + DAY)


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _write(client: redis.Redis, today: datetime) -> dict[int, list[str]]:
    key = keys.stream(STREAM)
    ids: dict[int, list[str]] = {}
    for day in (*FILLER_DAYS, -9, *range(-7, 0)):
        start = _ms(today + day * DAY)
        count = 1 if day in FILLER_DAYS else 3 + day % 3
        ids[day] = [f"{start + 3_600_000 * (i + 1)}-{i % 2}" for i in range(count)]
        for entry_id in ids[day]:
            client.xadd(key, {b"n": entry_id.encode()}, id=entry_id)
    return ids


@pytest.fixture(scope="module")
def system(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    view_redis: LocalRedis,
    airflow_database: Callable[[], str],
) -> Iterator[System]:
    remote = shared_server(request, tmp_path_factory.getbasetemp()).url
    home = tmp_path_factory.mktemp("airflow-sched")
    lake = str(home / "lake")
    port = free_port()
    redis_url = urlunparse(urlparse(view_redis.url)._replace(path=f"/{SCHED_REDIS_DB}"))
    client = redis.Redis.from_url(redis_url, socket_timeout=10)
    client.flushdb()
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    ids = _write(client, today)
    hold = home / "hold"
    env = airflow_env(home, port, lake, redis_url, airflow_database())
    env.update(
        {
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "3",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
            # The task's supervisor learns of "Mark failed" at its next heartbeat (default
            # every 5 s), then SIGTERMs the task (on_kill) and SIGKILLs it 5 s later.
            "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "1",
            "SLUICE_STREAMS": STREAM,
            # A plain stream: no canonical marking (a Spark MERGE per run) to wait for.
            "SLUICE_CHAIN_STREAMS": "",
            "SLUICE_ARCHIVE_CRON": "0 0 * * *",
            "SLUICE_HOT_RETENTION_S": str(30 * 86400),  # nothing is trimmed: Redis stays the truth
            "SLUICE_SPARK_REMOTE": remote,
            "SLUICE_LAKE_TASK_RETRIES": "0",
            "SLUICE_LAKE_JOB_TIMEOUT_S": "600",  # catch-up budget: half of it
            "SLUICE_VAR_DIR": str(home / "var"),
            "SLUICE_TEST_HOLD_FILE": str(hold),
        }
    )
    try:
        with start_api_server(env, home, port, scheduler=True) as (url, token, _log):
            yield System(
                url=url,
                token=token,
                home=home,
                lake=lake,
                redis=client,
                today=today,
                ids=ids,
                hold=hold,
            )
    finally:
        client.close()


def _get(http: httpx.Client, path: str, **params: Any) -> Any:
    reply = http.get(path, params=params)
    assert reply.status_code == 200, f"{path}: {reply.status_code} {reply.text[:500]}"
    return reply.json()


def _runs(http: httpx.Client) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = _get(http, f"/api/v2/dags/{DAG}/dagRuns", limit=100)["dag_runs"]
    return runs


def _wait(what: str, check: Any, deadline_s: float = DEADLINE_S) -> Any:
    """Poll an Airflow condition once a second (each poll is an API call or a file read)."""
    return until_sync(check, what, within_s=deadline_s, every_s=1.0)


def _lake_ids(lake: str, lo: int, hi: int) -> list[str]:
    from deltalake import DeltaTable

    rows = DeltaTable(f"{lake}/stream_entries").to_pyarrow_table().to_pylist()
    return sorted(
        (r["entry_id"] for r in rows if r["stream"] == STREAM and lo <= r["entry_ms"] < hi),
        key=lambda i: tuple(map(int, i.split("-"))),
    )


def _log_rows(lake: str) -> list[tuple[int, int, int]]:
    from deltalake import DeltaTable

    path = f"{lake}/archive_log"
    if not DeltaTable.is_deltatable(path):
        return []
    rows = DeltaTable(path).to_pyarrow_table().to_pylist()
    return sorted((r["start_ms"], r["end_ms"], r["entries"]) for r in rows if r["stream"] == STREAM)


def _failures(http: httpx.Client, runs: list[dict[str, Any]]) -> list[str]:
    """Each failed run's failed tasks with the end of their log (what a failure report needs)."""
    out = []
    for run in runs:
        if run["state"] == "success":
            continue
        base = f"/api/v2/dags/{DAG}/dagRuns/{quote(run['dag_run_id'], safe='')}/taskInstances"
        for ti in _get(http, base)["task_instances"]:
            if ti["state"] == "success":
                continue
            path = f"{base}/{ti['task_id']}/logs/{max(1, ti['try_number'])}"
            reply = http.get(path, params={"map_index": ti["map_index"], "full_content": "true"})
            content = reply.json().get("content", []) if reply.status_code == 200 else []
            lines = [
                f"{e.get('level', '')} {e.get('event', '')}" for e in content if isinstance(e, dict)
            ]
            tail = "\n".join(lines[-40:])
            out.append(
                f"{run['dag_run_id']} {ti['task_id']}[{ti['map_index']}] {ti['state']}:\n{tail}"
            )
    return out


def test_backfill_of_six_intervals_beside_the_scheduled_run(system: System) -> None:
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

        reply = _wait(
            "a backfill the database accepts",
            lambda: not locked(r := http.post("/api/v2/backfills", json=body)) and r,
            deadline_s=120,  # a locked attempt answers after the 15 s busy timeout
        )
        assert reply.status_code == 200, reply.text

        def settled() -> list[dict[str, Any]] | None:
            runs = [r for r in _runs(http) if r["run_type"] == "backfill"]
            done = [r for r in runs if r["state"] in ("success", "failed")]
            return runs if len(runs) == BACKFILL_DAYS and len(done) == len(runs) else None

        backfill = _wait("the backfill runs", settled)
        scheduled = _wait(
            "the scheduled run",
            lambda: [
                r
                for r in _runs(http)
                if r["run_type"] == "scheduled" and r["state"] in ("success", "failed")
            ],
        )
        # Every Sluice DAG came up unpaused (a paused DAG's runs sit queued, silently).
        for dag_id in ("sluice_archive", "sluice_audit", "sluice_maintenance", "sluice_replay"):
            assert _get(http, f"/api/v2/dags/{dag_id}")["is_paused"] is False, dag_id
        # The maintenance DAG runs at 03:00 only: starting Airflow did not run it.
        assert _get(http, "/api/v2/dags/sluice_maintenance/dagRuns")["total_entries"] == 0
        failed = _failures(http, [*backfill, *scheduled])
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
        assert _lake_ids(system.lake, lo, hi) == system.ids[day], f"day {day}"
    # The scheduled run, the stream's first, archived the twelve oldest days holding entries
    # (its bound) with its own; the backfill the six days after them.
    split = system.interval(-9)[0]
    old = [r for r in _log_rows(system.lake) if r[0] < split]
    rows = [r for r in _log_rows(system.lake) if r[0] >= split]
    assert [(lo, hi) for lo, hi, _ in old] == [system.interval(d) for d in FILLER_DAYS]
    assert [(lo, hi) for lo, hi, _ in rows] == [system.interval(d) for d in range(-7, 0)]
    assert [n for _, _, n in rows] == [len(system.ids[d]) for d in range(-7, 0)]


def test_task_log_tells_the_job_story_without_spark_noise(system: System) -> None:
    lo, _ = system.interval(-5)
    with system.client() as http:
        run = next(
            r
            for r in _runs(http)
            if r["run_type"] == "backfill"
            and _ms(datetime.fromisoformat(r["data_interval_start"])) == lo
        )
        base = f"/api/v2/dags/{DAG}/dagRuns/{quote(run['dag_run_id'], safe='')}/taskInstances"
        # the story is the shared job's (archive_streams); the stream's task has its result
        content = _get(http, f"{base}/archive_streams/logs/1", map_index=-1, full_content="true")[
            "content"
        ]
        mine = _get(http, f"{base}/archive/logs/1", map_index=0, full_content="true")["content"]
        result = _get(http, f"{base}/archive/xcomEntries/return_value", map_index=0)["value"]
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
    assert isinstance(result, dict) and result["entries"] == entries and result["warnings"] == 0
    assert f"stream {STREAM}: archived by archive_streams: {entries} entries read" in told, told
    assert "caught_up" not in result  # a backfill run archives only its own interval


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def test_mark_failed_stops_the_job_at_once_and_nothing_is_committed(system: System) -> None:
    lo, hi = system.interval(-9)
    start = system.today - 9 * DAY
    with system.client() as http:

        def quiet() -> bool:
            runs = _runs(http)
            active = [r for r in runs if r["state"] in ("queued", "running")]
            return any(r["run_type"] == "scheduled" for r in runs) and not active

        _wait("the scheduled run to end and no run active", quiet)
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
            held = _wait("the job to hold", lambda: system.hold.read_text().startswith("pid:"))
            assert held
            pid = int(system.hold.read_text().removeprefix("pid:"))
            assert _alive(pid)
            marked = time.monotonic()
            reply = http.patch(
                f"/api/v2/dags/{DAG}/dagRuns/manual__mark-failed/taskInstances/archive_streams",
                json={"new_state": "failed"},
            )
            assert reply.status_code == 200, reply.text
            _wait("the job to stop", lambda: not _alive(pid), deadline_s=10)
            stopped = time.monotonic() - marked
        finally:
            system.hold.unlink(missing_ok=True)
        log.info("job stopped %.2fs after the mark", stopped)
        # The mark reaches the task at its next heartbeat (1 s here); the job is gone
        # at once after that, well before Airflow's SIGKILL 5 s after its SIGTERM.
        assert stopped < 3.0, stopped
        run = _wait(
            "the run to end",
            lambda: (
                (r := _get(http, f"/api/v2/dags/{DAG}/dagRuns/manual__mark-failed"))["state"]
                in ("failed", "success")
                and r
            ),
        )
        assert run["state"] == "failed"
        base = f"/api/v2/dags/{DAG}/dagRuns/manual__mark-failed/taskInstances/archive_streams"
        content = _get(http, f"{base}/logs/1", map_index=-1, full_content="true")["content"]
        # the per-stream tasks after the stopped job did not run (nothing archived them)
        after = _get(http, f"/api/v2/dags/{DAG}/dagRuns/manual__mark-failed/taskInstances")
        states = {t["task_id"]: t["state"] for t in after["task_instances"]}
        assert states.get("archive") == "upstream_failed", states
    text = "\n".join(str(e.get("event", "")) for e in content if isinstance(e, dict))
    assert "task killed: stopped 1 running lake job(s)" in text, text[-3000:]
    # Nothing of the interval was committed, then or later.
    assert (lo, hi) not in [(a, b) for a, b, _ in _log_rows(system.lake)]
    assert _lake_ids(system.lake, lo, hi) == []
