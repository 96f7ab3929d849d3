"""Airflow's metadata-database settings for the demo and the tests."""

from __future__ import annotations

import importlib

from pipeline.demo import airflowdb


def _resolve(path: str) -> object:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_a_server_database_overrides_sqlites_connect_args_from_the_environment() -> None:
    """A shell (or a test session) that set SQLite's busy timeout must not reach
    psycopg2, which refuses ``timeout`` ("invalid dsn"): the demo's Airflow then died."""
    inherited = {**airflowdb.ENV}
    env = {**inherited, **airflowdb.database_env("postgresql+psycopg2://u@127.0.0.1:5432/a")}
    for key in (
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS_ASYNC",
    ):
        assert _resolve(env[key]) == {}


def test_sqlite_gets_its_busy_timeout() -> None:
    env = airflowdb.database_env("sqlite:////tmp/x/airflow.db")
    args = _resolve(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS"])
    assert isinstance(args, dict)  # Airflow, once loaded in this process, adds check_same_thread
    assert args["timeout"] == airflowdb.BUSY_TIMEOUT_S
