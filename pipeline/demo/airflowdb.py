"""The SQLite busy timeout of the one-machine Airflow (the demo's, the tests', the benchmarks').

Airflow's scheduler, API server and task runners share one SQLite file, which
lets one writer in at a time; the others wait up to the busy timeout, 5 s by
default in Python's sqlite3. On two loaded cores a scheduler's write held the
lock longer, and the API server answered a DAG run's or a backfill's creation
with 500 "Database error" after exactly 5 s (``database is locked``; seen in
tests/integration/airflow_view/test_scheduler.py at load 2 to 5). Airflow
imports these arguments by the dotted paths in :data:`ENV`.
"""

from __future__ import annotations

from typing import Any

#: How long an Airflow process waits for SQLite's write lock, in seconds.
BUSY_TIMEOUT_S = 60

#: ``connect_args`` of Airflow's engines (Airflow adds ``check_same_thread`` to it).
CONNECT_ARGS: dict[str, Any] = {"timeout": BUSY_TIMEOUT_S}
CONNECT_ARGS_ASYNC: dict[str, Any] = {"timeout": BUSY_TIMEOUT_S}

#: Settings for an Airflow whose metadata database is SQLite.
ENV = {
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS": f"{__name__}.CONNECT_ARGS",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS_ASYNC": f"{__name__}.CONNECT_ARGS_ASYNC",
}
