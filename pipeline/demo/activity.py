"""What the running demo does, measured from outside its processes.

:class:`Activity` owns the demo's own traffic and observers, each an asyncio
task started by :meth:`Activity.run` and cancelled with it:

- the bus RPC: a handler of ``demo.ping`` on twin 2's Redis and a caller on
  twin 1's Redis, so every call crosses both ``sluice bus`` processes and
  their signed HTTP hop;
- the server's ``/status.json`` (head, reorgs, subscribers, lake coverage,
  the Redis hot window), read every second;
- the nodes' round trips (one line per reply in their ``--record`` files);
- Airflow's ``sluice_archive`` runs through its REST API (and an unpause if
  someone paused the DAG: a trigger of a paused DAG only sits queued);
- the first ``archive_log`` row: an empty minute just before block 0,
  archived once (see :meth:`Activity._seed`);
- whether Redis was trimmed below block 0 (the chain stream's first entry).

Every observer keeps the last error it met as text: the view shows it, the
demo keeps going.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import aiohttp
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from pipeline import keys
from pipeline.blockcodec import ENTRY_FIELD
from pipeline.bus.client import BusClient
from pipeline.bus.envelope import Envelope
from pipeline.bus.server import BusServer
from pipeline.chain.serve.status import peek_header
from pipeline.demo.plan import RPC_CMD, STREAM, TWINS, Plan
from pipeline.demo.procs import MARKER
from pipeline.errors import BusError
from pipeline.redisio import conn as redisconn

log = logging.getLogger(__name__)

RPC_EVERY_S = 2.0
STATUS_EVERY_S = 1.0
AIRFLOW_EVERY_S = 5.0
HTTP_TIMEOUT_S = 5.0
#: The demo's archive interval (SLUICE_ARCHIVE_CRON every minute), in ms.
INTERVAL_MS = 60_000
#: Tries, and seconds each, of the one ``sluice lake archive`` that seeds archive_log.
SEED_ATTEMPTS = 5
SEED_TIMEOUT_S = 120.0


@dataclass(slots=True)
class Counts:
    """Mutable figures the view and the check read (owned by :class:`Activity`)."""

    status: dict[str, Any] = field(default_factory=dict)
    status_error: str = ""
    rpc_ok: int = 0
    rpc_failed: int = 0
    rpc_last_ms: float | None = None
    rpc_error: str = ""
    round_trips: dict[str, int] = field(default_factory=dict)
    #: newest first: {"run_id", "state", "start", "end"}
    runs: list[dict[str, Any]] = field(default_factory=list)
    runs_ok: int = 0
    airflow_error: str = ""
    #: where archive_log starts, once the demo wrote its first row (None: not yet)
    seed: str | None = None
    #: times the demo found sluice_archive paused and unpaused it
    unpaused: int = 0
    #: number of the oldest block still in Redis (None: stream empty or unread)
    redis_first_num: int | None = None
    trimmed_at: float | None = None

    @property
    def trimmed(self) -> bool:
        return self.redis_first_num is not None and self.redis_first_num > 0

    def stream(self) -> dict[str, Any]:
        for s in self.status.get("streams", ()):
            if s.get("name") == STREAM:
                return cast(dict[str, Any], s)
        return {}


class Activity:
    def __init__(self, plan: Plan, is_up: Callable[[str], bool] = lambda name: True) -> None:
        self.plan = plan
        #: whether a component is up: the bus caller waits for both twins (no false failures)
        self.is_up = is_up
        self.counts = Counts()
        self._token: str | None = None
        #: runs of intervals that ended before this are an earlier demo's (Airflow's home is kept)
        self.since = time.time() - 60

    async def run(self) -> None:
        """Until cancelled."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._rpc_handler())
            group.create_task(self._rpc_caller())
            group.create_task(self._status())
            group.create_task(self._files())
            group.create_task(self._airflow())
            group.create_task(self._trim())
            group.create_task(self._seed())

    # --- the bus ---------------------------------------------------------------

    async def _rpc_handler(self) -> None:
        server = BusServer.from_url(self.plan.redis_url(2), workers=1)

        @server.handler(RPC_CMD)
        async def ping(data: bytes, request: Envelope) -> bytes:
            return b"pong:" + data

        try:
            await server.serve()
        finally:
            await server.close()

    async def call_once(self, client: BusClient, seq: int) -> None:
        started = time.monotonic()
        payload = f"{seq}"
        try:
            [answer] = await client.call(
                RPC_CMD, dst=[TWINS[1]], data=payload, exp=10, retries=2, wait_s=15
            )
        except (BusError, RedisError, OSError) as exc:
            self.counts.rpc_failed += 1
            self.counts.rpc_error = f"{type(exc).__name__}: {exc}"[:200]
            return
        if answer != f"pong:{payload}".encode():
            self.counts.rpc_failed += 1
            self.counts.rpc_error = f"unexpected answer {answer[:60]!r}"
            return
        self.counts.rpc_ok += 1
        self.counts.rpc_last_ms = (time.monotonic() - started) * 1000

    async def _rpc_caller(self) -> None:
        while True:
            if all(self.is_up(f"bus-{twin}") for twin in TWINS):
                break
            await asyncio.sleep(STATUS_EVERY_S)
        client = BusClient.from_url(self.plan.redis_url(1), max_connections=4)
        seq = 0
        try:
            while True:
                seq += 1
                await self.call_once(client, seq)
                await asyncio.sleep(RPC_EVERY_S)
        finally:
            await client.close()

    # --- the server's status ------------------------------------------------------

    async def _status(self) -> None:
        url = f"http://127.0.0.1:{self.plan.serve_port}/status.json"
        timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                try:
                    async with session.get(url) as resp:
                        resp.raise_for_status()
                        self.counts.status = await resp.json()
                        self.counts.status_error = ""
                except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                    self.counts.status_error = f"status page: {exc!r}"[:200]
                await asyncio.sleep(STATUS_EVERY_S)

    async def _files(self) -> None:
        while True:
            for node in ("node-a", "node-b"):
                self.counts.round_trips[node] = _count_lines(self.plan.record(node))
            await asyncio.sleep(STATUS_EVERY_S)

    async def _trim(self) -> None:
        client = redisconn.connect(self.plan.redis_url(), redisconn.Role.CLI)
        try:
            while True:
                with contextlib.suppress(RedisError, OSError):
                    self.counts.redis_first_num = await first_block_num(client)
                    if self.counts.trimmed and self.counts.trimmed_at is None:
                        self.counts.trimmed_at = time.monotonic()
                await asyncio.sleep(STATUS_EVERY_S)
        finally:
            await client.aclose()

    async def _seed(self) -> None:
        """Archive the empty minute just before block 0 once: ``archive_log``'s first row.

        With catchup off, Airflow's first run archives the latest whole
        interval when it came up, and each archive task catches up the holes
        after the stream's first ``archive_log`` row, never before it. So the
        minutes between block 0 and that first run would never be archived,
        and the safe trim never trims past an unarchived entry. One row for
        the minute before block 0 (nothing in Redis there: no Spark) makes
        those minutes holes the scheduled runs fill, oldest first, each run
        archiving, marking canonical and trimming in that order. A backfill
        would instead run beside the scheduled runs, and one run's trim could
        then cut blocks another run archived but had not marked canonical yet
        (the server then refuses a subscriber from 0 with a history gap until
        the next canonical marking).
        """
        client = redisconn.connect(self.plan.redis_url(), redisconn.Role.CLI)
        try:
            while True:
                with contextlib.suppress(RedisError, OSError):
                    first = cast(
                        list[tuple[bytes, Any]],
                        await client.xrange(keys.stream(STREAM), count=1),
                    )
                    if first:
                        break
                await asyncio.sleep(STATUS_EVERY_S)
        finally:
            await client.aclose()
        end_ms = redisconn.parse_entry_id(first[0][0])[0] // INTERVAL_MS * INTERVAL_MS
        start_ms = end_ms - INTERVAL_MS
        log_path = self.plan.dir / "seed.log"
        for attempt in range(1, SEED_ATTEMPTS + 1):
            with log_path.open("ab") as out:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "pipeline.cli", "lake", "archive", "--stream", STREAM,
                    "--start-ms", str(start_ms), "--end-ms", str(end_ms), "--run-id", "demo__seed",
                    stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out,
                    env={**os.environ, **self.plan.sluice_env(), MARKER: self.plan.demo_id},
                    start_new_session=True,
                )  # fmt: skip
                try:
                    async with asyncio.timeout(SEED_TIMEOUT_S):
                        code = await proc.wait()
                except BaseException:
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
                    await proc.wait()
                    raise
            if code == 0:
                self.counts.seed = f"archive_log starts at {_iso(start_ms)[11:16]} UTC"
                return
            self.counts.seed = f"seeding archive_log failed (code {code}, {log_path})"
            await asyncio.sleep(attempt * 2.0)

    # --- Airflow ----------------------------------------------------------------------

    async def _airflow(self) -> None:
        timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                if not self.is_up("airflow"):
                    self.counts.airflow_error = "Airflow is starting"
                    await asyncio.sleep(STATUS_EVERY_S)
                    continue
                try:
                    await self._airflow_once(session)
                    self.counts.airflow_error = ""
                except (aiohttp.ClientError, TimeoutError, ValueError, KeyError) as exc:
                    self._token = None
                    self.counts.airflow_error = f"{type(exc).__name__}: {exc}"[:200]
                await asyncio.sleep(AIRFLOW_EVERY_S)

    async def _auth(self, session: aiohttp.ClientSession) -> dict[str, str]:
        if self._token is None:
            password = self.plan.admin_password()
            if password is None:
                raise KeyError("no admin password yet")
            async with session.post(
                f"{self.plan.airflow_url}/auth/token",
                json={"username": "admin", "password": password},
            ) as resp:
                resp.raise_for_status()
                self._token = str((await resp.json())["access_token"])
        return {"Authorization": f"Bearer {self._token}"}

    async def _airflow_once(self, session: aiohttp.ClientSession) -> None:
        headers = await self._auth(session)
        base = f"{self.plan.airflow_url}/api/v2/dags/sluice_archive"
        async with session.get(base, headers=headers) as resp:
            if resp.status == 404:
                raise KeyError("sluice_archive not parsed yet")
            resp.raise_for_status()
            dag = await resp.json()
        if dag.get("is_paused"):  # a paused DAG's runs only sit queued, with no hint
            async with session.patch(base, headers=headers, json={"is_paused": False}) as resp:
                resp.raise_for_status()
            self.counts.unpaused += 1
        params = {"order_by": "-run_after", "limit": "100"}
        async with session.get(f"{base}/dagRuns", headers=headers, params=params) as resp:
            resp.raise_for_status()
            doc = await resp.json()
        runs = [
            r for r in doc.get("dag_runs", []) if _epoch(r.get("data_interval_end")) >= self.since
        ]
        self.counts.runs = [
            {
                "run_id": r.get("dag_run_id"),
                "state": r.get("state"),
                "start": r.get("data_interval_start"),
                "end": r.get("data_interval_end"),
            }
            for r in runs
        ]
        self.counts.runs_ok = sum(1 for r in runs if r.get("state") == "success")


async def first_block_num(client: aioredis.Redis) -> int | None:
    """Number of the oldest block still in the chain stream (None: empty)."""
    entries = cast(
        list[tuple[bytes, dict[bytes, bytes]]], await client.xrange(keys.stream(STREAM), count=1)
    )
    if not entries:
        return None
    num, _, _ = peek_header(entries[0][1][ENTRY_FIELD])
    return num


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _epoch(iso: Any) -> float:
    try:
        return datetime.fromisoformat(str(iso)).timestamp()
    except ValueError:
        return 0.0


def _count_lines(path: Any) -> int:
    try:
        with open(path, "rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 16), b""))
    except OSError:
        return 0
