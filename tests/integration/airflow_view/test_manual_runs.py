"""Manual runs are never starved: they start within a minute while the scheduled archive runs.

One system for the module: ``airflow api-server`` and ``airflow scheduler``
(LocalExecutor, parallelism 4) on PostgreSQL, the lake jobs as thin clients of
the session's Spark Connect server, one plain stream in a private Redis with
entries on days -3..-1. The archive DAG runs daily (``0 0 * * *``): the
scheduler starts one run for yesterday when the DAG first appears, and its
archive job is held (the test hook of ``pipeline.lake.write.jobs``) while it
holds the stream's archive lock, so "the schedule runs" for as long as the
test says.

Meanwhile the test triggers, through the API, what a person would: a backfill
of days -3..-2 (two runs at once) and an archive run, whose ``archive_streams``
must start within a minute, beside the scheduled one (``max_active_runs`` 2,
no bound on ``archive_streams`` across runs; they wait for the stream's lock).
Four archive jobs now want a slot, and the ``sluice_archive`` pool (3 of the 4
executor slots, created by the scheduler) is full; then ``sluice_replay``,
``sluice_audit`` and ``sluice_maintenance``, which must start within a minute
too, in the slot the pool leaves (with a pool as large as the executor they
wait for the schedule: tried by hand). Released, every archive run succeeds
and the lake's coverage is the three days, contiguous, equal to Redis.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from pipeline.local.redisserver import LocalRedis
from tests.support.poll import until_sync

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
    wait,
)

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.timeout(900)]

log = logging.getLogger(__name__)

STREAM = "events:manual"
MANUAL_REDIS_DB = 10
PARALLELISM = 4
#: What a manual run may wait before its first task starts.
START_WITHIN_S = 60.0
#: How often the wait for runs to start polls: each poll is several API calls.
STARTED_POLL_S = 0.5


@pytest.fixture(scope="module")
def system(
    request: pytest.FixtureRequest,
    view_redis: LocalRedis,
    airflow_database: Callable[[], str],
) -> Iterator[Deployment]:
    # The scheduled run's job (yesterday's interval) holds from the start.
    with local_deployment(
        request,
        view_redis,
        airflow_database(),
        stream=STREAM,
        db=MANUAL_REDIS_DB,
        counts={day: 2 - day for day in (-3, -2, -1)},
        parallelism=PARALLELISM,
        held_day=-1,
    ) as deployment:
        yield deployment


def _post(http: httpx.Client, path: str, body: dict[str, Any]) -> Any:
    reply = http.post(path, json=body)
    assert reply.status_code == 200, f"{path}: {reply.status_code} {reply.text[:500]}"
    return reply.json()


def _tis(http: httpx.Client, dag_id: str, run_id: str) -> list[dict[str, Any]]:
    path = f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances"
    tis: list[dict[str, Any]] = get(http, path)["task_instances"]
    return tis


def _started(http: httpx.Client, dag_id: str, run_id: str, task_id: str | None) -> datetime | None:
    """When the run's first task instance (or ``task_id``'s) started, if one has."""
    starts = [
        datetime.fromisoformat(ti["start_date"])
        for ti in _tis(http, dag_id, run_id)
        if ti["start_date"] and (task_id is None or ti["task_id"] == task_id)
    ]
    return min(starts, default=None)


#: name -> (dag_id, run_id, the task whose start counts: None for the run's first)
Runs = dict[str, tuple[str, str, str | None]]


def _trigger_archive(http: httpx.Client, system: Deployment) -> Runs:
    """A backfill of days -3..-2 (two runs at once) and an archive run, through the API."""
    first = system.today - 3 * DAY
    body = {
        "dag_id": DAG,
        "from_date": first.isoformat(),
        "to_date": (first + DAY).isoformat(),
        "max_active_runs": 2,
    }
    backfill = _post(http, "/api/v2/backfills", body)
    # An archive run needs a logical date (its data interval comes from it; the UI fills in
    # now): the interval ending at the last cron point before it, yesterday's, as scheduled.
    now = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
    run = _post(http, f"/api/v2/dags/{DAG}/dagRuns", {"logical_date": now})
    return {
        "backfill": (DAG, f"backfill:{backfill['id']}", "archive_streams"),
        DAG: (DAG, run["dag_run_id"], "archive_streams"),
    }


def _trigger_others(http: httpx.Client) -> Runs:
    """``sluice_replay``, ``sluice_audit`` and ``sluice_maintenance``, through the API."""
    conf: dict[str, dict[str, Any]] = {
        "sluice_replay": {"stream": STREAM, "from_num": 0, "to_num": 0},
        "sluice_audit": {},
        "sluice_maintenance": {},
    }
    runs: Runs = {}
    for dag_id, params in conf.items():
        run = _post(http, f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": params})
        runs[dag_id] = (dag_id, run["dag_run_id"], None)
    return runs


def _wait_started(http: httpx.Client, runs: Runs) -> dict[str, float]:
    """Seconds from now until each run's task started; fails past :data:`START_WITHIN_S`."""
    began = datetime.now(UTC)

    def all_started() -> dict[str, datetime] | None:
        starts = {name: _start_of(http, *run) for name, run in runs.items()}
        done = {name: at for name, at in starts.items() if at is not None}
        return done if len(done) == len(runs) else None

    try:
        starts = until_sync(
            all_started, "the runs to start", within_s=START_WITHIN_S, every_s=STARTED_POLL_S
        )
    except AssertionError as exc:
        waiting = {n: _start_of(http, *r) for n, r in runs.items()}
        raise AssertionError(f"not started within {START_WITHIN_S}s: {waiting}") from exc
    return {name: round((at - began).total_seconds(), 1) for name, at in starts.items()}


def _backfill_runs(http: httpx.Client) -> list[dict[str, Any]]:
    return [r for r in dag_runs(http) if r["run_type"] == "backfill"]


def _start_of(http: httpx.Client, dag_id: str, run_id: str, task: str | None) -> datetime | None:
    if run_id.startswith("backfill:"):  # any run of the backfill: the first to start
        starts = [_started(http, DAG, r["dag_run_id"], task) for r in _backfill_runs(http)]
        return min((s for s in starts if s is not None), default=None)
    return _started(http, dag_id, run_id, task)


def test_manual_runs_start_within_a_minute_while_the_schedule_runs(system: Deployment) -> None:
    with system.client() as http:
        # The scheduled run's archive job holds, with the stream's archive lock.
        wait("the scheduled run's job to hold", lambda: system.hold.read_text().startswith("pid"))
        archive = _trigger_archive(http, system)
        waited = _wait_started(http, archive)
        # Archive jobs of three runs want the pool: it is full, a fourth waits in it ...
        pool = wait(
            "the archive pool to fill",
            lambda: (p := get(http, "/api/v2/pools/sluice_archive"))["open_slots"] == 0 and p,
            deadline_s=START_WITHIN_S,
        )
        assert pool["slots"] == PARALLELISM - 1, pool  # created by the scheduler, a slot kept
        # ... and the other DAGs still start, in the executor's slot the pool leaves.
        waited |= _wait_started(http, _trigger_others(http))
        log.info("manual runs started after (s): %s", waited)
        # ... while the scheduled run's job was still held: beside it, not after it
        assert system.hold.read_text().startswith("pid"), "the scheduled job was released early"
        scheduled = [r for r in dag_runs(http) if r["run_type"] == "scheduled"]
        assert [r["state"] for r in scheduled] == ["running"]
        archive_tis = _tis(http, DAG, archive[DAG][1])
        assert {ti["pool"] for ti in archive_tis} == {"sluice_archive"}, archive_tis
    assert max(waited.values()) < START_WITHIN_S, waited


def test_released_every_archive_run_succeeds_and_coverage_is_contiguous(system: Deployment) -> None:
    system.hold.unlink(missing_ok=True)
    began = time.monotonic()
    with system.client() as http:

        def ended() -> list[dict[str, Any]] | None:
            runs = dag_runs(http)
            over = all(r["state"] in ("success", "failed") for r in runs)
            return runs if over and len(runs) == 4 else None  # scheduled, manual, 2 backfill

        runs = wait("every archive run to end", ended)
        failed = failures(http, runs)
    log.info("archive runs ended %.1fs after the release", time.monotonic() - began)
    assert not failed, "\n\n".join(failed)
    assert {r["run_type"]: r["state"] for r in runs} == {
        "scheduled": "success", "manual": "success", "backfill": "success",
    }, runs  # fmt: skip
    assert [r["state"] for r in runs] == ["success"] * 4
    # Days -3..-1 archived once each, contiguous, and the lake holds exactly what Redis held.
    assert [(lo, hi) for lo, hi, _ in log_rows(system.lake, STREAM)] == [
        system.interval(d) for d in (-3, -2, -1)
    ]
    assert lake_ids(system.lake, STREAM) == [i for d in (-3, -2, -1) for i in system.ids[d]]
