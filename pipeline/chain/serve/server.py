"""The aiohttp app of ``sluice serve``: JSON-RPC 2.0 over websocket at ``/ws``.

Methods: ``cardinal_subscribe`` (params ``["streams", "0xNUM", "0xHASH",
[patterns], {options}?]``, result a subscription id, then the seed's
``batch``/``subbatch`` notifications), ``cardinal_unsubscribe`` (``[id]``)
and ``cardinal_getBlock`` (``["0xNUM"]``: the canonical block's results, or
null). Also ``/healthz`` and Prometheus ``/metrics``.

Two wire dialects share every method, the resumption and the refusals (the
same JSON-RPC error codes and close codes); they differ only in how results
are written (:mod:`pipeline.chain.cardinal`):

- ``seed`` (``/ws``): seed 004's flat ``batch``/``subbatch`` results, byte for
  byte as before weights existed; a subscriber that passes
  ``{"weight": true}`` in the options object also gets ``"weight"``.
- ``cardinal`` (``/cardinal``, or ``/ws?dialect=cardinal``): the shape the
  real github.com/openrelayxyz/cardinal-streams library reads (v1.5.1,
  ``transports.ResolveConsumer`` with a ``ws://host:port/cardinal`` URL):
  nested ``batch`` (with ``weight``) and ``subbatch`` objects, ``ready``
  always, ``reorg`` naming the common ancestor before replacing blocks. The
  library's 3-parameter ``["streams", "0xNUM", "0xHASH"]`` subscribe works
  (patterns and options may follow, as in the seed dialect), and
  ``cardinal_streamsBlock`` (``["0xNUM"]``) answers as the library's server
  does. The library's client cannot send options, hence the URL.

Each connection (:mod:`pipeline.chain.serve.wsconn`) has one bounded
:class:`~pipeline.chain.outbox.Outbox` and one writer task; live frames are
encoded once per block and shared (:mod:`pipeline.chain.serve.frames`), and sent
by the hub's publisher itself while a connection keeps up (one write of the
websocket frames built once for all, or :class:`~pipeline.chain.outbox.FanoutBatch`
when something is queued); a subscriber that lets its
outbox fill up during live fan-out is closed with code 1008 and the reason.
Errors are answered with the standard
JSON-RPC codes; a connection never takes others down.

Live data comes from the :class:`~pipeline.chain.produce.producer.WebsocketHub`, fed
either by a :class:`~pipeline.chain.serve.relay.RedisTailer` (relay mode: several
servers side by side) or in process by a
:class:`~pipeline.chain.produce.producer.MuxProducer` (``relay=False``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

import redis.asyncio as aioredis
from aiohttp import WSCloseCode, web
from redis.exceptions import RedisError

from pipeline.chain.cardinal import DIALECTS
from pipeline.chain.history.entries import Refusals
from pipeline.chain.history.lakeview import SharedHistory
from pipeline.chain.history.resumption import TieredResumption
from pipeline.chain.history.shared import SharedResults
from pipeline.chain.metrics import CONTENT_TYPE, Metrics
from pipeline.chain.planning import History
from pipeline.chain.produce.producer import WebsocketHub
from pipeline.chain.serve.admission import ConnectionGuard
from pipeline.chain.serve.appkeys import (
    CALLS,
    CONNECTIONS,
    GUARD,
    HISTORY,
    HUB,
    METRICS,
    REDIS,
    REFUSED,
    RESUMPTION,
    SETTINGS,
    TAILER,
)
from pipeline.chain.serve.auth import authorized, refusal
from pipeline.chain.serve.head import HEAD, HeadFinder
from pipeline.chain.serve.relay import RedisTailer
from pipeline.chain.serve.wsconn import CLOSE_TIMEOUT_S, MAX_FRAME, Connection, dialect_of
from pipeline.lifecycle import cancel_and_wait, run_every
from pipeline.loggate import LogGate
from pipeline.redisio.conn import Role, connect
from pipeline.runtime import health, memory
from pipeline.settings import Settings

if TYPE_CHECKING:  # annotations only: the feed's module is imported when a port is set
    from pipeline.chain.serve.dialogue_feed import Feed
    from pipeline.dialogue.server import DialogueServer

#: The Dialogue feed's budgets and figures (absent without a feed port).
FEED: web.AppKey[Feed] = web.AppKey("dialogue_feed")

log = logging.getLogger(__name__)
#: Upgrades whose peer left before the answer: one line per 10 s, every one counted.
_LOST = LogGate(log, level=logging.INFO)

#: XREAD BLOCK of the live tailer, in ms (its pool's socket timeout is longer).
_TAIL_BLOCK_MS = 1000


def _tailer_ended(app: web.Application, tailer: RedisTailer, task: asyncio.Task[None]) -> None:
    """The live tailer ended before shutdown: say so in the log and on ``/healthz`` (503)."""
    if task.cancelled():
        return
    log.error("live tailer ended: %r; no live data until restart", task.exception())
    tailer.up = False
    app[METRICS].set("sluice_serve_redis_up", 0.0)


async def _warm(app: web.Application) -> None:
    """Index the tail and open the lake at start; what is not there yet, the first call does.

    Opening the lake (importing pyarrow and deltalake, loading the Delta log)
    cost the first subscriber after a start 0.7-2.6 s.
    """
    history = app.get(HISTORY)
    try:
        await app[RESUMPTION].warm()
    except (aioredis.RedisError, OSError) as exc:
        log.warning("tail index not built at start: %r", exc)
        app[METRICS].redis_error(exc)
    if history is not None:
        error = await asyncio.to_thread(history.probe)
        if error is not None:
            log.warning("lake not opened at start: %s", error)


async def ws_handler(request: web.Request) -> web.StreamResponse:
    app = request.app
    settings, metrics = app[SETTINGS], app[METRICS]
    if not authorized(request, settings.serve.token):
        metrics.inc("sluice_serve_auth_failures_total")
        return refusal()
    if dialect_of(request) is None:
        return web.json_response(
            {"error": f"unknown dialect; known: {', '.join(DIALECTS)}"}, status=400
        )
    # The connection runs its own heartbeat (pipeline/chain/serve/wswrite.py): it tells a
    # subscriber that does not read (1008, counted) from a peer that is gone.
    ws = web.WebSocketResponse(
        autoping=False, max_msg_size=MAX_FRAME, compress=False, timeout=CLOSE_TIMEOUT_S
    )
    try:
        await ws.prepare(request)
    except ConnectionError as exc:  # "Cannot write to closing transport": the peer left
        metrics.inc("sluice_serve_upgrades_lost_total")
        _LOST.failed("upgrade", "websocket upgrade lost, the peer gone before the answer: %s", exc)
        return web.Response(status=503, text="connection lost during the upgrade")
    conn = Connection(ws, request)
    metrics.inc("sluice_serve_connections_total")
    app[CONNECTIONS].add(conn)
    try:
        await conn.run()
    finally:
        app[CONNECTIONS].discard(conn)
    return ws


async def _write_probe(app: web.Application) -> str | None:
    """None when Redis takes a write (:func:`pipeline.runtime.health.redis_writable`), else why not."""
    client = app.get(REDIS)
    if client is None:
        return None
    check = health.redis_writable(client, f"serve:{app[SETTINGS].serve.port}")
    try:
        async with asyncio.timeout(health.CHECK_TIMEOUT_S):
            await check()
    except TimeoutError as exc:  # a stalled Redis: counted as a timeout
        app[METRICS].redis_error(exc)
        return f"timed out after {health.CHECK_TIMEOUT_S}s"
    except (RedisError, OSError) as exc:
        app[METRICS].redis_error(exc)
        return f"{type(exc).__name__}: {exc}"[:200]
    return None


async def healthz(request: web.Request) -> web.Response:
    app = request.app
    tailer = app.get(TAILER)
    redis_up = tailer.up if tailer is not None else None
    history = app.get(HISTORY)
    # The lake answers history requests: a store that cannot be read is "down" here,
    # not an "ok" server that answers every resumption with "lake error".
    lake_error = await asyncio.to_thread(history.probe) if history is not None else None
    # Serve only reads, but a Redis that refuses writes stops the chain's producer:
    # say so here rather than serve a head that no longer moves.
    write_error = await _write_probe(app) if redis_up is not None else None
    healthy = redis_up is not False and lake_error is None and write_error is None
    hub = app[HUB]
    body = {
        "status": "ok" if healthy else "degraded",
        "redis": {True: "up", False: "down", None: "in-process"}[redis_up],
        "redis_write": "n/a" if redis_up is None else (write_error or "ok"),
        "lake": "n/a" if history is None else ("up" if lake_error is None else "down"),
        "connections": len(app[CONNECTIONS]),
        "live_subscriptions": len(hub),
        "head": await app[HEAD].head(),  # live, else Redis, else the lake
    }
    if lake_error is not None:
        body["lake_error"] = lake_error
    refused = app.get(REFUSED)
    if refused is not None and refused.heights.last_refusal is not None:
        # Serving goes on (the chain the bad block would extend is served): degraded, not down.
        body["status"] = "degraded"
        body["chain_error"] = refused.heights.last_refusal
        body["blocks_set_aside"] = refused.heights.refused
    return web.json_response(body, status=200 if healthy else 503)


async def metrics_handler(request: web.Request) -> web.Response:
    metrics = request.app[METRICS]
    if not authorized(
        request, request.app[SETTINGS].serve.token
    ):  # see pipeline/chain/serve/auth.py
        metrics.inc("sluice_serve_auth_failures_total")
        return refusal()
    metrics.set("sluice_serve_connections_open", len(request.app[CONNECTIONS]))
    metrics.set("sluice_serve_resident_bytes", memory.rss_bytes())
    resumption = request.app.get(RESUMPTION)
    if resumption is not None:
        metrics.set("sluice_serve_reorg_resyncs_total", resumption.resyncs)
    feed = request.app.get(FEED)
    if feed is not None:
        for name, value in feed.figures().items():
            metrics.set(name, value)
    return web.Response(body=metrics.render().encode(), headers={"Content-Type": CONTENT_TYPE})


def _releaser(
    metrics: Metrics,
    history: SharedHistory | None,
    idle_s: float,
    idle: Callable[[], bool],
    every_s: float,
) -> memory.Releaser:
    """Gives native memory back after catch-ups (see pipeline.runtime.memory), counted in /metrics,
    looking every ``every_s`` seconds; first drops the history cache's files unused for
    ``idle_s`` seconds. Cycles are
    collected first only while ``idle()`` says no client (websocket or Dialogue) is
    connected: a full collection pauses them all."""

    def released(before: int, after: int) -> None:
        metrics.inc("sluice_serve_memory_releases_total")
        metrics.inc("sluice_serve_memory_released_bytes_total", max(0, before - after))

    def prune() -> int:
        assert history is not None
        dropped = history.drop_idle(idle_s)
        metrics.inc("sluice_serve_history_cache_dropped_total", dropped)
        return dropped

    return memory.Releaser(
        every_s=every_s,
        on_release=released,
        prune=None if history is None else prune,
        idle=idle,
    )


def _resumption(
    app: web.Application,
    settings: Settings,
    client: aioredis.Redis,
    factory: Callable[[], History | None],
    refused: Refusals,
) -> TieredResumption:
    """The server's one resumption, reading Redis through the requests' pool."""
    return TieredResumption(
        redis=client,
        stream=settings.serve.stream,
        hub=app[HUB],
        history_factory=factory,
        reorg_threshold=settings.lake.reorg_threshold,
        # Lake pages of 8,192 rows (the default): a page is a slice of a file the reader holds
        # whole, so it costs no memory, and each is one hop to the reading thread; 512-row
        # pages took 16 times as many (catchup_cpu_us_per_block of make bench B=resume, five
        # interleaved runs each: median 7.9 against 9.3 us). The first page stays short.
        max_tail=settings.serve.tail_index_max,
        refused=refused,
        shared=SharedResults(metrics=app[METRICS]),
    )


async def _start_feed(app: web.Application, settings: Settings) -> DialogueServer | None:
    """The Dialogue feed, listening, when ``serve_dialogue_port`` is set; else None."""
    if not settings.serve.dialogue_port:
        return None
    from pipeline.chain.serve.dialogue_feed import Feed, dialogue_server

    state = app[FEED] = Feed(settings.serve.send_buffer, on_redis_error=app[METRICS].redis_error)
    feed = dialogue_server(
        app[RESUMPTION],
        settings.serve.host,
        settings.serve.dialogue_port,
        send_buffer=settings.serve.send_buffer,
        stall_s=settings.serve.stall_s,
        feed=state,
    )
    await feed.start()
    return feed


def _start_releaser(
    app: web.Application, settings: Settings, feed: DialogueServer | None
) -> asyncio.Task[None]:
    """The memory releaser's task; it collects cycles only while no client is connected."""
    releaser = _releaser(
        app[METRICS],
        app.get(HISTORY),
        settings.serve.cache_idle_s,
        lambda: not app[CONNECTIONS] and (feed is None or not feed.connections),
        settings.serve.release_every_s,
    )
    return asyncio.create_task(releaser.run(), name="memory-releaser")


def _start_tailer(
    app: web.Application, settings: Settings, tail_client: aioredis.Redis, refused: Refusals
) -> asyncio.Task[None]:
    """The live tailer's task (relay mode); if it ends before shutdown, /healthz says so."""
    tailer = RedisTailer(
        tail_client,
        settings.serve.stream,
        app[HUB],
        app[METRICS],
        refused=refused,
    )
    app[TAILER] = tailer
    task = asyncio.create_task(tailer.run(), name="redis-tailer")
    task.add_done_callback(lambda t: _tailer_ended(app, tailer, t))
    return task


async def _stop_tailer(task: asyncio.Task[None] | None) -> None:
    """End the live tailer; its own failure is logged here, not raised (as it always was)."""
    try:
        await cancel_and_wait(task)
    except Exception:  # the tailer's own failure, reported at shutdown
        log.exception("live tailer failed")


async def _redis_ctx(
    app: web.Application,
    *,
    settings: Settings,
    relay: bool,
    factory: Callable[[], History | None],
) -> AsyncIterator[None]:
    """The server's Redis clients, resumption, Dialogue feed and background tasks, while it runs.

    At cleanup every step runs even when an earlier one fails (a warm-up or
    releaser task that had failed re-raises its error): the tailer is ended,
    the feed closed and both clients closed; the failures are raised together
    after the last step (:func:`pipeline.lifecycle.run_every`).
    """
    # Two pools: requests (any number of connections, bounded, waiting for a
    # free connection under a burst) and the live tailer's own, so that
    # connection churn can never starve live data or make /healthz lie.
    client = connect(settings.redis.url, Role.SERVE)
    tail_client = connect(settings.redis.url, Role.TAIL, block_s=_TAIL_BLOCK_MS / 1000)
    app[REDIS] = client
    refused = Refusals(app[METRICS])  # one count and one log line per entry, whoever reads it
    app[REFUSED] = refused
    app[RESUMPTION] = _resumption(app, settings, client, factory, refused)
    app[HEAD] = HeadFinder(
        stream=settings.serve.stream, hub=app[HUB], redis=client, history=factory
    )
    feed = await _start_feed(app, settings)
    warm = asyncio.create_task(_warm(app), name="warm")
    releaser = _start_releaser(app, settings, feed)
    tailer = _start_tailer(app, settings, tail_client, refused) if relay else None
    try:
        yield
    finally:
        await run_every(
            [
                lambda: cancel_and_wait(warm),
                lambda: cancel_and_wait(releaser),
                lambda: _stop_tailer(tailer),
                *([] if feed is None else [feed.close]),
                client.aclose,
                tail_client.aclose,
            ]
        )


async def _on_shutdown(app: web.Application) -> None:
    conns: set[Connection] = app[CONNECTIONS]
    await asyncio.gather(
        *(c.close(WSCloseCode.GOING_AWAY, "server shutting down") for c in list(conns))
    )


def _new_app(settings: Settings, hub: WebsocketHub | None) -> web.Application:
    """The app with its state (settings, hub, metrics, connection guard), no route yet."""
    app = web.Application()
    app[SETTINGS] = settings
    app[HUB] = hub if hub is not None else WebsocketHub()
    app[METRICS] = Metrics()
    app[GUARD] = ConnectionGuard(
        max_connections=settings.serve.max_connections,
        header_timeout_s=settings.serve.header_timeout_s,
        metrics=app[METRICS],
    )
    app.middlewares.append(app[GUARD].middleware)
    app[CONNECTIONS] = set()
    app[CALLS] = set()
    return app


def _add_routes(app: web.Application, settings: Settings) -> None:
    app.router.add_get("/ws", ws_handler)
    app.router.add_get("/cardinal", ws_handler)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics_handler)
    from pipeline.chain.serve import status  # the status page: GET / and /status.json

    status.setup(app, settings, app[CONNECTIONS])


def create_app(
    settings: Settings,
    *,
    relay: bool = True,
    hub: WebsocketHub | None = None,
    history_factory: Callable[[], History | None] | None = None,
) -> web.Application:
    """The server app. ``relay``: tail Redis for live data; else publish to ``app[HUB]`` yourself."""
    app = _new_app(settings, hub)
    if history_factory is None:
        lake = settings.lake
        cache_bytes = settings.serve.history_cache_mb << 20

        def open_reader() -> History:
            from pipeline.lake.storage.reader import LakeReader

            return LakeReader(lake, cache_bytes=cache_bytes)

        # One reader (and its file cache) for every subscription of this server.
        history_factory = app[HISTORY] = SharedHistory(open_reader)

    app.cleanup_ctx.append(
        functools.partial(_redis_ctx, settings=settings, relay=relay, factory=history_factory)
    )
    app.on_shutdown.append(_on_shutdown)
    _add_routes(app, settings)
    return app
