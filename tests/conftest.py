"""Shared fixtures: a real redis-server, a local Spark with Delta, an Airflow metadata DB.

Nothing here is a fake: each fixture starts the real component (or uses the
one named by ``SLUICE_TEST_REDIS_URL``) and tears it down at the end.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from pipeline.demo import airflowdb
from pipeline.local.postgres import LocalPostgres
from pipeline.local.redisserver import LocalRedis
from pipeline.local.s3 import LocalStore
from tests.support.hangwatch import (  # noqa: F401 (hooks, found here by name)
    pytest_configure,
    pytest_runtest_protocol,
    pytest_runtest_teardown,
    pytest_unconfigure,
)
from tests.support.spark import SparkHolder

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRedis | None]:
    """The session's redis-server (None when ``SLUICE_TEST_REDIS_URL`` names an external one)."""
    if os.environ.get("SLUICE_TEST_REDIS_URL"):
        yield None
        return
    server = LocalRedis(tmp_path_factory.mktemp("redis")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_url(redis_server: LocalRedis | None) -> Iterator[str]:
    """URL of an empty Redis database (flushed before each test)."""
    url = os.environ.get("SLUICE_TEST_REDIS_URL") or (redis_server.url if redis_server else "")
    client = redis.Redis.from_url(url)
    client.flushdb()
    client.close()
    yield url


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def redis_factory(tmp_path: Path) -> Iterator[Callable[..., LocalRedis]]:
    """Start extra private redis-servers (own port and dir); all are stopped after the test."""
    started: list[LocalRedis] = []

    def make(**kwargs: Any) -> LocalRedis:
        server = LocalRedis(tmp_path / f"redis{len(started)}", **kwargs).start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real Redis Cluster, 3 masters + 3 replicas (tests/support/redisha.py), once per session."""
    from tests.support import redisha

    path = tmp_path_factory.mktemp("redis-cluster")
    yield from redisha.session_group(lambda: redisha.LocalCluster(path), "Redis Cluster")


@pytest.fixture(scope="session")
def redis_sentinels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real master + replica watched by 3 Sentinels (tests/support/redisha.py), once per session."""
    from tests.support import redisha

    path = tmp_path_factory.mktemp("redis-sentinel")
    yield from redisha.session_group(lambda: redisha.LocalSentinels(path), "Sentinel group")


@pytest.fixture
def cluster_url(redis_cluster: Any) -> str:
    """``redis+cluster://`` URL of the session's cluster, whole and flushed."""
    return str(redis_cluster.ready_url())


@pytest.fixture
def sentinel_url(redis_sentinels: Any) -> str:
    """``redis+sentinel://`` URL of the session's Sentinel group, whole and flushed."""
    return str(redis_sentinels.ready_url())


@pytest.fixture(params=["single", "sentinel", "cluster"])
def any_redis_url(request: pytest.FixtureRequest) -> str:
    """The URL of an empty Redis of each layout in turn: one server, Sentinel, Cluster."""
    name = {"single": "redis_url", "sentinel": "sentinel_url", "cluster": "cluster_url"}
    return str(request.getfixturevalue(name[request.param]))


@pytest.fixture(scope="session")
def spark_holder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkHolder]:
    """The session's local Spark, replaced when a test left it broken (see SparkHolder)."""
    # py4j logs from __del__ at interpreter exit, after pytest closed the streams
    logging.getLogger("py4j").setLevel(logging.WARNING)
    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    os.environ.setdefault("SPARK_LOCAL_DIRS", str(warehouse))
    holder = SparkHolder()
    try:
        yield holder
    finally:
        holder.close()


@pytest.fixture
def spark(spark_holder: SparkHolder, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A local Spark with Delta (UI off, few shuffle partitions), shared by the session's
    tests; a test that fails (a timeout's signal may interrupt py4j mid-command) has the
    next one check it and get a new one, in a new JVM, if it no longer answers."""
    session = spark_holder.get()
    yield session
    if request.node.stash.get(FAILED, False):
        spark_holder.suspect = True


#: Set on a test item whose call phase failed (see pytest_runtest_makereport).
FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call" and report.failed:
        item.stash[FAILED] = True
    return report


@pytest.fixture
def lake_uri(tmp_path: Path) -> str:
    return str(tmp_path / "lake")


#: The bucket of the session's S3 server that every object-store lake test uses.
S3_BUCKET = "lake"


@pytest.fixture(scope="session")
def s3_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStore]:
    """The session's S3 server (versitygw serving a temporary directory), bucket created."""
    store = LocalStore(tmp_path_factory.mktemp("s3") / "data").start()
    try:
        store.create_bucket(S3_BUCKET)
        yield store
    finally:
        store.stop()


@pytest.fixture
def s3_lake(s3_store: LocalStore) -> dict[str, Any]:
    """Flat settings of a fresh lake on the session's S3 server (its own prefix per test)."""
    import uuid

    return {"lake_uri": f"s3://{S3_BUCKET}/{uuid.uuid4().hex}", **s3_store.lake_settings()}


@pytest.fixture(scope="session")
def postgres() -> Iterator[LocalPostgres]:
    """The session's private PostgreSQL (Debian's server, a temporary cluster, a free port).

    Every test that runs a real Airflow scheduler or API server keeps its metadata
    there, one database each (:func:`airflow_database`), as Airflow is run for real.
    """
    server = LocalPostgres().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def airflow_database(
    postgres: LocalPostgres, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[], str]:
    """Make a fresh Airflow metadata database on the session's PostgreSQL, migrated and
    otherwise empty; returns its URL.

    ``airflow db migrate`` runs once per session, on a template database made at the
    first call (10-20 s of Airflow's migrations on a loaded machine); every database
    after that is PostgreSQL's copy of it (``createdb --template``, well under a second),
    so each Airflow the tests start gets the same freshly migrated schema.
    """
    import uuid

    template: list[str] = []

    def make() -> str:
        if not template:
            name = "airflow_template"
            url = postgres.create_database(name)
            env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "SLUICE_"))}
            env.update(
                {
                    "AIRFLOW_HOME": str(tmp_path_factory.mktemp("airflow-template")),
                    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                    **airflowdb.database_env(url),
                }
            )
            subprocess.run(
                [sys.executable, "-m", "airflow", "db", "migrate"],
                check=True,
                env=env,
                stdout=subprocess.DEVNULL,
                timeout=300,
            )
            template.append(name)
        return postgres.create_database("airflow_" + uuid.uuid4().hex[:12], template=template[0])

    return make


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A temporary AIRFLOW_HOME with a migrated SQLite metadata database.

    The variables are set for the whole test session (Airflow reads its
    configuration once per process); ``dags/`` of this checkout is the DAG folder.
    """
    home = tmp_path_factory.mktemp("airflow")
    env = {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        **airflowdb.ENV,
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
    }
    os.environ.update(env)
    subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"],
        check=True,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
    )
    yield home
