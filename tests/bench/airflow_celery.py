"""``SLUICE_BENCH_ONLY=celery``: ``sluice_archive`` runs through the README's Celery setup.

Used by bench_airflow.py. :class:`CelerySystem` is :class:`airflow_sched.Scheduler`
(a private PostgreSQL, ``airflow db migrate``, api-server and scheduler, runs
triggered through the REST API) with docs/operations/celery.md's executor:
``CeleryExecutor``, Redis as the broker (a database of the bench's Redis),
PostgreSQL as the result backend, and two ``airflow celery worker`` processes of
``--concurrency`` :data:`CONCURRENCY` (the doc's 4 unless
``SLUICE_BENCH_CELERY_CONCURRENCY`` says otherwise); ``[core] parallelism`` stays
docs/operations/airflow.md's 8 (``SLUICE_BENCH_SCHED_PARALLELISM``), so the
``sluice_archive`` pool has 6 of the workers' 8 slots.
The workers start after the api-server and scheduler and are waited for (their
``ready`` line) before the first run.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from airflow_sched import Scheduler

from pipeline.runtime.ports import free_port
from tests.integration.airflow_view.conftest import TEARDOWN_GRACE_S, spawn, stop

#: Each worker's concurrency: docs/operations/celery.md gives 4 (AIRFLOW__CELERY__WORKER_CONCURRENCY).
CONCURRENCY = int(os.environ.get("SLUICE_BENCH_CELERY_CONCURRENCY", "4"))
#: The workers' Celery host names (and log files ``celery-NAME.log``).
WORKERS = ("w1", "w2")
#: Longest a worker may take to say it is ready (a hang, not a speed).
READY_DEADLINE_S = 180.0


def celery_env(broker_url: str, database: str) -> dict[str, str]:
    """docs/operations/celery.md's settings: the executor, Redis broker, database results."""
    return {
        "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
        "AIRFLOW__CELERY__BROKER_URL": broker_url,
        "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + database,
    }


def wait_ready(log: Path, proc: subprocess.Popen[bytes]) -> None:
    """Until the worker logging to ``log`` says it is ready; a clear error when it exits."""
    deadline = time.monotonic() + READY_DEADLINE_S
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace") if log.exists() else ""
        if " ready." in text:
            return
        if proc.poll() is not None:
            raise RuntimeError(f"celery worker exited {proc.returncode}: {text[-3000:]}")
        time.sleep(0.25)
    raise RuntimeError(f"celery worker not ready in {READY_DEADLINE_S} s: {log}")


class CelerySystem(Scheduler):
    """:class:`Scheduler` on ``CeleryExecutor`` with two workers of ``concurrency`` each,
    Celery's broker at ``broker_url``."""

    def __init__(
        self, tmp: Path, env: dict[str, str], broker_url: str, concurrency: int = CONCURRENCY
    ) -> None:
        super().__init__(tmp, env)
        self.env.update(celery_env(broker_url, self.database))
        self.concurrency = concurrency
        self.workers: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> CelerySystem:
        super().__enter__()
        try:
            for name in WORKERS:
                own = {**self.env, "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port())}
                self.workers.append(
                    spawn(own, self.home, "celery", "worker", "--celery-hostname", f"{name}@%h",
                          "--concurrency", str(self.concurrency), log=f"celery-{name}.log")
                )  # fmt: skip
            for name, proc in zip(WORKERS, self.workers, strict=True):
                wait_ready(self.home / f"celery-{name}.log", proc)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            stop(*self.workers, grace_s=TEARDOWN_GRACE_S)
        finally:
            super().__exit__(*exc)
