"""A real ``airflow api-server`` with Sluice's plugins, a lake and a Redis, for the coverage view.

One server per module (starting one costs about 10-20 s): a temporary
``AIRFLOW_HOME`` with a migrated database on the session's PostgreSQL (a copy of the
session's migrated template), ``dags/`` serialized into it,
``plugins/`` of this checkout as the plugin folder, the simple auth manager
(its generated admin password gives a JWT through ``POST /auth/token``), a
temporary lake and database 11 of a private redis-server (the last test stops it). The server runs
in its own process group and is ended as a whole.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

import httpx
import pyarrow as pa
import pytest

from pipeline.demo import airflowdb
from pipeline.lake.storage.tables import ARCHIVE_LOG, ARCHIVE_LOG_ARROW
from pipeline.local.redisserver import LocalRedis
from pipeline.runtime.ports import free_port

ROOT = Path(__file__).resolve().parents[3]
VIEW_REDIS_DB = 11
#: The streams the server's settings name: a chain stream and a plain one.
CHAIN = "chain:view"
PLAIN = "events:view"
START_DEADLINE_S = 90.0
#: How long :func:`stop` waits for processes to end on SIGTERM before it kills them.
STOP_GRACE_S = 5.0
#: The same at a system's end, which has nothing to save: each module's teardown waited
#: out the whole :data:`STOP_GRACE_S` (4.9-6.9 s) for a process that ignored SIGTERM.
TEARDOWN_GRACE_S = 1.0


@dataclass
class ApiServer:
    """A running ``airflow api-server`` and what the test needs to talk to it."""

    url: str
    token: str
    home: Path
    lake: str
    redis: LocalRedis
    redis_url: str
    log: Path

    def client(self, *, auth: bool = True) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.token}"} if auth else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30.0)

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def write_archive_log(lake: str, rows: list[dict[str, Any]]) -> None:
    """Append rows (``stream``, ``start_ms``, ``end_ms``, ``entries``, ``run_id``) with delta-rs."""
    from deltalake import write_deltalake

    now = datetime.now(UTC)
    full = [
        {
            "blocks": r["entries"] if r["stream"] == CHAIN else 0,
            "invalid": 0,
            "first_id": f"{r['start_ms']}-0",
            "last_id": f"{r['end_ms'] - 1}-0",
            "archived_at": now,
            **r,
        }
        for r in rows
    ]
    write_deltalake(
        f"{lake}/{ARCHIVE_LOG}", pa.Table.from_pylist(full, schema=ARCHIVE_LOG_ARROW), mode="append"
    )


def airflow_env(home: Path, port: int, lake: str, redis_url: str, database: str) -> dict[str, str]:
    """The environment of a real Airflow whose metadata database is ``database`` (PostgreSQL)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "SLUICE_"))}
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            **airflowdb.database_env(database),
            "AIRFLOW__CORE__AUTH_MANAGER": (
                "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
            ),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__WORKERS": "1",
            # Every process of this Airflow signs and checks task tokens with one key (a
            # restarted API server must accept the tokens of tasks already running). Left
            # empty, each process generates its own unless it finds one in airflow.cfg, which
            # no `airflow db migrate` writes here any more (the database is a template's
            # copy): the tasks' calls got "Invalid auth token" (403) and failed, no log.
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
            # The view takes its Redis from the sluice_redis connection, as a deployment would.
            "AIRFLOW_CONN_SLUICE_REDIS": redis_url,
            "SLUICE_LAKE_URI": lake,
            "SLUICE_REDIS_URL": "redis://127.0.0.1:1/0",  # wrong on purpose: the connection wins
            "SLUICE_STREAMS": f"{CHAIN},{PLAIN}",
            "SLUICE_CHAIN_STREAMS": CHAIN,
            "SLUICE_HOT_RETENTION_S": "60",
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        }
    )
    return env


def stop(*procs: subprocess.Popen[bytes], grace_s: float = STOP_GRACE_S) -> None:
    """End each process group: SIGTERM to all at once (their shutdowns overlap: a Celery
    worker's alone took seconds), then SIGKILL to any still running ``grace_s`` later
    (a test's system at its end has nothing to save: :data:`TEARDOWN_GRACE_S`)."""
    running = [proc for proc in procs if proc.poll() is None]
    for proc in running:
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in running:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def view_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRedis]:
    """A private redis-server for the module: the faults test stops it."""
    server = LocalRedis(tmp_path_factory.mktemp("view-redis")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def api_server(
    tmp_path_factory: pytest.TempPathFactory,
    view_redis: LocalRedis,
    airflow_database: Callable[[], str],
) -> Iterator[ApiServer]:
    home = tmp_path_factory.mktemp("airflow-view")
    lake = str(home / "lake")
    port = free_port()
    redis_url = urlunparse(urlparse(view_redis.url)._replace(path=f"/{VIEW_REDIS_DB}"))
    env = airflow_env(home, port, lake, redis_url, airflow_database())
    with start_api_server(env, home, port) as (url, token, log_path):
        yield ApiServer(
            url=url,
            token=token,
            home=home,
            lake=lake,
            redis=view_redis,
            redis_url=redis_url,
            log=log_path,
        )


@contextmanager
def start_api_server(
    env: dict[str, str], home: Path, port: int, *, scheduler: bool = False
) -> Iterator[tuple[str, str, Path]]:
    """Start ``airflow api-server`` (and ``airflow scheduler``), serialize ``dags/``.

    The metadata database is migrated already (``airflow_database`` copies a migrated
    template). Yields (url, admin JWT, api-server log). Every process runs in its own
    process group and is ended as a whole on exit.
    """
    log_path = home / "api-server.log"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(spawn(env, home, "api-server", "--port", str(port), "--workers", "1"))
        # Neither the server nor the scheduler needs a DAG to start: serialize dags/ while
        # they start (a scheduler started after it left its own start-up to the test).
        if scheduler:
            procs.append(spawn(env, home, "scheduler"))
        airflow_cli(env, home, "dags", "reserialize")
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, procs[0], log_path)
        yield url, admin_token(url, home), log_path
    finally:
        stop(*reversed(procs), grace_s=TEARDOWN_GRACE_S)


def spawn(
    env: dict[str, str], home: Path, command: str, *args: str, log: str = ""
) -> subprocess.Popen[bytes]:
    """Start ``airflow COMMAND ARGS`` in its own process group, output appended to ``home/LOG``
    (default ``COMMAND.log``); :func:`stop` ends it as a whole."""
    with (home / (log or f"{command}.log")).open("ab") as log_file:
        return subprocess.Popen(
            [sys.executable, "-m", "airflow", command, *args],
            env=env,
            cwd=home,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def airflow_cli(env: dict[str, str], home: Path, *args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "airflow", *args],
        env=env,
        cwd=home,
        capture_output=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, f"airflow {' '.join(args)}: {done.stderr.decode()[-3000:]}"


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + START_DEADLINE_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(
                f"api-server exited {proc.returncode}:\n{log_path.read_text()[-3000:]}"
            )
        try:
            if httpx.get(f"{url}/api/v2/monitor/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise AssertionError(
        f"api-server not healthy in {START_DEADLINE_S} s:\n{log_path.read_text()[-3000:]}"
    )


def admin_token(url: str, home: Path) -> str:
    """A JWT for the simple auth manager's admin, with its generated password."""
    passwords = json.loads((home / "simple_auth_manager_passwords.json.generated").read_text())
    reply = httpx.post(
        f"{url}/auth/token",
        json={"username": "admin", "password": passwords["admin"]},
        timeout=30,
    )
    assert reply.status_code in (200, 201), reply.text
    return str(reply.json()["access_token"])
