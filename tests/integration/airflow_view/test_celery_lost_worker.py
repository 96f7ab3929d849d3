"""A Celery worker killed with SIGKILL mid-task: its task is retried on the other worker, the
executor's slot comes back without a scheduler restart, and nothing of the worker holds a port.

One system for the module: ``airflow api-server``, ``airflow scheduler`` (CeleryExecutor,
parallelism 2: the workers' total) and two ``airflow celery worker`` processes
(concurrency 1 each, a log server each), Redis as Celery's broker, PostgreSQL as Airflow's
metadata database and Celery's result backend, the lake jobs as thin clients of the
session's Spark Connect server, one plain stream in a private Redis, a local lake. The
settings docs/operations/celery.md gives: :data:`LOST_WORKER_SETTINGS`.

The scheduler starts one run on its own, for yesterday; its ``archive_streams`` job is held
(the test hook of ``pipeline.lake.write.jobs``). The worker running it is killed with
SIGKILL, alone (not its process group: as the OOM killer does). Then:

- every process it had started ends (its log server, its pool child, the task runner and
  its lake job), and its log server's port can be bound again: before the fix the log
  server and the task runner stayed (no parent-death signal: ``sluice_celery``);
- the scheduler declares the task instance lost within :data:`LOST_WITHIN_S` (no heartbeat
  for ``task_instance_heartbeat_timeout``, 300 s by default: the task stayed "running" and
  held its executor slot for five minutes), and its retry succeeds on the other worker;
- a later run goes through, and the executor's ``running`` set (its slots) no longer has
  the lost try (the scheduler's SIGUSR2 debug dump).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

import httpx
import psutil
import pytest

from pipeline.local.redisserver import LocalRedis
from pipeline.runtime.ports import free_port
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
    failures,
    fresh_db,
    get,
    lake_ids,
    midnight,
    ms,
    scheduler_env,
    wait,
    write_days,
)

# In make soak: a whole system, a worker's loss and the DAG's retry delay take 5-6 minutes
# (333 s at load ~8), a fifth of make test's budget. make test keeps the fork hook's
# unit tests (tests/unit/airflow/test_celery_config.py) and test_celery.py's system.
pytestmark = [
    pytest.mark.airflow,
    pytest.mark.spark,
    pytest.mark.soak,
    pytest.mark.timeout(900),
]

log = logging.getLogger(__name__)

STREAM = "events:lostworker"
BROKER_DB = 13
DATA_DB = 14
WORKERS = ("w1", "w2")
#: What docs/operations/celery.md sets so that a lost worker costs a retry, not its slots
#: for five minutes, and leaves no process behind.
LOST_WORKER_SETTINGS = {
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "30",
    "AIRFLOW__CELERY__CELERY_CONFIG_OPTIONS": "sluice_celery.CELERY_CONFIG",
}
#: From the kill to the task instance declared lost: the heartbeat timeout (30 s), the
#: scheduler's check every 10 s, room for load. Airflow's default took 300 s.
LOST_WITHIN_S = 75.0
#: From the kill to the retry running on the other worker: that, plus the DAG's first retry
#: delay (10-20 s, sluice_dag_common.RETRY_DELAY) and the Celery hand-over; the old 30-60 s
#: delay made it 83 s.
RETRY_WITHIN_S = 90.0
#: From the kill to the end of every process the worker had started (the lake job's
#: shutdown included).
ENDED_WITHIN_S = 30.0


@dataclass
class Lost(Deployment):
    env: dict[str, str]
    workers: dict[str, subprocess.Popen[bytes]]
    log_ports: dict[str, int]
    scheduler: subprocess.Popen[bytes]


def _celery_env(broker_url: str, database: str) -> dict[str, str]:
    return {
        "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
        "AIRFLOW__CORE__PARALLELISM": str(len(WORKERS)),
        "AIRFLOW__CELERY__BROKER_URL": broker_url,
        "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + database,
        "AIRFLOW__CELERY__WORKER_CONCURRENCY": "1",
        "AIRFLOW__CELERY__WORKER_PREFETCH_MULTIPLIER": "1",
        "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__VISIBILITY_TIMEOUT": "3600",
        "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "1",
        # A lost task is retried (the deployment's default is 3).
        "SLUICE_LAKE_TASK_RETRIES": "1",
        **LOST_WORKER_SETTINGS,
    }


@pytest.fixture(scope="module")
def lost(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    view_redis: LocalRedis,
    airflow_database: Callable[[], str],
) -> Iterator[Lost]:
    remote = shared_server(request, tmp_path_factory.getbasetemp()).url
    home = tmp_path_factory.mktemp("airflow-lost-worker")
    port = free_port()
    broker_url = urlunparse(urlparse(view_redis.url)._replace(path=f"/{BROKER_DB}"))
    data_url, client = fresh_db(view_redis, DATA_DB)
    day0 = midnight()
    ids = write_days(client, STREAM, day0, {-3: 4, -1: 4})
    hold = home / "hold"
    hold.write_text(f"--start-ms {ms(day0 - DAY)} ")  # the scheduled run's job holds
    database = airflow_database()
    lake = str(home / "lake")
    env = airflow_env(home, port, lake, data_url, database)
    env.update(scheduler_env(port, home, STREAM, remote, job_timeout_s=300))
    env.update(_celery_env(broker_url, database))
    log_ports = {name: free_port() for name in WORKERS}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(spawn(env, home, "api-server", "--port", str(port), "--workers", "1"))
        workers = {
            name: spawn(
                {**env, "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(log_ports[name])},
                home,
                "celery",
                "worker",
                "--celery-hostname",
                f"{name}@%h",
                log=f"celery-{name}.log",
            )
            for name in WORKERS
        }
        procs.extend(workers.values())
        scheduler = spawn(env, home, "scheduler")
        procs.append(scheduler)
        airflow_cli(env, home, "dags", "reserialize")
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, procs[0], home / "api-server.log")
        token = admin_token(url, home)
        yield Lost(
            url, token, home, lake, client, day0, ids, hold, env, workers, log_ports, scheduler
        )
    finally:
        hold.unlink(missing_ok=True)
        stop(*reversed(procs), grace_s=TEARDOWN_GRACE_S)
        client.close()


def _job_pid(hold: Path) -> int | None:
    text = hold.read_text() if hold.exists() else ""
    return int(text.removeprefix("pid:")) if text.startswith("pid:") else None


def _worker_of(pid: int, workers: dict[str, subprocess.Popen[bytes]]) -> str:
    """The worker whose process tree holds ``pid``."""
    by_pid = {proc.pid: name for name, proc in workers.items()}
    for parent in psutil.Process(pid).parents():
        if parent.pid in by_pid:
            return by_pid[parent.pid]
    raise AssertionError(f"the job {pid} runs under no worker: {psutil.Process(pid).parents()}")


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _listening(proc: psutil.Process) -> list[int]:
    with contextlib.suppress(psutil.Error):
        return sorted(
            c.laddr.port for c in proc.net_connections(kind="inet") if c.status == "LISTEN"
        )
    return []


def _describe(procs: list[psutil.Process]) -> list[str]:
    out = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            out.append(f"{proc.pid} {' '.join(proc.cmdline())[:120]!r} ports {_listening(proc)}")
    return out


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def _ti(http: httpx.Client, run_id: str, task_id: str) -> dict[str, Any]:
    ti: dict[str, Any] = get(http, f"/api/v2/dags/{DAG}/dagRuns/{run_id}/taskInstances/{task_id}")
    return ti


def _ended(http: httpx.Client, run_id: str) -> dict[str, Any] | None:
    run: dict[str, Any] = get(http, f"/api/v2/dags/{DAG}/dagRuns/{run_id}")
    return run if run["state"] in ("success", "failed") else None


def _executor_dump(lost: Lost) -> str:
    """The scheduler's executor's state as its SIGUSR2 debug dump logs it, from its
    ``running`` set on (the keys of the task instances it holds a slot for)."""
    path = lost.home / "scheduler.log"
    offset = path.stat().st_size
    lost.scheduler.send_signal(signal.SIGUSR2)

    def dumped() -> str | None:
        with path.open("rb") as log:
            log.seek(offset)
            text = log.read().decode(errors="replace")
        at = text.find("executor.running (")
        end = text.find("executor.event_buffer (", at)
        return text[at:end] if at >= 0 and end > at else None

    dump: str = wait("the scheduler's debug dump", dumped, deadline_s=60.0)
    return dump


def _kill_worker(lost: Lost) -> tuple[str, list[psutil.Process], list[int]]:
    """SIGKILL to the worker running the held job, alone; its name, the processes it had
    started and the ports they listened on."""
    job = wait("the archive job to hold", lambda: _job_pid(lost.hold))
    name = _worker_of(job, lost.workers)
    worker = lost.workers[name]
    tree = psutil.Process(worker.pid).children(recursive=True)
    ports = sorted({port for proc in tree for port in _listening(proc)})
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=30)
    return name, tree, ports


def test_a_worker_killed_mid_task_loses_a_retry_not_its_slots(lost: Lost) -> None:
    with lost.client() as http:
        run_id = wait("the scheduled run", lambda: dag_runs(http))[0]["dag_run_id"]
        name, tree, ports = _kill_worker(lost)
        killed = time.monotonic()
        # The executor holds the lost try's slot (until the heartbeat timeout, 30 s away).
        lost_try = f"task_id='archive_streams', run_id='{run_id}', try_number=1"
        assert lost_try in _executor_dump(lost)
        try:
            assert lost.log_ports[name] in ports, (ports, _describe(tree))
            # Every process the worker had started ends with it; none keeps a port.
            with contextlib.suppress(AssertionError):
                wait(
                    "the killed worker's processes to end",
                    lambda: not any(_alive(p) for p in tree),
                    deadline_s=ENDED_WITHIN_S,
                )
            survivors = [p for p in tree if _alive(p)]
            assert not [p for p in survivors if _listening(p)], _describe(survivors)
            assert not survivors, _describe(survivors)
            assert _bindable(lost.log_ports[name])
        finally:
            for proc in tree:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
            lost.hold.unlink(missing_ok=True)
        # The scheduler declares the task lost (no heartbeat) and it is retried.
        wait(
            "the lost task to be failed for a retry", lambda: _retried(http, run_id), LOST_WITHIN_S
        )
        log.info("declared lost %.1f s after the kill", time.monotonic() - killed)
        # ... and its retry starts on the other worker after the DAG's retry delay (10-20 s)
        left_s = max(1.0, RETRY_WITHIN_S - (time.monotonic() - killed))
        wait("the retry to start", lambda: _retry_started(http, run_id), left_s)
        log.info("retry started %.1f s after the kill", time.monotonic() - killed)
        run = wait("the run to end", lambda: _ended(http, run_id))
        retried = _ti(http, run_id, "archive_streams")
        assert run["state"] == "success", failures(http, [run])
        assert (retried["state"], retried["try_number"]) == ("success", 2), retried
        lo, hi = lost.interval(-1)
        assert lake_ids(lost.lake, STREAM, lo, hi) == lost.ids[-1]
        # A later run goes through on the worker left.
        later = _trigger(http, lost, -3)
        run = wait("the later run to end", lambda: _ended(http, later))
        assert run["state"] == "success", failures(http, [run])
        lo, hi = lost.interval(-3)
        assert lake_ids(lost.lake, STREAM, lo, hi) == lost.ids[-3]
    # The executor's running set (its slots) no longer has the lost try.
    dump = _executor_dump(lost)
    assert lost_try not in dump, dump


def _retry_started(http: httpx.Client, run_id: str) -> bool:
    ti = _ti(http, run_id, "archive_streams")
    return bool(ti["try_number"] >= 2 and ti["state"] in ("running", "success"))


def _retried(http: httpx.Client, run_id: str) -> bool:
    ti = _ti(http, run_id, "archive_streams")
    return bool(ti["try_number"] >= 2 or ti["state"] == "up_for_retry")


def _trigger(http: httpx.Client, lost: Lost, day: int) -> str:
    start = lost.today + day * DAY
    run_id = f"manual__lost-worker{day}"
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
    return run_id
