"""Fixtures for the DAG tests: a lake and Redis for the tasks, and a DAG runner.

The DAGs run with ``dag.test()`` against the session's migrated Airflow DB
(``airflow_home``), the real Redis of the session and a temporary lake; the
lake jobs run as real child processes with local Spark.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import redis

from pipeline.localredis import LocalRedis

ROOT = Path(__file__).resolve().parents[3]
PLUGINS = str(ROOT / "plugins")
if PLUGINS not in sys.path:  # Airflow adds it too; be independent of import order
    sys.path.append(PLUGINS)

#: Keep the job JVMs small on a shared 2-core machine.
JOB_ENV = {
    "SLUICE_SPARK_MASTER": "local[1]",
    "SLUICE_SPARK_SHUFFLE_PARTITIONS": "1",
    "SLUICE_SPARK_DRIVER_MEMORY": "768m",
    "SLUICE_ARCHIVE_PARTITIONS": "2",
    "SLUICE_ARCHIVE_CRON": "*/5 * * * *",
    "SLUICE_LAKE_JOB_TIMEOUT_S": "240",
    # dag.test would wait out a retry delay: fail at once instead.
    "SLUICE_LAKE_TASK_RETRIES": "0",
}


def session_redis_url(server: LocalRedis | None) -> str:
    return os.environ.get("SLUICE_TEST_REDIS_URL") or (server.url if server else "")


@dataclass
class DagRunner:
    """Loads ``dags/`` once and runs one DAG with ``dag.test``."""

    bag: Any

    def run(self, dag_id: str, logical_date: datetime | None = None, **conf: Any) -> Any:
        dag = self.bag.get_dag(dag_id)
        assert dag is not None, f"{dag_id} not in the DagBag: {self.bag.import_errors}"
        kwargs: dict[str, Any] = {"run_conf": conf or None}
        if logical_date is not None:
            kwargs["logical_date"] = logical_date
        return dag.test(**kwargs)


def task_states(run: Any) -> dict[str, str]:
    """``task_id[map_index]`` -> state of every task instance of a DAG run."""
    return {f"{ti.task_id}[{ti.map_index}]": str(ti.state) for ti in run.get_task_instances()}


@pytest.fixture(scope="module")
def dag_runner(airflow_home: Path) -> Iterator[DagRunner]:
    from airflow.dag_processing.dagbag import DagBag

    with pytest.MonkeyPatch.context() as mp:
        for name, value in JOB_ENV.items():
            mp.setenv(name, value)
        bag = DagBag(dag_folder=str(ROOT / "dags"))
        assert not bag.import_errors, bag.import_errors
        yield DagRunner(bag)


@pytest.fixture(scope="module")
def module_redis_url(redis_server: LocalRedis | None) -> str:
    return session_redis_url(redis_server)


@pytest.fixture(scope="module")
def module_redis(module_redis_url: str) -> Iterator[redis.Redis]:
    """A client of the session's Redis, flushed once for the module's tests."""
    client = redis.Redis.from_url(module_redis_url, socket_timeout=10)
    client.flushdb()
    try:
        yield client
    finally:
        client.close()
