"""Fixtures for the DAG tests: a DAG runner and one archived lake for the session.

The DAGs run with ``dag.test()`` against the session's migrated Airflow DB
(``airflow_home``), the session's real Redis (database 9, so per-test
flushes of database 0 do not touch it) and a temporary lake; the lake jobs
run as real child processes, thin clients of the session's Spark Connect
server (``SLUICE_SPARK_REMOTE``), as a deployment runs them. ``SLUICE_*`` variables are set
only around each run, so nothing leaks into other tests.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

import pytest
import redis

from pipeline import keys
from pipeline.local.redisserver import LocalRedis
from tests.integration.airflow import scenario
from tests.integration.lake.connect import shared_server

ROOT = Path(__file__).resolve().parents[3]
PLUGINS = str(ROOT / "plugins")
if PLUGINS not in sys.path:  # Airflow adds it too; be independent of import order
    sys.path.append(PLUGINS)

#: Airflow 3.3's in-process execution API (dag.test) uses starlette's TestClient,
#: which warns about its httpx backend on every task.
AIRFLOW_WARNINGS = pytest.mark.filterwarnings(
    "ignore::starlette.exceptions.StarletteDeprecationWarning"
)

#: Set while DAGs are parsed and run: small job JVMs on a shared machine, and
#: no retries (dag.test would wait out a retry delay).
JOB_ENV = {
    "SLUICE_SPARK_MASTER": "local[2]",
    "SLUICE_SPARK_SHUFFLE_PARTITIONS": "1",
    "SLUICE_SPARK_DRIVER_MEMORY": "768m",
    "SLUICE_ARCHIVE_PARTITIONS": "2",
    "SLUICE_ARCHIVE_RANGE_ENTRIES": "1",
    "SLUICE_ARCHIVE_CRON": "*/5 * * * *",
    "SLUICE_LAKE_JOB_TIMEOUT_S": "600",
    "SLUICE_LAKE_TASK_RETRIES": "0",
}
LAKE_REDIS_DB = 9


@pytest.fixture(scope="session")
def spark_remote(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """``sc://`` URL of the session's Spark Connect server (shared with the lake tests)."""
    return shared_server(request, tmp_path_factory.getbasetemp()).url


@dataclass
class DagRunner:
    """Loads ``dags/`` once and runs one DAG with ``dag.test`` under given ``SLUICE_*`` env."""

    bag: Any
    remote: str = ""

    def run(
        self,
        dag_id: str,
        logical_date: datetime | None = None,
        *,
        env: Mapping[str, str] | None = None,
        **conf: Any,
    ) -> Any:
        dag = self.bag.get_dag(dag_id)
        assert dag is not None, f"{dag_id} not in the DagBag: {self.bag.import_errors}"
        kwargs: dict[str, Any] = {"run_conf": conf or None}
        if logical_date is not None:
            kwargs["logical_date"] = logical_date
        with pytest.MonkeyPatch.context() as mp:
            base = {**JOB_ENV, "SLUICE_SPARK_REMOTE": self.remote}
            for name, value in {**base, **(env or {})}.items():
                mp.setenv(name, value)
            return dag.test(**kwargs)


def task_states(run: Any) -> dict[str, str]:
    """``task_id[map_index]`` -> state of every task instance of a DAG run."""
    return {f"{ti.task_id}[{ti.map_index}]": str(ti.state) for ti in run.get_task_instances()}


@pytest.fixture(scope="session")
def dag_runner(airflow_home: Path, spark_remote: str) -> DagRunner:
    from airflow.dag_processing.dagbag import DagBag

    with pytest.MonkeyPatch.context() as mp:
        for name, value in JOB_ENV.items():
            mp.setenv(name, value)
        bag = DagBag(dag_folder=str(ROOT / "dags"))
    assert not bag.import_errors, bag.import_errors
    return DagRunner(bag, spark_remote)


@pytest.fixture(scope="session")
def lake_redis_url(redis_server: LocalRedis | None) -> str:
    """The session's Redis, database 9."""
    base = os.environ.get("SLUICE_TEST_REDIS_URL") or (redis_server.url if redis_server else "")
    return urlunparse(urlparse(base)._replace(path=f"/{LAKE_REDIS_DB}"))


@pytest.fixture(scope="session")
def lake_redis(lake_redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(lake_redis_url, socket_timeout=10)
    client.flushdb()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def archived(
    dag_runner: DagRunner,
    lake_redis: redis.Redis,
    lake_redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Any]:
    """``sluice_archive`` run twice for the scenario's interval, with what each run left.

    Run 1 archives both streams with a hot-retention window longer than the
    data's age: nothing may be trimmed. Run 2 repeats the same interval for
    the chain stream (the one with block MERGEs and canonical marking; one
    JVM less on a shared machine) with a one-hour window, so it trims.
    """
    lake = str(tmp_path_factory.mktemp("archive-dag") / "lake")
    written = scenario.write_entries(lake_redis)
    env = {
        "SLUICE_REDIS_URL": lake_redis_url,
        "SLUICE_LAKE_URI": lake,
        "SLUICE_STREAMS": f"{scenario.CHAIN},{scenario.PLAIN}",
        "SLUICE_CHAIN_STREAMS": scenario.CHAIN,
    }
    names = ("blocks", "archive_log", "stream_entries")
    records: list[tuple[int, str]] = []
    catcher = _Catcher(records)
    for name in ("sluice_lake_job", "sluice_lake_operator"):
        logging.getLogger(name).addHandler(catcher)
    try:
        first = dag_runner.run(
            "sluice_archive",
            scenario.END,
            env={**env, "SLUICE_HOT_RETENTION_S": str(10 * 365 * 86400)},
        )
    finally:
        for name in ("sluice_lake_job", "sluice_lake_operator"):
            logging.getLogger(name).removeHandler(catcher)
    published_first = next(
        (ti.xcom_pull(task_ids="publish") for ti in first.get_task_instances()), None
    )
    # dag.test of the same logical date replaces the run: keep what run 1 did now.
    first_states = (task_states(first), first.data_interval_start, first.data_interval_end)
    ids_first = {s: _ids(lake_redis, s) for s in (scenario.CHAIN, scenario.PLAIN)}
    tables_first = {t: scenario.table_rows(lake, t) for t in names} if _ok(first) else {}
    second = dag_runner.run(
        "sluice_archive",
        scenario.END,
        env={**env, "SLUICE_STREAMS": scenario.CHAIN, "SLUICE_HOT_RETENTION_S": "3600"},
    )
    second_states = (task_states(second), second.data_interval_start, second.data_interval_end)
    ids_second = {s: _ids(lake_redis, s) for s in (scenario.CHAIN, scenario.PLAIN)}
    tables_second = {t: scenario.table_rows(lake, t) for t in names} if _ok(second) else {}
    return {
        "lake": lake,
        "env": env,
        "written": written,
        "first": first_states,
        "records_first": records,
        "published_first": published_first,
        "second": second_states,
        "second_ok": _ok(second),
        "second_run_id": second.run_id,
        "ids_first": ids_first,
        "ids_second": ids_second,
        "tables_first": tables_first,
        "tables_second": tables_second,
    }


class _Catcher(logging.Handler):
    """Keeps (level, message) of every record of the task loggers during a run."""

    def __init__(self, records: list[tuple[int, str]]) -> None:
        super().__init__(level=logging.DEBUG)
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.levelno, record.getMessage()))


def _ok(run: Any) -> bool:
    return str(run.state) == "success"


def _ids(client: redis.Redis, stream: str) -> list[str]:
    return [entry_id.decode() for entry_id, _ in client.xrange(keys.stream(stream))]
