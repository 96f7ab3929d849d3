"""The Sluice coverage view inside Airflow: per stream, what the lake holds and what Redis holds.

Theory of operation: an :class:`AirflowPlugin` that mounts a small FastAPI app
on Airflow's API server under :data:`URL_PREFIX` (``/sluice``) and adds an
external view to Airflow's navigation (Browse -> Sluice coverage) that shows
its page in the UI.

- ``GET /sluice/coverage.json``: per stream the lake's archived intervals
  merged into runs, the gaps between them, the trim point and how far the
  next safe trim could go, the Redis hot window (``XINFO STREAM``), and the
  newest ``archive_log`` rows with links to their ``sluice_archive`` DAG run
  and the archive task's log in Airflow's UI; plus the DAG's newest runs. The
  numbers come from the same pure functions as the status page of ``sluice
  serve`` (:mod:`pipeline.chain.serve.coverage`), so both views agree.
- ``GET /sluice/``: a plain HTML page (no build step) that polls the JSON.

Bounded and shared: one snapshot per :data:`SNAPSHOT_TTL_S` serves every
viewer; ``archive_log`` is read with delta-rs (never a JVM) at most once per
:data:`LAKE_TTL_S` in a worker thread, stale-while-refresh, never two reads
at once; the DAG runs are read from Airflow's metadata database in a worker
thread the same way; Redis gets one pipelined ``XINFO STREAM`` per snapshot
under :data:`REDIS_TIMEOUT_S`. A source that fails is reported in the JSON
(``lake.error``, ``redis.error``, ``airflow.error``) and the rest is still
served; nothing answers with a traceback.

Auth: Airflow 3.3 does not authenticate plugin FastAPI apps (a mounted app
inherits none of the core API's dependencies). This app requires, on every
route, what Airflow's own ``GET /api/v2/dags/sluice_archive/dagRuns`` requires:
a valid Airflow JWT (``Authorization: Bearer`` or the UI's ``_token`` cookie,
which the page inside the UI's iframe sends) and the auth manager's read
permission on the DAG's runs.

Configuration: ``SLUICE_*`` settings of the API server's environment (the
lake URI, the streams, the hot-retention window); the Redis URL from the
``sluice_redis`` Airflow connection when there is one (:class:`SluiceRedisHook`),
else ``SLUICE_REDIS_URL``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar
from urllib.parse import quote, urlparse

import sluice_airflow_internals as internals
from airflow.plugins_manager import AirflowPlugin

from pipeline import __version__, keys
from pipeline.chain.serve.coverage import Archived, Interval, coverage, summarize
from pipeline.lake.intake.streamset import is_chain, is_configured, is_pattern
from pipeline.runtime.snapshot import SharedSnapshot
from pipeline.settings import LakeSettings

if TYPE_CHECKING:
    from fastapi import FastAPI, Request
    from fastapi.responses import HTMLResponse, JSONResponse, Response
    from fastapi.security import HTTPBearer

log = logging.getLogger(__name__)

#: The DAG whose runs archive the streams.
DAG_ID = "sluice_archive"
#: Where the FastAPI app is mounted on the API server.
URL_PREFIX = "/sluice"
#: Every viewer within this window gets the same snapshot.
SNAPSHOT_TTL_S = 2.0
#: ``archive_log`` is read at most this often (a slow lake: at most 10% of the time).
LAKE_TTL_S = 5.0
#: The metadata database is asked for the DAG runs at most this often.
AIRFLOW_TTL_S = 2.0
#: How long the first snapshot waits for a source's first read.
FIRST_WAIT_S = 5.0
#: Redis part of a snapshot: give up after this long and report Redis down.
REDIS_TIMEOUT_S = 2.0
#: Newest ``archive_log`` rows shown per stream, and newest DAG runs shown.
ROWS_PER_STREAM = 10
DAG_RUNS = 20
#: Errors are cut to this length (they go to the page, not a log).
ERROR_CHARS = 300

_PAGE = Path(__file__).with_name("sluice_coverage.html")

T = TypeVar("T")


# --- reading archive_log (blocking, in a worker thread) ---------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class LoggedInterval:
    """One ``archive_log`` row as the view shows it."""

    run_id: str | None
    start_ms: int
    end_ms: int
    entries: int
    blocks: int
    archived_at_ms: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class LakeView:
    """What ``archive_log`` says: per stream the merged coverage and the newest rows."""

    archived: dict[str, Archived] = field(default_factory=dict)
    newest: dict[str, tuple[LoggedInterval, ...]] = field(default_factory=dict)


class ArchiveLogReader:
    """Reads ``archive_log`` with delta-rs (no JVM); one table handle, refreshed incrementally."""

    COLUMNS = ["stream", "start_ms", "end_ms", "entries", "blocks", "run_id", "archived_at"]

    def __init__(self, lake: LakeSettings | str) -> None:
        from pipeline.lake.storage import tables

        self.lake = LakeSettings.from_url(lake) if isinstance(lake, str) else lake
        self.uri = self.lake.table(tables.ARCHIVE_LOG)
        self._table: Any = None

    def read(self) -> LakeView:
        """Blocking. Raises ``OSError``, ``ValueError`` or deltalake's ``DeltaError``."""
        from pipeline.lake.storage import store, tables

        if self._table is None:
            if not store.is_table(self.lake, tables.ARCHIVE_LOG):
                return LakeView()
            self._table = store.open_table(self.lake, tables.ARCHIVE_LOG)
        else:
            self._table.update_incremental()
        table = self._table.to_pyarrow_dataset().to_table(columns=self.COLUMNS)
        intervals: dict[str, list[Interval]] = {}
        rows: dict[str, list[LoggedInterval]] = {}
        for stream, start, end, entries, blocks, run_id, at in zip(
            *(table.column(c).to_pylist() for c in self.COLUMNS), strict=True
        ):
            intervals.setdefault(stream, []).append(
                Interval(start_ms=start, end_ms=end, entries=entries or 0, blocks=blocks or 0)
            )
            rows.setdefault(stream, []).append(
                LoggedInterval(
                    run_id=run_id,
                    start_ms=start,
                    end_ms=end,
                    entries=entries or 0,
                    blocks=blocks or 0,
                    archived_at_ms=int(at.timestamp() * 1000) if at is not None else None,
                )
            )
        return LakeView(
            archived={s: summarize(i) for s, i in intervals.items()},
            newest={s: newest_rows(r) for s, r in rows.items()},
        )


def newest_rows(
    rows: Iterable[LoggedInterval], limit: int = ROWS_PER_STREAM
) -> tuple[LoggedInterval, ...]:
    """The ``limit`` newest intervals, newest first (by interval end, then by when archived)."""
    ordered = sorted(rows, key=lambda r: (r.end_ms, r.archived_at_ms or 0), reverse=True)
    return tuple(ordered[:limit])


# --- reading the DAG runs (blocking, in a worker thread) --------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class RunInfo:
    run_id: str
    state: str | None
    run_type: str | None
    start_ms: int | None
    end_ms: int | None
    #: The ``streams`` task's output: which mapped ``archive`` task archived which stream.
    streams: tuple[str, ...] | None = None


def read_dag_runs(named: Iterable[str]) -> dict[str, RunInfo]:
    """The newest :data:`DAG_RUNS` runs of ``sluice_archive`` plus the runs ``named``.

    Blocking (the metadata database through Airflow's session): call it in a
    worker thread. Raises SQLAlchemy's ``SQLAlchemyError`` when the database
    cannot be read.
    """
    wanted = sorted(set(named))[: ROWS_PER_STREAM * 64]
    return {
        r.run_id: RunInfo(
            run_id=r.run_id,
            state=r.state,
            run_type=r.run_type,
            start_ms=_ms(r.data_interval_start),
            end_ms=_ms(r.data_interval_end),
            streams=_stream_list(r.xcom),
        )
        for r in internals.read_runs(DAG_ID, DAG_RUNS, wanted, xcom_task="streams")
    }


def _stream_list(value: Any) -> tuple[str, ...] | None:
    """The ``streams`` XCom as stored (JSON, possibly still a JSON string); None if it is not one."""
    if isinstance(value, str | bytes):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    return None


def _ms(moment: Any) -> int | None:
    return int(moment.timestamp() * 1000) if moment is not None else None


# --- links into Airflow's UI (pure) -----------------------------------------------


def run_path(run_id: str) -> str:
    """The DAG run's page in Airflow's UI, relative to the UI's root."""
    return f"/dags/{DAG_ID}/runs/{quote(run_id, safe='')}"


def log_path(run_id: str, stream: str, run: RunInfo | None) -> str:
    """The ``archive`` task of ``stream`` in that run (its log tab), relative to the UI's root.

    The archive task is mapped over the run's streams; the ``streams`` task's
    output says which map index archived ``stream``. Unknown (the run is not
    in the metadata database, or it never got that far): the list of the
    run's mapped archive tasks.
    """
    base = f"{run_path(run_id)}/tasks/archive/mapped"
    if run is not None and run.streams is not None and stream in run.streams:
        return f"{base}/{run.streams.index(stream)}"
    return base


# --- one slow source, kept fresh in a worker thread --------------------------------


def one_line(exc: BaseException) -> str:
    """An error for the page: its first line only (deltalake appends a Rust backtrace), bounded."""
    lines = str(exc).strip().splitlines()
    return (lines[0] if lines else type(exc).__name__)[:ERROR_CHARS]


class Source(Generic[T]):
    """A blocking read refreshed in a worker thread: stale-while-refresh, never two at once.

    ``value`` is the last good read (None before the first), ``error`` the
    last failure's text (None after a good read). A slow source is read less
    often: at most a tenth of the time goes to reading it.
    """

    def __init__(
        self,
        name: str,
        read: Callable[[], T],
        ttl_s: float,
        errors: tuple[type[BaseException], ...],
    ) -> None:
        self.name = name
        self._fn = read
        self._ttl_s = ttl_s
        self._errors = errors
        self.value: T | None = None
        self.error: str | None = None
        self.reads = 0
        self._at = -math.inf
        self._took_s = 0.0
        self._task: asyncio.Future[None] | None = None

    @property
    def age_s(self) -> float | None:
        return None if self.value is None else round(time.monotonic() - self._at, 1)

    async def fresh(self, first_wait_s: float) -> None:
        """Start a read when the last one is stale; wait for it only when there is nothing yet."""
        stale = time.monotonic() - self._at >= max(self._ttl_s, 10 * self._took_s)
        if stale and (self._task is None or self._task.done()):
            self._task = asyncio.ensure_future(self._read())
        if self._task is not None and self.value is None and self.error is None:
            await asyncio.wait({self._task}, timeout=first_wait_s)

    async def _read(self) -> None:
        started = time.monotonic()
        try:
            self.value = await asyncio.to_thread(self._fn)
            self.error = None
        except self._errors as exc:
            log.warning("sluice coverage: %s: %r", self.name, exc)
            self.error = f"{self.name}: {one_line(exc)}"
        except Exception as exc:
            # The reporting boundary: a bug in a read is logged with its traceback
            # and shown as one line, and the other sources are still served.
            log.exception("sluice coverage: %s failed", self.name)
            self.error = f"{self.name}: internal error {type(exc).__name__}"[:ERROR_CHARS]
        finally:
            self.reads += 1
            self._at = time.monotonic()
            self._took_s = self._at - started

    async def close(self) -> None:
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)


# --- the board --------------------------------------------------------------------


def _lake_errors() -> tuple[type[BaseException], ...]:
    from deltalake.exceptions import DeltaError

    from pipeline.errors import LakeError

    # LakeError: the store's own one-line reasons (down, no bucket, bad key)
    return (OSError, ValueError, DeltaError, LakeError)


def ui_base() -> str:
    """The path of Airflow's UI root (``[api] base_url``), without a trailing slash."""
    return urlparse(internals.ui_base_url()).path.rstrip("/")


class CoverageBoard:
    """Everything ``coverage.json`` reports, with the caches that keep it cheap.

    Built lazily on the API server's event loop (the Redis client belongs to
    that loop). ``settings`` is a loader so a bad ``SLUICE_*`` value is
    reported on the page instead of breaking the API server's start.
    """

    def __init__(self, load_settings: Callable[[], Any] | None = None) -> None:
        self._load_settings = load_settings or _load_settings
        self._settings: Any = None
        self._settings_error: str | None = None
        self._lake: Source[LakeView] | None = None
        self._runs = Source(
            "airflow metadata", self._read_runs, AIRFLOW_TTL_S, internals.db_errors()
        )
        self._redis: Any = None
        self._redis_source: str | None = None
        self._snapshot = SharedSnapshot(self._build, SNAPSHOT_TTL_S)
        #: Snapshots built (not served): what viewers cost.
        self.builds = 0

    @property
    def lake_reads(self) -> int:
        return self._lake.reads if self._lake is not None else 0

    def _read_runs(self) -> dict[str, RunInfo]:
        lake = self._lake.value if self._lake is not None else None
        named = {
            row.run_id
            for rows in (lake.newest.values() if lake else ())
            for row in rows
            if row.run_id
        }
        return read_dag_runs(named)

    async def body(self) -> bytes:
        """The JSON of the current snapshot, rebuilt at most once per :data:`SNAPSHOT_TTL_S`."""
        return await self._snapshot.get()

    def _ensure_settings(self) -> Any:
        if self._settings is None and self._settings_error is None:
            from pipeline.errors import ConfigError

            try:
                settings = self._load_settings()
                reader = ArchiveLogReader(settings.lake)
            except ConfigError as exc:
                self._settings_error = one_line(exc)
            else:
                self._settings = settings
                self._lake = Source("archive_log", reader.read, LAKE_TTL_S, _lake_errors())
        return self._settings

    async def _redis_client(self, settings: Any) -> Any:
        if self._redis is None:
            from pipeline.redisio.conn import Role, connect

            url, self._redis_source = await asyncio.to_thread(redis_url, settings)
            self._redis = connect(url, Role.SERVE, max_connections=2)
        return self._redis

    async def _redis_view(self, settings: Any, names: list[str]) -> dict[str, Any]:
        import redis.asyncio as aioredis

        from pipeline.errors import ConfigError
        from pipeline.redisio.conn import UNAVAILABLE, checkpoint

        redis_errors: tuple[type[BaseException], ...] = (
            TimeoutError,
            aioredis.RedisError,
            *UNAVAILABLE,
        )
        try:
            client = await self._redis_client(settings)
            async with asyncio.timeout(REDIS_TIMEOUT_S):
                pipe = client.pipeline(transaction=False)
                for name in names:
                    pipe.xinfo_stream(keys.stream(name))
                replies = await pipe.execute(raise_on_error=False)
            checkpoint()
        except ConfigError as exc:
            return {"up": False, "error": f"redis: {one_line(exc)}"}
        except redis_errors as exc:
            checkpoint(exc)
            # The next snapshot resolves the URL and connects again.
            await self._drop_redis()
            return {"up": False, "error": f"redis unavailable: {one_line(exc)}"}
        streams: dict[str, Any] = {}
        for name, info in zip(names, replies, strict=True):
            if isinstance(info, Exception):  # no such key: the stream is empty or absent
                streams[name] = {"length": 0, "first_id": None, "last_id": None}
                continue
            first, last = info.get("first-entry"), info.get("last-entry")
            streams[name] = {
                "length": int(info.get("length", 0)),
                "first_id": first[0].decode() if first else None,
                "last_id": last[0].decode() if last else None,
            }
        return {"up": True, "source": self._redis_source, "streams": streams}

    async def _drop_redis(self) -> None:
        client, self._redis = self._redis, None
        if client is not None:
            await client.aclose()

    async def close(self) -> None:
        await self._drop_redis()
        await self._runs.close()
        if self._lake is not None:
            await self._lake.close()

    async def _build(self) -> dict[str, Any]:
        from pipeline.redisio.conn import parse_entry_id

        self.builds += 1
        now_ms = int(time.time() * 1000)
        settings = self._ensure_settings()
        base = {
            "version": __version__,
            "now_ms": now_ms,
            "dag_id": DAG_ID,
            "ui_base": ui_base(),
            "dag_path": f"/dags/{DAG_ID}",
        }
        if settings is None:
            return {**base, "error": f"sluice settings: {self._settings_error}", "streams": []}
        lake_source = self._lake
        assert lake_source is not None
        await lake_source.fresh(FIRST_WAIT_S)
        await self._runs.fresh(FIRST_WAIT_S)
        lake = lake_source.value or LakeView()
        runs = self._runs.value or {}
        # configured names, and archived streams (a pattern's streams once archived)
        configured = (*settings.lake.streams, *settings.lake.chain_streams)
        names = list(dict.fromkeys((*(n for n in configured if not is_pattern(n)), *lake.archived)))
        redis_view = await self._redis_view(settings, names)
        streams = []
        for name in names:
            hot = redis_view.get("streams", {}).get(name)
            first_id = hot["first_id"] if hot else None
            last_id = hot["last_id"] if hot else None
            streams.append(
                {
                    "name": name,
                    "chain": is_chain(settings.lake, name),
                    "configured": is_configured(settings.lake, name),
                    "redis": hot,
                    "coverage": coverage(
                        lake.archived.get(name, Archived()),
                        first_ms=parse_entry_id(first_id)[0] if first_id else None,
                        last_ms=parse_entry_id(last_id)[0] if last_id else None,
                        now_ms=now_ms,
                        hot_retention_s=settings.lake.hot_retention_s,
                    ),
                    "archive_runs": [
                        _row_json(row, name, runs) for row in lake.newest.get(name, ())
                    ],
                }
            )
        newest_runs = sorted(runs.values(), key=lambda r: r.end_ms or 0, reverse=True)
        return {
            **base,
            "lake": {
                "uri": settings.lake.uri,
                "error": lake_source.error,
                "read_age_s": lake_source.age_s,
            },
            "redis": redis_view,
            "airflow": {"error": self._runs.error, "read_age_s": self._runs.age_s},
            "hot_retention_s": settings.lake.hot_retention_s,
            "archive_cron": settings.lake.archive_cron,
            "streams": streams,
            "dag_runs": [_run_json(r) for r in newest_runs[:DAG_RUNS]],
            # What viewers cost: snapshots built and source reads, since the server started.
            "stats": {
                "builds": self.builds,
                "lake_reads": self.lake_reads,
                "airflow_reads": self._runs.reads,
            },
        }


def _row_json(row: LoggedInterval, stream: str, runs: dict[str, RunInfo]) -> dict[str, Any]:
    run = runs.get(row.run_id) if row.run_id else None
    return {
        "run_id": row.run_id,
        "start_ms": row.start_ms,
        "end_ms": row.end_ms,
        "entries": row.entries,
        "blocks": row.blocks,
        "archived_at_ms": row.archived_at_ms,
        "state": run.state if run else None,
        "run_path": run_path(row.run_id) if row.run_id else None,
        "log_path": log_path(row.run_id, stream, run) if row.run_id else None,
    }


def _run_json(run: RunInfo) -> dict[str, Any]:
    return {
        "run_id": run.run_id,
        "state": run.state,
        "run_type": run.run_type,
        "start_ms": run.start_ms,
        "end_ms": run.end_ms,
        "streams": list(run.streams) if run.streams is not None else None,
        "run_path": run_path(run.run_id),
    }


def _load_settings() -> Any:
    from pipeline.settings import Settings

    return Settings.load()


def redis_url(settings: Any) -> tuple[str, str]:
    """The Redis URL and where it came from: the ``sluice_redis`` connection, else settings.

    Blocking (the hook may ask the metadata database or a secrets backend).
    """
    from sluice_redis_hook import SluiceRedisHook

    from pipeline.errors import ConfigError

    hook = SluiceRedisHook(settings=settings)
    try:
        url = hook.get_url()
    except ConfigError:
        raise  # a connection that names a bad URL: shown on the page, not replaced
    except Exception as exc:  # noqa: BLE001 - secrets backends raise their own types
        # The connection could not be looked up (secrets backend, metadata DB):
        # fall back to the settings, and say so on the page and in the log.
        log.warning("sluice coverage: connection %s: %r", hook.redis_conn_id, exc)
        return settings.redis.url, f"settings (connection lookup failed: {type(exc).__name__})"
    source = "settings" if url == settings.redis.url else f"connection {hook.redis_conn_id}"
    return url, source


# --- the FastAPI app ---------------------------------------------------------------

# FastAPI is imported when the API server asks for the app (:func:`create_app`), not when the
# module is: Airflow runs every plugin module in every task process too (for its macros),
# and FastAPI cost each of them ~0.1-0.2 CPU-s (a 100-stream run has 100 mapped tasks).


@cache
def _bearer() -> HTTPBearer:
    from fastapi.security import HTTPBearer

    return HTTPBearer(auto_error=False)


async def authorized(request: Request) -> None:
    """What ``GET /api/v2/dags/sluice_archive/dagRuns`` requires, checked by Airflow's own code.

    The caller is the one Airflow's core API would see (a bearer JWT, else the
    UI's ``_token`` cookie), and the auth manager must let it read the DAG's
    runs; otherwise 401/403 as the core API answers (see
    :func:`sluice_airflow_internals.authorize_dag_runs`).
    """
    await internals.authorize_dag_runs(request, await _bearer()(request), DAG_ID)


def create_app(board: CoverageBoard | None = None) -> FastAPI:
    """The app mounted at :data:`URL_PREFIX`; every route needs read access to the DAG's runs."""
    from fastapi import Depends, FastAPI, Request
    from fastapi.responses import HTMLResponse, JSONResponse, Response

    # The routes' annotations are strings (PEP 563), which FastAPI resolves in this
    # module's globals: the names imported here (not at import, see above) go there too.
    globals().update(
        Request=Request, Response=Response, HTMLResponse=HTMLResponse, JSONResponse=JSONResponse
    )
    state: dict[str, CoverageBoard] = {"board": board} if board is not None else {}

    def get_board() -> CoverageBoard:
        # Built on first use, on the API server's event loop (the Redis client belongs to it).
        if "board" not in state:
            state["board"] = CoverageBoard()
        return state["board"]

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Airflow's API server enters the lifespan of every mounted FastAPI app.
        try:
            yield
        finally:
            if "board" in state:
                await state.pop("board").close()

    app = FastAPI(
        title="Sluice coverage",
        lifespan=lifespan,
        dependencies=[Depends(authorized)],
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )

    @app.get("/coverage.json")
    async def coverage_json() -> Response:
        return Response(
            content=await get_board().body(),
            media_type="application/json",
            headers={"Cache-Control": "no-store"},
        )

    @app.get("/", response_class=HTMLResponse)
    async def page() -> HTMLResponse:
        return HTMLResponse(_PAGE.read_text(), headers={"Cache-Control": "no-cache"})

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> JSONResponse:
        log.error("sluice coverage: %s %s failed: %r", request.method, request.url.path, exc)
        return JSONResponse(
            {"error": "internal error in the Sluice coverage view (see the API server log)"},
            status_code=500,
        )

    return app


@cache
def app() -> FastAPI:
    """The process's one app (built when the API server first asks for it)."""
    return create_app()


class SluiceCoveragePlugin(AirflowPlugin):
    """Registers the coverage app on the API server and its page in the UI's navigation."""

    name = "sluice_coverage"

    @property
    def fastapi_apps(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """Read by the API server (and plugin listings) only: see :func:`create_app`."""
        return [{"app": app(), "url_prefix": URL_PREFIX, "name": "Sluice coverage"}]

    external_views = [
        {
            "name": "Sluice coverage",
            # Relative: resolved against the UI's base URL, so a base path works.
            "href": URL_PREFIX.lstrip("/") + "/",
            "url_route": "sluice_coverage",
            "destination": "nav",
            "category": "browse",
        }
    ]
