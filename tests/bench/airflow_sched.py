"""``airflow_run_100_streams_sched_s``: the 100-stream ``sluice_archive`` run through a real
``airflow scheduler`` and ``api-server`` (LocalExecutor) on PostgreSQL, as deployed.

Used by bench_airflow.py (``SLUICE_BENCH_ONLY=sched``). The system starts once
(a private PostgreSQL, ``airflow db migrate``, api-server and scheduler, untimed);
the DAG's schedule is yearly so the scheduler starts no run of its own, and each
run is triggered through the REST API with its data interval. The baseline run
archives the chain stream alone ([end - 10 min, end - 5 min)); the 99 plain
streams are written after it, and the timed run archives all 100 streams'
interval [end - 5 min, end). A run's wall time is from the trigger's POST to its
terminal state seen by polling (every 0.2 s); ``airflow_cpu_s`` is the CPU time the
Airflow processes (and the tasks' lake jobs) spent meanwhile (:func:`cpu_s`). Per task, from Airflow's database:
count, summed duration, summed queued time (``start_date - queued_dttm``) and
the span from the first task's start to the last one's end.
"""

from __future__ import annotations

import os
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from pipeline.local.postgres import LocalPostgres
from pipeline.runtime.ports import free_port
from tests.integration.airflow_view.conftest import airflow_env, start_api_server

DAG = "sluice_archive"
#: The executor's task slots, as docker/compose.yaml and docs/operations/airflow.md set them.
PARALLELISM = int(os.environ.get("SLUICE_BENCH_SCHED_PARALLELISM", "8"))
RUN_DEADLINE_S = 1200.0


def system_env(home: Path, port: int, database: str, env: dict[str, str]) -> dict[str, str]:
    """Airflow's environment (real scheduler, LocalExecutor) with the bench's Sluice settings."""
    out = airflow_env(home, port, env["SLUICE_LAKE_URI"], env["SLUICE_REDIS_URL"], database)
    out.update({k: v for k, v in env.items() if k.startswith("SLUICE_")})
    out.update(
        {
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": str(PARALLELISM),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
            "SLUICE_ARCHIVE_CRON": "0 0 1 1 *",  # no scheduled run: the bench triggers them
        }
    )
    return out


def trigger(http: httpx.Client, run_id: str, start: datetime, end: datetime) -> float:
    """Trigger a run of ``[start, end)`` and wait for its end; its wall seconds."""
    began = time.perf_counter()
    reply = http.post(
        f"/api/v2/dags/{DAG}/dagRuns",
        json={"dag_run_id": run_id, "logical_date": end.isoformat(),
              "data_interval_start": start.isoformat(), "data_interval_end": end.isoformat()},
    )  # fmt: skip
    if reply.status_code not in (200, 201):
        raise RuntimeError(f"trigger {run_id}: {reply.status_code} {reply.text[:500]}")
    deadline = time.monotonic() + RUN_DEADLINE_S
    while time.monotonic() < deadline:
        state = http.get(f"/api/v2/dags/{DAG}/dagRuns/{run_id}").json().get("state")
        if state in ("success", "failed"):
            if state != "success":
                raise RuntimeError(f"run {run_id} {state}")
            return time.perf_counter() - began
        time.sleep(0.2)
    raise RuntimeError(f"run {run_id} not done in {RUN_DEADLINE_S} s")


def task_stats(database: str, run_id: str) -> dict[str, Any]:
    """Per task id of run ``run_id``: count, summed duration and queued seconds, and the
    span from the first start to the last end (Airflow's ``task_instance`` rows)."""
    import psycopg2

    conn = psycopg2.connect(database.replace("postgresql+psycopg2://", "postgresql://"))
    try:
        with conn.cursor() as cur:
            cur.execute(
                "select task_id, count(*), sum(duration),"
                " sum(extract(epoch from start_date - queued_dttm)),"
                " extract(epoch from max(end_date) - min(start_date)),"
                " string_agg(distinct state, ',')"
                " from task_instance where run_id = %s group by task_id"
                " order by min(start_date)",
                (run_id,),
            )
            rows = cur.fetchall()
            cur.execute(
                "select extract(epoch from start_date - queued_at),"
                " extract(epoch from end_date - start_date) from dag_run where run_id = %s",
                (run_id,),
            )
            queued, ran = cur.fetchone()
            cur.execute(
                "select coalesce(sum(length(value::text)), 0) from xcom"
                " where run_id = %s and task_id = 'archive_streams'",
                (run_id,),
            )
            (xcom_bytes,) = cur.fetchone()
    finally:
        conn.close()
    return {
        "run_queued_s": round(float(queued or 0), 2),
        "run_db_s": round(float(ran or 0), 2),
        "archive_streams_xcom_bytes": int(xcom_bytes),
        "tasks": {
            t: {
                "n": n,
                "s": round(float(d or 0), 2),
                "queued_s": round(float(q or 0), 2),
                "span_s": round(float(sp or 0), 2),
                "state": st,
            }
            for t, n, d, q, sp, st in rows
        },  # fmt: skip
    }


def cpu_s(home: Path) -> float:
    """CPU seconds of every live process in the sessions led by processes working in ``home``
    (api-server, scheduler, its executor's workers, their tasks and lake jobs; ``spawn``
    starts each in a session of its own), children they reaped included (``utime + stime +
    cutime + cstime``). Not by environment: setproctitle overwrites a process's environ."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: list[tuple[int, list[str]]] = []
    sessions: set[int] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == int(proc.name) and os.readlink(proc / "cwd") == str(home):
                sessions.add(int(fields[3]))
        except OSError:
            continue
        stats.append((int(fields[3]), fields))
    ticks = sum(sum(int(f) for f in fields[11:15]) for sid, fields in stats if sid in sessions)
    return ticks / tick


class Scheduler:
    """PostgreSQL, a migrated database, api-server and scheduler; :meth:`run` triggers runs."""

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.home = tmp / "airflow-sched"
        self.home.mkdir()
        self.postgres = LocalPostgres().start()
        self.database = self.postgres.create_database("airflow_bench")
        self.port = free_port()
        self.env = system_env(self.home, self.port, self.database, env)
        self._server: Any = None
        self.http: httpx.Client | None = None

    def __enter__(self) -> Scheduler:
        import subprocess
        import sys

        try:
            subprocess.run(
                [sys.executable, "-m", "airflow", "db", "migrate"], env=self.env, cwd=self.home,
                check=True, capture_output=True, timeout=600,
            )  # fmt: skip
            self._server = start_api_server(self.env, self.home, self.port, scheduler=True)
            url, token, _log = self._server.__enter__()
        except BaseException:
            self.postgres.stop()
            raise
        self.http = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60.0
        )
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.http is not None:
                self.http.close()
            if self._server is not None:
                self._server.__exit__(None, None, None)
        finally:
            self.postgres.stop()

    def run(self, run_id: str, start: datetime, end: datetime) -> tuple[float, dict[str, Any]]:
        """One triggered run of ``[start, end)``: (wall seconds, :func:`task_stats`)."""
        assert self.http is not None
        load = round(os.getloadavg()[0], 2)
        cpu = cpu_s(self.home)
        seconds = trigger(self.http, run_id, start, end)
        cpu = cpu_s(self.home) - cpu
        stats = task_stats(self.database, run_id)
        return seconds, {
            "load": [load, round(os.getloadavg()[0], 2)], "airflow_cpu_s": round(cpu, 2), **stats
        }  # fmt: skip
