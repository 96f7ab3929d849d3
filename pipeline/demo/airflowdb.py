"""Airflow's metadata database settings: SQLite's waits, and :func:`database_env` for any URL.

Airflow's scheduler, API server and task runners share one SQLite file, which
lets one writer in at a time; the others wait up to the busy timeout, 5 s by
default in Python's sqlite3. On two loaded cores a scheduler's write held the
lock longer, and the API server answered a DAG run's or a backfill's creation
with 500 "Database error" after exactly 5 s (``database is locked``; seen in
tests/integration/airflow_view/test_scheduler.py at load 2 to 5). Airflow
imports these arguments by the dotted paths in :data:`ENV`.

The wait must stay well below what Airflow's own clients wait for the API
server, or a task dies of it: with a 60 s busy timeout, a backfill's creation
in the API server held the write lock while its action-log INSERT waited on a
second connection for that same lock (60 s, then 500), every other API call
waited behind it, a task runner's calls timed out (5 s default, 5 retries) and
its supervisor killed the task: a run failed (the CI failure of stop 16). So:
a busy timeout of :data:`BUSY_TIMEOUT_S`, and task runners that wait
:data:`EXECUTION_API_TIMEOUT_S` for each API call (a cold API server on a
busy machine answered a task's first call in 18 s).
"""

from __future__ import annotations

from typing import Any

#: How long an Airflow process waits for SQLite's write lock, in seconds.
BUSY_TIMEOUT_S = 15
#: How long a task runner waits for one answer of the execution API, in seconds (> the above).
EXECUTION_API_TIMEOUT_S = 60

#: Attempts of one execution API call, with waits of up to EXECUTION_API_RETRY_WAIT_MAX_S:
#: about two minutes in all. Airflow's default (5 attempts, about 31 s) let a lake task
#: fail with "Connection refused" while a cold API server was still starting.
EXECUTION_API_RETRIES = 12
EXECUTION_API_RETRY_WAIT_MAX_S = 10

#: ``connect_args`` of Airflow's engines (Airflow adds ``check_same_thread`` to it).
CONNECT_ARGS: dict[str, Any] = {"timeout": BUSY_TIMEOUT_S}
CONNECT_ARGS_ASYNC: dict[str, Any] = {"timeout": BUSY_TIMEOUT_S}
#: ``connect_args`` for a server database: none (it also overrides SQLite's, should the
#: caller's environment carry them: psycopg2 refuses ``timeout`` as "invalid dsn").
NO_CONNECT_ARGS: dict[str, Any] = {}

#: Settings for an Airflow whose metadata database is SQLite.
ENV = {
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS": f"{__name__}.CONNECT_ARGS",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS_ASYNC": f"{__name__}.CONNECT_ARGS_ASYNC",
    "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": str(EXECUTION_API_TIMEOUT_S),
    "AIRFLOW__WORKERS__EXECUTION_API_RETRIES": str(EXECUTION_API_RETRIES),
    "AIRFLOW__WORKERS__EXECUTION_API_RETRY_WAIT_MAX": str(EXECUTION_API_RETRY_WAIT_MAX_S),
}


def database_env(sql_alchemy_conn: str) -> dict[str, str]:
    """Airflow's settings for a metadata database at ``sql_alchemy_conn`` (a SQLAlchemy URL).

    SQLite gets the busy-timeout arguments above; PostgreSQL (``postgresql+psycopg2://``;
    Airflow derives its asyncpg URL from it) takes no connect arguments. Either
    way task runners wait :data:`EXECUTION_API_TIMEOUT_S` for the execution API.
    """
    env = {
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": sql_alchemy_conn,
        "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": str(EXECUTION_API_TIMEOUT_S),
        "AIRFLOW__WORKERS__EXECUTION_API_RETRIES": str(EXECUTION_API_RETRIES),
        "AIRFLOW__WORKERS__EXECUTION_API_RETRY_WAIT_MAX": str(EXECUTION_API_RETRY_WAIT_MAX_S),
    }
    if sql_alchemy_conn.startswith("sqlite"):
        env.update(ENV)
    else:
        env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS"] = f"{__name__}.NO_CONNECT_ARGS"
        env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS_ASYNC"] = f"{__name__}.NO_CONNECT_ARGS"
    return env
