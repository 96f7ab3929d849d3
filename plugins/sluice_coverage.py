"""The Sluice coverage view inside Airflow: per stream, what the lake holds and what Redis holds.

Theory of operation: an :class:`AirflowPlugin` that mounts a small FastAPI app
on Airflow's API server under :data:`URL_PREFIX` (``/sluice``) and adds an
external view to Airflow's navigation (Browse -> Sluice coverage) that shows
its page in the UI.

- ``GET /sluice/coverage.json``: per stream the lake's archived intervals
  merged into runs, the gaps between them, the trim point and how far the
  next safe trim could go, the Redis hot window (``XINFO STREAM``), and the
  newest ``archive_log`` rows with links to their ``sluice_archive`` DAG run
  and the archive task's log in Airflow's UI; plus the DAG's newest runs.
- ``GET /sluice/``: a plain HTML page (no build step) that polls the JSON.

A thin view: what the JSON says, its caches and its bounds are
:class:`pipeline.board.board.CoverageBoard`'s (no Airflow there, tested
without it). This module gives the board its Airflow side
(:class:`pipeline.board.board.Host`: the DAG runs from Airflow's metadata
database, the UI's base path, the Redis URL of the ``sluice_redis``
connection), mounts it, and guards it. Nothing answers with a traceback.

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

import logging
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import sluice_airflow_internals as internals
from airflow.plugins_manager import AirflowPlugin

from pipeline.board import board
from pipeline.board.archivelog import (
    ROWS_PER_STREAM,
    ArchiveLogReader,
    LoggedInterval,
    newest_rows,
)
from pipeline.board.runs import (
    DAG_ID,
    DAG_RUNS,
    RunInfo,
    epoch_ms,
    log_path,
    run_path,
)
from pipeline.board.runs import shard_lists as _shard_lists
from pipeline.settings import Settings

if TYPE_CHECKING:
    from fastapi import FastAPI, Request
    from fastapi.responses import HTMLResponse, JSONResponse, Response
    from fastapi.security import HTTPBearer

log = logging.getLogger(__name__)

#: Where the FastAPI app is mounted on the API server.
URL_PREFIX = "/sluice"

_PAGE = Path(__file__).with_name("sluice_coverage.html")

# The names the tests and the archive DAG's test read from this module.
__all__ = [
    "DAG_ID",
    "URL_PREFIX",
    "ArchiveLogReader",
    "CoverageBoard",
    "LoggedInterval",
    "RunInfo",
    "SluiceCoveragePlugin",
    "create_app",
    "log_path",
    "newest_rows",
    "run_path",
]


# --- the board's Airflow side -------------------------------------------------------


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
            start_ms=epoch_ms(r.data_interval_start),
            end_ms=epoch_ms(r.data_interval_end),
            shards=_shard_lists(r.xcom),
        )
        for r in internals.read_runs(DAG_ID, DAG_RUNS, wanted, xcom_task="shards")
    }


def ui_base() -> str:
    """The path of Airflow's UI root (``[api] base_url``), without a trailing slash."""
    return urlparse(internals.ui_base_url()).path.rstrip("/")


def redis_url(settings: Settings) -> tuple[str, str]:
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


class CoverageBoard(board.CoverageBoard):
    """The coverage board with Airflow as its host; ``load_settings`` as the board takes it."""

    def __init__(self, load_settings: Callable[[], Settings] | None = None) -> None:
        host = board.Host(
            read_runs=read_dag_runs,
            run_errors=internals.db_errors(),
            ui_base=ui_base,
            redis_url=redis_url,
        )
        super().__init__(host, load_settings)


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
