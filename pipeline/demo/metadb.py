"""Airflow's metadata database for one ``sluice demo``: a fresh copy of a migrated template.

Each demo's Airflow starts on a database of its own, made for that run, so a
demo never shows the runs (failed ones included) of an earlier demo, nor mixes
the histories of a local lake and an S3 one. Before, every demo reused the
``postgres`` database under ``var/demo/airflow/postgres``.

Theory of operation, on the demo's private PostgreSQL (kept between demos):

- a *template* database holds Airflow's schema, migrated once per Airflow
  version (:func:`template_name`): built under a temporary name by ``airflow db
  migrate`` and renamed when the migration succeeded, so a migration that was
  interrupted is never used; it then takes no connections;
- each demo drops its run database (:data:`RUN_DATABASE`, with whatever an
  earlier demo left connected to it) and creates it again as a copy of the
  template (``CREATE DATABASE ... TEMPLATE``: well under a second, where
  migrating an empty database took a minute on a loaded machine);
- templates of other Airflow versions are dropped.

``python -m pipeline.demo.metadb --port P -- airflow standalone`` is the demo's
Airflow component: it prepares the database, then runs Airflow in its place
(``exec``), so the supervisor watches and stops Airflow itself.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from pipeline.errors import ConfigError
from pipeline.local.postgres import USER

#: The database each demo's Airflow runs on, made afresh by every demo.
RUN_DATABASE = "airflow_demo"
#: Templates are named this, then the Airflow version.
TEMPLATE_PREFIX = "airflow_template_"
#: Seconds to wait for PostgreSQL to take a connection.
CONNECT_WAIT_S = 60.0


def template_name(version: str) -> str:
    """The template database of Airflow ``version`` (``3.3.2`` -> ``airflow_template_3_3_2``)."""
    return TEMPLATE_PREFIX + re.sub(r"[^0-9a-z]+", "_", version.lower()).strip("_")


def database_url(port: int, database: str) -> str:
    """The SQLAlchemy URL of ``database`` on the demo's PostgreSQL (what Airflow is given)."""
    return f"postgresql+psycopg2://{USER}@127.0.0.1:{port}/{database}"


@contextmanager
def _admin(port: int) -> Iterator[Any]:
    """A cursor on the server's ``postgres`` database, autocommit (databases are made outside
    a transaction), once the server takes connections."""
    import psycopg2  # type: ignore[import-untyped]

    deadline = time.monotonic() + CONNECT_WAIT_S
    while True:
        try:
            conn = psycopg2.connect(host="127.0.0.1", port=port, user=USER, dbname="postgres")
            break
        except psycopg2.OperationalError as exc:
            if time.monotonic() > deadline:
                raise ConfigError(f"PostgreSQL on port {port} takes no connection: {exc}") from exc
            time.sleep(0.5)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            yield cur
    finally:
        conn.close()


def _drop(cur: Any, name: str) -> None:
    from psycopg2 import sql

    ident = sql.Identifier(name)
    cur.execute("SELECT datistemplate FROM pg_database WHERE datname = %s", (name,))
    row = cur.fetchone()
    if row is None:
        return
    if row[0]:  # a template cannot be dropped as one
        cur.execute(sql.SQL("ALTER DATABASE {} WITH IS_TEMPLATE false").format(ident))
    cur.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(ident))


def fresh_database(
    port: int,
    *,
    version: str,
    migrate: Callable[[str], None],
    database: str = RUN_DATABASE,
    say: Callable[[str], None] = lambda text: None,
) -> str:
    """Make ``database`` afresh as a copy of the template of Airflow ``version`` (migrated
    with ``migrate(url)`` first when there is none); returns its URL. See the module doc."""
    from psycopg2 import sql

    template = template_name(version)
    with _admin(port) as cur:
        cur.execute("SELECT datname FROM pg_database")
        names = {row[0] for row in cur.fetchall()}
        for stale in sorted(names):
            if stale.startswith(TEMPLATE_PREFIX) and stale != template:
                _drop(cur, stale)
        if template not in names:
            building = f"{template}_building"
            _drop(cur, building)
            cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(building)))
            say(f"migrating a template of Airflow {version}'s metadata database (once)")
            began = time.monotonic()
            migrate(database_url(port, building))
            say(f"template migrated in {time.monotonic() - began:.1f}s")
            cur.execute(
                sql.SQL("ALTER DATABASE {} RENAME TO {}").format(
                    sql.Identifier(building), sql.Identifier(template)
                )
            )
            cur.execute(
                sql.SQL("ALTER DATABASE {} WITH IS_TEMPLATE true ALLOW_CONNECTIONS false").format(
                    sql.Identifier(template)
                )
            )
        _drop(cur, database)
        cur.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(database), sql.Identifier(template)
            )
        )
    say(f"Airflow's metadata database {database!r} made afresh from {template!r}")
    return database_url(port, database)


def airflow_migrate(airflow: str) -> Callable[[str], None]:
    """``airflow db migrate`` of the database at a URL, with this process's Airflow settings."""

    def migrate(url: str) -> None:
        env = {**os.environ, "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": url}
        done = subprocess.run([airflow, "db", "migrate"], env=env, check=False)
        if done.returncode != 0:
            raise ConfigError(f"airflow db migrate failed with code {done.returncode}")

    return migrate


def main(argv: list[str]) -> int:
    """Prepare the run database, then ``exec`` the command after ``--``."""
    from importlib.metadata import version

    p = argparse.ArgumentParser(prog="python -m pipeline.demo.metadb")
    p.add_argument("--port", type=int, required=True, help="the demo's PostgreSQL port")
    p.add_argument("--database", default=RUN_DATABASE)
    p.add_argument("command", nargs="+", help="what to run on it (airflow standalone)")
    args = p.parse_args(argv)

    def say(text: str) -> None:
        sys.stdout.write(f"sluice demo: {text}\n")
        sys.stdout.flush()

    import psycopg2

    try:
        fresh_database(
            args.port, version=version("apache-airflow"), database=args.database,
            migrate=airflow_migrate(args.command[0]), say=say,
        )  # fmt: skip
    except (ConfigError, psycopg2.Error) as exc:
        say(f"Airflow's metadata database could not be made: {str(exc).strip()}")
        return 1
    sys.stdout.flush()
    os.execvp(args.command[0], args.command)
    return 0  # not reached


__all__ = [
    "RUN_DATABASE",
    "TEMPLATE_PREFIX",
    "airflow_migrate",
    "database_url",
    "fresh_database",
    "main",
    "template_name",
]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
