"""``sluice_archive`` on Airflow's CeleryExecutor, into the S3 lake, the way Airflow is spread out.

One system for the module: ``airflow api-server``, ``airflow scheduler`` (CeleryExecutor)
and two ``airflow celery worker`` processes (concurrency 1 each), Redis as Celery's
broker, PostgreSQL as Airflow's metadata database and Celery's result backend, the lake
on the session's S3 server (versitygw): nothing is shared between the workers but the
services, as on several machines. The lake jobs are thin clients of the session's Spark
Connect server; one plain stream in a private Redis.

The archive DAG runs daily (``0 0 * * *``): the scheduler starts one run on its own,
for yesterday, when the DAG first appears. The second test triggers a run for an
earlier day and stops the API server while its task runs: the task waits for the
execution API (``[workers] execution_api_retries`` / ``execution_api_retry_wait_max``,
set by :func:`pipeline.demo.airflowdb.database_env`) instead of failing.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

import httpx
import pytest

from pipeline.local.redisserver import LocalRedis
from pipeline.local.s3 import LocalStore
from pipeline.runtime.ports import free_port
from tests.conftest import S3_BUCKET
from tests.integration.lake.connect import shared_server

from .conftest import (
    TEARDOWN_GRACE_S,
    admin_token,
    airflow_cli,
    airflow_env,
    spawn,
    stop,
    wait_healthy,
)
from .deployment import (
    DAG,
    DAY,
    Deployment,
    dag_runs,
    fresh_db,
    get,
    midnight,
    scheduler_env,
    wait,
    write_days,
)

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.timeout(900)]

STREAM = "events:celery"
BROKER_DB = 13
DATA_DB = 14
#: The Celery task every Airflow workload runs as (what a worker logs on receipt).
WORKLOAD_TASK = "execute_workload["


@dataclass
class Celery(Deployment):
    env: dict[str, str]
    port: int
    api: list[subprocess.Popen[bytes]]  # the current API server (replaced on restart)
    s3: dict[str, Any]  # flat lake settings (uri and lake_s3_*)


def _spawn_workers(env: dict[str, str], home: Path) -> list[subprocess.Popen[bytes]]:
    """Two ``airflow celery worker`` processes, w1 and w2, concurrency 1 each."""
    return [
        spawn(
            {**env, "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port())},
            home,
            "celery",
            "worker",
            "--celery-hostname",
            f"{name}@%h",
            "--concurrency",
            "1",
            log=f"celery-{name}.log",
        )
        for name in ("w1", "w2")
    ]


@pytest.fixture(scope="module")
def celery(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    view_redis: LocalRedis,
    s3_store: LocalStore,
    airflow_database: Callable[[], str],
) -> Iterator[Celery]:
    remote = shared_server(request, tmp_path_factory.getbasetemp()).url
    home = tmp_path_factory.mktemp("airflow-celery")
    port = free_port()
    lake = {"lake_uri": f"s3://{S3_BUCKET}/{uuid.uuid4().hex}", **s3_store.lake_settings()}
    broker_url = urlunparse(urlparse(view_redis.url)._replace(path=f"/{BROKER_DB}"))
    data_url, client = fresh_db(view_redis, DATA_DB)
    day0 = midnight()
    ids = write_days(client, STREAM, day0, {-3: 4, -1: 4})
    database = airflow_database()
    env = airflow_env(home, port, str(lake["lake_uri"]), data_url, database)
    env.update(
        {
            "SLUICE_" + k.upper(): str(v).lower() if isinstance(v, bool) else str(v)
            for k, v in lake.items()
        }
    )
    env.update(scheduler_env(port, home, STREAM, remote, job_timeout_s=300))
    env.update(
        {
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__CELERY__BROKER_URL": broker_url,
            "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + database,
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": "1",
            "AIRFLOW__CELERY__WORKER_PREFETCH_MULTIPLIER": "1",
            "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__VISIBILITY_TIMEOUT": "3600",
            "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "1",
        }
    )
    procs: list[subprocess.Popen[bytes]] = []
    api: list[subprocess.Popen[bytes]] = []
    try:
        api.append(spawn(env, home, "api-server", "--port", str(port), "--workers", "1"))
        # None of them needs a DAG to start: serialize dags/ while they start.
        procs.extend(_spawn_workers(env, home))
        procs.append(spawn(env, home, "scheduler"))
        airflow_cli(env, home, "dags", "reserialize")
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, api[0], home / "api-server.log")
        token = admin_token(url, home)
        yield Celery(
            url,
            token,
            home,
            lake["lake_uri"],
            client,
            day0,
            ids,
            home / "hold",
            env,
            port,
            api,
            lake,
        )
    finally:
        stop(*api, *reversed(procs), grace_s=TEARDOWN_GRACE_S)
        client.close()


def _ended(http: httpx.Client, run_id: str) -> dict[str, Any] | None:
    run: dict[str, Any] = get(http, f"/api/v2/dags/{DAG}/dagRuns/{run_id}")
    return run if run["state"] in ("success", "failed") else None


def _task_states(http: httpx.Client, run_id: str) -> dict[str, str]:
    tis = get(http, f"/api/v2/dags/{DAG}/dagRuns/{run_id}/taskInstances")["task_instances"]
    return {f"{t['task_id']}[{t['map_index']}]": t["state"] for t in tis}


def _lake_ids(lake: dict[str, Any], lo: int, hi: int) -> list[str]:
    from pipeline.lake.storage.entries import read_entries
    from pipeline.settings import Settings

    settings = Settings.load(env={}, **lake)
    return [
        e.entry_id
        for e in read_entries(settings.lake, STREAM)
        if lo <= int(e.entry_id.split("-")[0]) < hi
    ]


def _received(home: Path) -> dict[str, int]:
    """Workloads each Celery worker received (from its own log)."""
    return {
        name: (home / f"celery-{name}.log").read_text(errors="replace").count(WORKLOAD_TASK)
        for name in ("w1", "w2")
    }


def test_scheduled_run_goes_through_celery_workers_into_the_s3_lake(celery: Celery) -> None:
    with celery.client() as http:
        scheduled = wait(
            "the scheduled run to end",
            lambda: [
                r
                for r in dag_runs(http)
                if r["run_type"] == "scheduled" and r["state"] in ("success", "failed")
            ],
        )
        run = scheduled[0]
        states = _task_states(http, run["dag_run_id"])
    assert run["state"] == "success", states
    # canonical is skipped: the stream is not a chain stream
    assert set(states.values()) == {"success", "skipped"}, states
    # Every task instance that ran was a Celery task one of the two workers received.
    received = _received(celery.home)
    ran = [t for t, state in states.items() if state == "success"]
    assert sum(received.values()) >= len(ran), (received, states)
    lo, hi = celery.interval(-1)
    assert datetime.fromisoformat(run["data_interval_start"]) == celery.today - DAY
    assert _lake_ids(celery.s3, lo, hi) == celery.ids[-1]


def _job_pid(hold: Path) -> int | None:
    text = hold.read_text() if hold.exists() else ""
    return int(text.removeprefix("pid:")) if text.startswith("pid:") else None


def _alive(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().split()[2] != "Z"
    except (OSError, IndexError):
        return False


def test_a_task_waits_out_an_api_server_restart(celery: Celery) -> None:
    lo, hi = celery.interval(-3)
    start = celery.today - 3 * DAY
    run_id = "manual__api-restart"
    with celery.client() as http:
        wait(
            "the scheduled run to end",
            lambda: all(r["state"] in ("success", "failed") for r in dag_runs(http)),
        )
        celery.hold.write_text(f"--start-ms {lo} ")
        reply = http.post(
            f"/api/v2/dags/{DAG}/dagRuns",
            json={
                "dag_run_id": run_id,
                "logical_date": start.isoformat(),
                "data_interval_start": start.isoformat(),
                "data_interval_end": (start + DAY).isoformat(),
            },
        )
        assert reply.status_code == 200, reply.text
        pid = wait("the archive job to hold", lambda: _job_pid(celery.hold))
    # The API server goes away while the task's job runs; the job ends and its task
    # reports to (and heartbeats against) the missing server before it comes back.
    stop(celery.api.pop())
    celery.hold.unlink()
    wait("the archive job to end", lambda: not _alive(pid))
    before = _received(celery.home)
    celery.api.append(
        spawn(celery.env, celery.home, "api-server", "--port", str(celery.port), "--workers", "1")
    )
    wait_healthy(celery.url, celery.api[0], celery.home / "api-server.log")
    with celery.client() as http:
        run = wait("the run to end", lambda: _ended(http, run_id))
        states = _task_states(http, run_id)
    assert run["state"] == "success", states
    assert states["archive_streams[-1]"] == "success"
    assert _received(celery.home) != before  # later tasks went through Celery as well
    assert _lake_ids(celery.s3, lo, hi) == celery.ids[-3]
