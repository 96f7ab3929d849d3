"""The status page of ``sluice serve``: ``GET /`` (plain HTML/JS) and ``GET /status.json``.

:func:`setup` adds the page's routes to the server app and runs its
:class:`~pipeline.chain.serve.statusboard.StatusBoard` (what the page reports,
and how it is kept cheap) with its Redis tail while the app runs. The chain
view of one stream is :mod:`pipeline.chain.serve.streamboard`; the lake's
coverage arithmetic is :mod:`pipeline.chain.serve.coverage`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from importlib import resources
from typing import TypeVar

from aiohttp import web

from pipeline.chain.serve.appkeys import METRICS
from pipeline.chain.serve.auth import authorized, refusal
from pipeline.chain.serve.coverage import MAX_RUNS, Archived, Interval, coverage, summarize
from pipeline.chain.serve.statusboard import (
    TAIL_INTERVAL_S,
    ArchiveLog,
    ConnectionView,
    StatusBoard,
)
from pipeline.chain.serve.streamboard import StreamBoard, peek_header
from pipeline.redisio.conn import Role, connect
from pipeline.settings import Settings

log = logging.getLogger(__name__)

_FILES = {
    "/": ("index.html", "text/html"),
    "/static/status.js": ("status.js", "application/javascript"),
    "/static/status.css": ("status.css", "text/css"),
}

_C = TypeVar("_C", bound=ConnectionView)

BOARD = web.AppKey("status_board", StatusBoard)
_STATIC: web.AppKey[dict[str, tuple[bytes, str]]] = web.AppKey("status_static")
_TOKEN = web.AppKey("status_token", str)


async def status_json(request: web.Request) -> web.Response:
    """The snapshot; with a serve token set, only for requests that carry it (:mod:`.auth`)."""
    if not authorized(request, request.app[_TOKEN]):
        metrics = request.app.get(METRICS)
        if metrics is not None:
            metrics.inc("sluice_serve_auth_failures_total")
        return refusal()
    body = await request.app[BOARD].body()
    return web.Response(
        body=body, content_type="application/json", headers={"Cache-Control": "no-store"}
    )


async def static_file(request: web.Request) -> web.Response:
    data, content_type = request.app[_STATIC][request.path]
    return web.Response(body=data, content_type=content_type, headers={"Cache-Control": "no-cache"})


def _load_static() -> dict[str, tuple[bytes, str]]:
    folder = resources.files("pipeline.chain.serve") / "static"
    return {path: ((folder / name).read_bytes(), kind) for path, (name, kind) in _FILES.items()}


def setup(app: web.Application, settings: Settings, connections: set[_C]) -> None:
    """Add ``GET /``, ``/static/status.{js,css}`` and ``GET /status.json`` to the server app.

    With ``serve_token`` set, ``/status.json`` needs it and the page's shell
    stays open (it passes its own ``?token=`` on): see :mod:`pipeline.chain.serve.auth`.

    ``connections`` is the server's live set of websocket connections (read,
    never changed). The board's Redis client (two connections: the tail's
    reads and the snapshots) and its tail task live in a cleanup
    context of ``app``.
    """
    board = StatusBoard(settings, connections)
    metrics = app.get(METRICS)
    if metrics is not None:  # the board's Redis errors are serve's too
        board.on_redis_error = metrics.redis_error
    app[BOARD] = board
    app[_TOKEN] = settings.serve.token
    app[_STATIC] = _load_static()

    async def tail_ctx(app: web.Application) -> AsyncIterator[None]:
        client = connect(settings.redis.url, Role.TAIL, max_connections=2)
        board.client = client
        task = asyncio.create_task(board.tail(client), name="status-tail")
        try:
            yield
        finally:
            task.cancel()
            (outcome,) = await asyncio.gather(task, return_exceptions=True)
            if not isinstance(outcome, asyncio.CancelledError | None):
                log.error("status tail failed: %r", outcome)
            await board.close()
            board.client = None
            await client.aclose()

    app.cleanup_ctx.append(tail_ctx)
    for path in _FILES:
        app.router.add_get(path, static_file)
    app.router.add_get("/status.json", status_json)


__all__ = [
    "MAX_RUNS",
    "Archived",
    "ArchiveLog",
    "BOARD",
    "Interval",
    "StatusBoard",
    "StreamBoard",
    "TAIL_INTERVAL_S",
    "coverage",
    "peek_header",
    "setup",
    "summarize",
]
