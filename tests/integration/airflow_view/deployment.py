"""A real Airflow scheduler and API server archiving one plain stream, and what its tests ask.

:func:`local_deployment` starts ``airflow api-server`` and ``airflow scheduler``
(LocalExecutor) on a fresh PostgreSQL database, the lake jobs as thin clients of the
session's Spark Connect server, the stream's days written into a private Redis before
Airflow starts (no run can see a half-written interval). The archive DAG runs daily
(``0 0 * * *``), so the scheduler starts exactly one run on its own, for yesterday, when
the DAG first appears. The rest reads Airflow's REST API and the local lake.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse, urlunparse

import httpx
import pytest
import redis

from pipeline import keys
from pipeline.lake.storage.tables import ARCHIVE_LOG
from pipeline.local.redisserver import LocalRedis
from pipeline.runtime.ports import free_port
from tests.integration.lake.connect import shared_server
from tests.support.poll import until_sync

from .conftest import airflow_env, start_api_server

#: The DAG the scheduler tests run, daily (``0 0 * * *``): the scheduler starts one run on
#: its own, for yesterday, when the DAG first appears.
DAG = "sluice_archive"
DAY = timedelta(days=1)
#: Longest a test waits for one piece of scheduler work (a hang, not a speed).
DEADLINE_S = 600.0
#: How often :func:`wait` polls (an API call or a file read each): a task's hop from the
#: scheduler to a worker takes well under a second, a poll once a second added up to a
#: second to every wait.
POLL_S = 0.25


def ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


@dataclass
class Deployment:
    """A real ``airflow api-server`` and ``airflow scheduler`` archiving one plain stream into
    ``lake`` (its URI), days (offsets from ``today``) whose entries are ``ids``; ``hold`` is
    the test hook that holds an archive job (``SLUICE_TEST_HOLD_FILE``)."""

    url: str
    token: str
    home: Path
    lake: str
    redis: redis.Redis
    today: datetime
    ids: dict[int, list[str]]  # day offset -> entry ids written that day
    hold: Path

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=30.0
        )

    def interval(self, day: int) -> tuple[int, int]:
        start = self.today + day * DAY
        return ms(start), ms(start + DAY)


def midnight() -> datetime:
    """Today, 00:00 UTC."""
    return datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def fresh_db(server: LocalRedis, db: int) -> tuple[str, redis.Redis]:
    """Database ``db`` of ``server``, emptied: its URL and a client."""
    url = urlunparse(urlparse(server.url)._replace(path=f"/{db}"))
    client = redis.Redis.from_url(url, socket_timeout=10)
    client.flushdb()
    return url, client


def write_days(
    client: redis.Redis, stream: str, day0: datetime, counts: dict[int, int], *, seqs: int = 1
) -> dict[int, list[str]]:
    """``counts[day]`` entries on each day (offset from ``day0``), an hour apart; their ids
    take sequence numbers ``0..seqs-1`` in turn. Returns the ids by day."""
    ids: dict[int, list[str]] = {}
    for day, count in counts.items():
        start = ms(day0 + day * DAY)
        ids[day] = [f"{start + 3_600_000 * (i + 1)}-{i % seqs}" for i in range(count)]
        for entry_id in ids[day]:
            client.xadd(keys.stream(stream), {b"n": entry_id.encode()}, id=entry_id)
    return ids


def scheduler_env(
    port: int, home: Path, stream: str, remote: str, *, job_timeout_s: int
) -> dict[str, str]:
    """What a scheduler test adds to :func:`airflow_env`: the execution API of the server at
    ``port``, one plain daily-archived stream (nothing trimmed: Redis stays the truth), the
    lake jobs on the Spark Connect server ``remote``, no retries, the hold file."""
    return {
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
        "SLUICE_STREAMS": stream,
        # A plain stream: no canonical marking (a Spark MERGE per run) to wait for.
        "SLUICE_CHAIN_STREAMS": "",
        "SLUICE_ARCHIVE_CRON": "0 0 * * *",
        "SLUICE_HOT_RETENTION_S": str(30 * 86400),
        "SLUICE_SPARK_REMOTE": remote,
        "SLUICE_LAKE_TASK_RETRIES": "0",
        "SLUICE_LAKE_JOB_TIMEOUT_S": str(job_timeout_s),
        "SLUICE_VAR_DIR": str(home / "var"),
        "SLUICE_TEST_HOLD_FILE": str(home / "hold"),
    }


def local_executor_env(parallelism: int) -> dict[str, str]:
    """LocalExecutor with ``parallelism`` slots, its log servers on free ports."""
    return {
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": str(parallelism),
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
    }


def wait(what: str, check: Callable[[], Any], deadline_s: float = DEADLINE_S) -> Any:
    """Poll an Airflow condition every :data:`POLL_S` until it holds; its value."""
    return until_sync(check, what, within_s=deadline_s, every_s=POLL_S)


def get(http: httpx.Client, path: str, **params: Any) -> Any:
    reply = http.get(path, params=params)
    assert reply.status_code == 200, f"{path}: {reply.status_code} {reply.text[:500]}"
    return reply.json()


def dag_runs(http: httpx.Client) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = get(http, f"/api/v2/dags/{DAG}/dagRuns", limit=100)["dag_runs"]
    return runs


def failures(http: httpx.Client, runs: list[dict[str, Any]]) -> list[str]:
    """Each failed run's failed tasks with the end of their log (what a failure report needs)."""
    out = []
    for run in runs:
        if run["state"] == "success":
            continue
        base = f"/api/v2/dags/{DAG}/dagRuns/{quote(run['dag_run_id'], safe='')}/taskInstances"
        for ti in get(http, base)["task_instances"]:
            if ti["state"] in ("success", "skipped"):
                continue
            path = f"{base}/{ti['task_id']}/logs/{max(1, ti['try_number'])}"
            reply = http.get(path, params={"map_index": ti["map_index"], "full_content": "true"})
            content = reply.json().get("content", []) if reply.status_code == 200 else []
            lines = [
                f"{e.get('level', '')} {e.get('event', '')}" for e in content if isinstance(e, dict)
            ]
            tail = "\n".join(lines[-40:])
            out.append(
                f"{run['dag_run_id']} {ti['task_id']}[{ti['map_index']}] {ti['state']}:\n{tail}"
            )
    return out


def lake_ids(lake: str, stream: str, lo: int = 0, hi: int = 2**63) -> list[str]:
    """Ids of ``stream``'s entries in the local lake, ``lo <= ms < hi``, in order."""
    from deltalake import DeltaTable

    rows = DeltaTable(f"{lake}/stream_entries").to_pyarrow_table().to_pylist()
    return sorted(
        (r["entry_id"] for r in rows if r["stream"] == stream and lo <= r["entry_ms"] < hi),
        key=lambda i: tuple(map(int, i.split("-"))),
    )


def log_rows(lake: str, stream: str) -> list[tuple[int, int, int]]:
    """``stream``'s rows of the local lake's ``archive_log``: (start_ms, end_ms, entries)."""
    from deltalake import DeltaTable

    path = f"{lake}/{ARCHIVE_LOG}"
    if not DeltaTable.is_deltatable(path):
        return []
    rows = DeltaTable(path).to_pyarrow_table().to_pylist()
    return sorted((r["start_ms"], r["end_ms"], r["entries"]) for r in rows if r["stream"] == stream)


@contextmanager
def local_deployment(
    request: pytest.FixtureRequest,
    server: LocalRedis,
    database: str,
    *,
    stream: str,
    db: int,
    counts: dict[int, int],
    parallelism: int,
    seqs: int = 1,
    held_day: int | None = None,
    extra: dict[str, str] | None = None,
) -> Iterator[Deployment]:
    """A :class:`Deployment` of ``stream`` in database ``db`` of ``server`` (entries as
    :func:`write_days` writes them), LocalExecutor with ``parallelism`` slots, plus the
    ``extra`` settings; with ``held_day``, that day's archive job holds from the start."""
    factory: pytest.TempPathFactory = request.getfixturevalue("tmp_path_factory")
    remote = shared_server(request, factory.getbasetemp()).url
    home = factory.mktemp(f"airflow-{stream.replace(':', '-')}")
    lake = str(home / "lake")
    port = free_port()
    redis_url, client = fresh_db(server, db)
    day0 = midnight()
    ids = write_days(client, stream, day0, counts, seqs=seqs)
    hold = home / "hold"
    if held_day is not None:
        hold.write_text(f"--start-ms {ms(day0 + held_day * DAY)} ")
    env = airflow_env(home, port, lake, redis_url, database)
    env.update(local_executor_env(parallelism))
    env.update(scheduler_env(port, home, stream, remote, job_timeout_s=600))
    env.update(extra or {})
    try:
        with start_api_server(env, home, port, scheduler=True) as (url, token, _log):
            yield Deployment(url, token, home, lake, client, day0, ids, hold)
    finally:
        hold.unlink(missing_ok=True)
        client.close()
