"""Each demo's Airflow gets a metadata database of its own, a copy of a template migrated once.

On a real PostgreSQL (the session's). The migration here is a stand-in that
makes one table, so each test takes a second; the real one (``airflow db
migrate``) is what the demo passes (``make demo-check``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg2
import pytest

from pipeline.demo import metadb
from pipeline.demo.metadb import fresh_database, template_name
from pipeline.local.postgres import LocalPostgres


def _connect(url: str) -> Any:
    port, database = url.rpartition(":")[2].split("/")
    conn = psycopg2.connect(host="127.0.0.1", port=int(port), user="postgres", dbname=database)
    conn.autocommit = True
    return conn


def _rows(url: str, query: str) -> list[tuple[Any, ...]]:
    conn = _connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute(query)
            return list(cur.fetchall()) if cur.description else []
    finally:
        conn.close()


class _Migration:
    """Makes Airflow's stand-in schema: one table of DAG runs."""

    def __init__(self) -> None:
        self.urls: list[str] = []

    def __call__(self, url: str) -> None:
        self.urls.append(url)
        _rows(url, "CREATE TABLE dag_run (run_id text, state text)")


@pytest.fixture
def names(postgres: LocalPostgres) -> Iterator[tuple[str, str]]:
    """A run database and an Airflow version of this test's own (templates are per version)."""
    tag = uuid.uuid4().hex[:8]
    yield f"demo_{tag}", f"0.0.{tag}"


def _databases(postgres: LocalPostgres) -> set[str]:
    url = metadb.database_url(postgres.port, "postgres")
    return {row[0] for row in _rows(url, "SELECT datname FROM pg_database")}


def test_a_second_demo_starts_on_a_clean_database_without_migrating_again(
    postgres: LocalPostgres, names: tuple[str, str]
) -> None:
    """Issue 33, 8: the second demo showed the first one's failed runs."""
    database, version = names
    migrate = _Migration()
    url = fresh_database(postgres.port, version=version, migrate=migrate, database=database)
    assert url == metadb.database_url(postgres.port, database)
    assert len(migrate.urls) == 1 and not migrate.urls[0].endswith(f"/{database}")
    _rows(url, "INSERT INTO dag_run VALUES ('scheduled__1', 'failed')")  # the first demo's run
    held = _connect(url)  # and an Airflow of it still connected
    try:
        again = fresh_database(postgres.port, version=version, migrate=migrate, database=database)
    finally:
        held.close()
    assert again == url and len(migrate.urls) == 1  # copied from the template, not migrated
    assert _rows(again, "SELECT * FROM dag_run") == []  # the schema, and no earlier run
    assert template_name(version) in _databases(postgres)


def test_a_new_airflow_version_migrates_a_new_template_and_drops_the_old(
    postgres: LocalPostgres, names: tuple[str, str]
) -> None:
    database, version = names
    migrate = _Migration()
    fresh_database(postgres.port, version=version, migrate=migrate, database=database)
    newer = version + ".1"
    fresh_database(postgres.port, version=newer, migrate=migrate, database=database)
    assert len(migrate.urls) == 2
    present = _databases(postgres)
    assert template_name(newer) in present and template_name(version) not in present


def test_a_failed_migration_leaves_no_template(
    postgres: LocalPostgres, names: tuple[str, str]
) -> None:
    database, version = names

    def broken(url: str) -> None:
        raise RuntimeError("migration interrupted")

    with pytest.raises(RuntimeError):
        fresh_database(postgres.port, version=version, migrate=broken, database=database)
    assert template_name(version) not in _databases(postgres)
    migrate = _Migration()  # the next demo migrates again, from scratch
    url = fresh_database(postgres.port, version=version, migrate=migrate, database=database)
    assert len(migrate.urls) == 1 and _rows(url, "SELECT * FROM dag_run") == []


def test_template_names() -> None:
    assert template_name("3.3.2") == "airflow_template_3_3_2"
    assert template_name("3.4.0rc1+local") == "airflow_template_3_4_0rc1_local"
