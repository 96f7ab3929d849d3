"""The status page of ``sluice serve``: ``GET /`` (plain HTML/JS) and ``GET /status.json``.

Theory of operation: one :class:`StatusBoard` per server gathers three views
of every chain stream (the served stream and ``chain_streams``):

- the chain as Redis holds it: a background tail (one ``XREAD`` over all the
  streams, at most one every :data:`TAIL_INTERVAL_S` while entries come)
  peeks at the ``num``/``hash``/``parent`` of each new entry, keeps the head,
  the last :data:`RECENT_BLOCKS` blocks and the last
  :data:`RECENT_REORGS` reorgs (bounded deques), and counts reorgs since the
  server started (the blocks seeded at start count too);
- the lake's coverage: ``archive_log`` read with delta-rs (never a JVM), at
  most once per :data:`LAKE_TTL_S`, in a worker thread, stale-while-refresh so
  a slow lake never holds a page up; its intervals are merged there, exactly as
  the safe trim merges them (:func:`pipeline.intervals.merge_intervals`), so a
  snapshot only looks the oldest Redis entry up in the merged runs;
- the Redis hot window (``XINFO STREAM``: length, first and last entry ids),
  the trim point (the oldest entry still in Redis) and how far the next safe
  trim could go.

``/status.json`` is built at most once per :data:`SNAPSHOT_TTL_S` and shared
by every viewer, so any number of pages polling every second cost one Redis
round trip per stream per second and one ``archive_log`` read per
:data:`LAKE_TTL_S`. Nothing is kept per viewer. The page polls; it holds no
connection open.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Collection, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, Protocol, TypeVar, cast

import msgpack
import redis.asyncio as aioredis
from aiohttp import web
from redis.crc import key_slot

from pipeline import __version__, keys
from pipeline.blockcodec import ENTRY_FIELD
from pipeline.chain.serve.appkeys import METRICS
from pipeline.chain.serve.auth import authorized, refusal
from pipeline.chain.serve.coverage import MAX_RUNS, Archived, Interval, coverage, summarize
from pipeline.redisio.conn import (
    UNAVAILABLE,
    Role,
    checkpoint,
    connect,
    is_cluster,
    parse_entry_id,
)
from pipeline.runtime.snapshot import SharedSnapshot
from pipeline.settings import LakeSettings, Settings

log = logging.getLogger(__name__)

#: Blocks and reorgs kept per stream for the page.
RECENT_BLOCKS = 12
RECENT_REORGS = 8
#: Every viewer within this window gets the same snapshot.
SNAPSHOT_TTL_S = 1.0
#: ``archive_log`` is read at most this often (and at most 10% of the time when reads are slow).
LAKE_TTL_S = 5.0
#: How long the first snapshot waits for the first ``archive_log`` read.
LAKE_FIRST_WAIT_S = 3.0
#: Redis part of a snapshot: give up after this long and report Redis down.
REDIS_TIMEOUT_S = 2.0
#: Entries read per ``XREAD`` of the tail; block this long per call.
TAIL_COUNT = 512
TAIL_BLOCK_MS = 1000
#: After a read that found entries (fewer than ``TAIL_COUNT``), the tail waits this long
#: before the next, which takes all that came meanwhile: one round trip per block cost
#: 5-6% of the server's CPU at 100 blocks/s (``make bench B=resume``). Well inside what
#: the page shows at once (:data:`SNAPSHOT_TTL_S`).
TAIL_INTERVAL_S = 0.25
#: On a cluster (no multi-slot XREAD BLOCK): the pause between reads that found nothing.
CLUSTER_POLL_S = 0.25

_FILES = {
    "/": ("index.html", "text/html"),
    "/static/status.js": ("status.js", "application/javascript"),
    "/static/status.css": ("status.css", "text/css"),
}


#: What a lost, slow or refusing Redis raises (ResponseError included: reported, retried).
_REDIS_ERRORS: tuple[type[BaseException], ...] = (TimeoutError, aioredis.RedisError, *UNAVAILABLE)

_Entries = list[tuple[bytes, dict[bytes, bytes]]]


class _Conn(Protocol):
    """What the board reads of a server connection: its open subscriptions."""

    @property
    def subs(self) -> Mapping[str, Any]: ...


_C = TypeVar("_C", bound=_Conn)


# --- the chain as the tail sees it (pure) ----------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class SeenBlock:
    """One block as the tail saw it; raw bytes, turned into text only for the page."""

    num: int
    hash: bytes
    parent: bytes
    #: The Redis entry id: its milliseconds are when Redis stored the block.
    entry_id: bytes
    #: Blocks this one replaced (0: it extended the chain).
    reorg: int = 0

    @property
    def ms(self) -> int:
        return parse_entry_id(self.entry_id)[0]


@dataclass(frozen=True, slots=True, kw_only=True)
class Reorg:
    ms: int
    #: The head before and the first block of the new branch.
    old_head: int
    new_num: int
    depth: int


def peek_header(data: bytes) -> tuple[int, bytes, bytes]:
    """``num``, ``hash``, ``parent`` of an ``encode_block`` entry without decoding the rest.

    Raises ``ValueError`` when the data is not such a map.
    """
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=True)
    unpacker.feed(data)
    found: dict[str, Any] = {}
    try:
        for _ in range(unpacker.read_map_header()):
            key = unpacker.unpack()
            if key in ("num", "hash", "parent"):
                found[key] = unpacker.unpack()
                if len(found) == 3:
                    break
            else:
                unpacker.skip()
    except (ValueError, msgpack.UnpackException) as exc:
        raise ValueError(f"not a block entry: {exc}") from exc
    num, hash_, parent = found.get("num"), found.get("hash"), found.get("parent")
    if not isinstance(num, int) or not isinstance(hash_, bytes) or not isinstance(parent, bytes):
        raise ValueError("block entry without num, hash and parent")
    return num, hash_, parent


class StreamBoard:
    """Head, recent blocks and reorgs of one chain stream, from the entries it is shown (bounded)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.key = keys.stream(name)
        self.last_id: bytes | None = None
        self.head: SeenBlock | None = None
        self.recent: deque[SeenBlock] = deque(maxlen=RECENT_BLOCKS)
        self.reorgs: deque[Reorg] = deque(maxlen=RECENT_REORGS)
        self.reorg_count = 0
        self.blocks_seen = 0
        self.invalid = 0

    def see(self, entry_id: bytes, fields: Mapping[bytes, bytes]) -> None:
        """Take the next entry of the stream (in id order)."""
        self.last_id = entry_id
        try:
            num, hash_, parent = peek_header(fields[ENTRY_FIELD])
        except (KeyError, ValueError):
            self.invalid += 1
            return
        self.blocks_seen += 1
        head, depth = self.head, 0
        if head is not None:
            if num <= head.num:
                depth = head.num - num + 1
            elif num == head.num + 1 and parent != head.hash:
                depth = 1
        block = SeenBlock(num=num, hash=hash_, parent=parent, entry_id=entry_id, reorg=depth)
        if depth and head is not None:
            self.reorg_count += 1
            self.reorgs.append(Reorg(ms=block.ms, old_head=head.num, new_num=num, depth=depth))
        self.head = block
        self.recent.append(block)

    def to_json(self) -> dict[str, Any]:
        return {
            "head": _block_json(self.head) if self.head else None,
            "recent": [_block_json(b) for b in reversed(self.recent)],
            "reorgs": [
                {"ms": r.ms, "old_head": r.old_head, "new_num": r.new_num, "depth": r.depth}
                for r in reversed(self.reorgs)
            ],
            "reorg_count": self.reorg_count,
            "blocks_seen": self.blocks_seen,
            "invalid": self.invalid,
        }


def _block_json(b: SeenBlock) -> dict[str, Any]:
    return {
        "num": b.num,
        "hash": "0x" + b.hash.hex(),
        "parent": "0x" + b.parent.hex(),
        "entry_id": b.entry_id.decode(),
        "ms": b.ms,
        "reorg": b.reorg,
    }


# --- archive_log through delta-rs ------------------------------------------------


class ArchiveLog:
    """Reads ``archive_log`` of the lake with delta-rs (no JVM); one table handle, refreshed."""

    COLUMNS = ["stream", "start_ms", "end_ms", "entries", "blocks"]

    def __init__(self, lake: LakeSettings | str) -> None:
        from pipeline.lake.storage import tables

        self.lake = LakeSettings.from_url(lake) if isinstance(lake, str) else lake
        self.uri = self.lake.table(tables.ARCHIVE_LOG)
        self._table: Any = None

    def read(self) -> dict[str, Archived]:
        """What the log says of each stream (empty when the table does not exist yet).

        Blocking: call it in a worker thread. Raises ``OSError`` or deltalake's
        ``DeltaError`` when the lake cannot be read.
        """
        from pipeline.lake.storage import store, tables

        if self._table is None:
            if not store.is_table(self.lake, tables.ARCHIVE_LOG):
                return {}
            self._table = store.open_table(self.lake, tables.ARCHIVE_LOG)
        else:
            self._table.update_incremental()
        table = self._table.to_pyarrow_dataset().to_table(columns=self.COLUMNS)
        per_stream: dict[str, list[Interval]] = {}
        for stream, start, end, entries, blocks in zip(
            *(table.column(c).to_pylist() for c in self.COLUMNS), strict=True
        ):
            per_stream.setdefault(stream, []).append(
                Interval(start_ms=start, end_ms=end, entries=entries or 0, blocks=blocks or 0)
            )
        return {stream: summarize(rows) for stream, rows in per_stream.items()}


# --- the board -------------------------------------------------------------------


class StatusBoard:
    """Everything ``/status.json`` reports, with the caches that keep it cheap."""

    def __init__(
        self,
        settings: Settings,
        connections: Collection[_Conn],
        *,
        archive: ArchiveLog | None = None,
    ) -> None:
        self.settings = settings
        self._connections = connections
        names = dict.fromkeys((settings.serve.stream, *settings.lake.chain_streams))
        self.streams = {name: StreamBoard(name) for name in names}
        self._archive = archive or ArchiveLog(settings.lake)
        self._lake: dict[str, Archived] | None = None
        self._lake_error: str | None = None
        self._lake_at = -LAKE_TTL_S
        self._lake_read_s = 0.0
        self._lake_task: asyncio.Future[None] | None = None
        self._snapshot = SharedSnapshot(self._build, SNAPSHOT_TTL_S)
        self.started_ms = int(time.time() * 1000)
        self.tail_up = False
        #: How many snapshots were built (not served): what viewers cost.
        self.builds = 0
        self.lake_reads = 0
        #: Set by :func:`setup` while the app runs.
        self.client: aioredis.Redis | None = None

    # --- tail --------------------------------------------------------------------

    async def tail(self, client: aioredis.Redis) -> None:
        """Follow every stream until cancelled; reconnect with a capped backoff on Redis errors."""
        delay = 0.05
        while True:
            try:
                await self._tail_once(client)
            except _REDIS_ERRORS as exc:
                checkpoint(exc)
                if self.tail_up or delay == 0.05:
                    log.warning("status tail: redis error %r; retrying", exc)
                self.tail_up = False
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
            else:
                delay = 0.05

    async def _tail_once(self, client: aioredis.Redis) -> None:
        for board in self.streams.values():
            if board.last_id is None:
                newest = cast(
                    _Entries, await client.xrevrange(board.key, "+", "-", count=RECENT_BLOCKS)
                )
                checkpoint()
                for entry_id, fields in reversed(newest):
                    board.see(entry_id, fields)
                if board.last_id is None:
                    board.last_id = b"0-0"
        self.tail_up = True
        if is_cluster(client):
            await self._poll_slots(client)
            return
        reply = cast(
            list[tuple[bytes, _Entries]] | None,
            await client.xread(
                {b.key: cast(bytes, b.last_id) for b in self.streams.values()},
                count=TAIL_COUNT,
                block=TAIL_BLOCK_MS,
            ),
        )
        checkpoint()
        if 0 < self._see(reply) < TAIL_COUNT:
            await self._pause()

    async def _pause(self) -> None:
        """Between two reads that find entries: :data:`TAIL_INTERVAL_S`."""
        await asyncio.sleep(TAIL_INTERVAL_S)

    async def _poll_slots(self, client: aioredis.Redis) -> None:
        """On a cluster one XREAD may only name keys of one slot: read each slot's streams
        without blocking (a blocked read per slot would hold a connection each), then pause."""
        groups: dict[int, list[StreamBoard]] = {}
        for board in self.streams.values():
            groups.setdefault(key_slot(board.key.encode()), []).append(board)
        seen = 0
        for boards in groups.values():
            reply = cast(
                list[tuple[bytes, _Entries]] | None,
                await client.xread(
                    {b.key: cast(bytes, b.last_id) for b in boards}, count=TAIL_COUNT
                ),
            )
            checkpoint()
            seen += self._see(reply)
        if not seen:
            await asyncio.sleep(CLUSTER_POLL_S)

    def _see(self, reply: list[tuple[bytes, _Entries]] | None) -> int:
        by_key = {b.key.encode(): b for b in self.streams.values()}
        seen = 0
        for key, entries in reply or ():
            board = by_key[key]
            for entry_id, fields in entries:
                board.see(entry_id, fields)
                seen += 1
        return seen

    # --- snapshots ---------------------------------------------------------------

    async def body(self) -> bytes:
        """The JSON of the current snapshot, rebuilt at most once per :data:`SNAPSHOT_TTL_S`."""
        return await self._snapshot.get()

    def _refresh_lake(self) -> asyncio.Future[None] | None:
        """Start an ``archive_log`` read when the last one is stale (never two at once)."""
        # A slow lake is read less often: at most a tenth of the time goes to reading it.
        if time.monotonic() - self._lake_at < max(LAKE_TTL_S, 10 * self._lake_read_s):
            return None
        if self._lake_task is None or self._lake_task.done():
            self._lake_task = asyncio.ensure_future(self._read_lake())
        return self._lake_task

    async def _read_lake(self) -> None:
        from deltalake.exceptions import DeltaError

        started = time.monotonic()
        try:
            self._lake = await asyncio.to_thread(self._archive.read)
            self._lake_error = None
        except (OSError, DeltaError, ValueError) as exc:
            log.warning("status: cannot read %s: %r", self._archive.uri, exc)
            self._lake_error = f"cannot read archive_log: {exc}"[:300]
        finally:
            self.lake_reads += 1
            self._lake_at = time.monotonic()
            self._lake_read_s = self._lake_at - started

    async def close(self) -> None:
        """Wait for an ``archive_log`` read in flight (a thread cannot be cancelled)."""
        if self._lake_task is not None:
            await asyncio.gather(self._lake_task, return_exceptions=True)

    async def _redis_view(self, client: aioredis.Redis) -> dict[str, Any]:
        try:
            async with asyncio.timeout(REDIS_TIMEOUT_S):
                pipe = client.pipeline(transaction=False)
                for board in self.streams.values():
                    pipe.xinfo_stream(board.key)
                replies = await pipe.execute(raise_on_error=False)
            checkpoint()
        except _REDIS_ERRORS as exc:
            checkpoint(exc)
            return {"up": False, "error": f"redis unavailable: {exc!r}"[:300]}
        streams: dict[str, Any] = {}
        for board, info in zip(self.streams.values(), replies, strict=True):
            if isinstance(info, Exception):  # no such key: the stream is empty or absent
                streams[board.name] = {"length": 0, "first_id": None, "last_id": None}
                continue
            first, last = info.get("first-entry"), info.get("last-entry")
            streams[board.name] = {
                "length": int(info.get("length", 0)),
                "first_id": first[0].decode() if first else None,
                "last_id": last[0].decode() if last else None,
            }
        return {"up": True, "streams": streams}

    async def _build(self) -> dict[str, Any]:
        self.builds += 1
        pending = self._refresh_lake()
        if pending is not None and self._lake is None and self._lake_error is None:
            await asyncio.wait({pending}, timeout=LAKE_FIRST_WAIT_S)
        client = self.client
        redis_view: dict[str, Any] = (
            await self._redis_view(client) if client is not None else {"up": False}
        )
        now_ms = int(time.time() * 1000)
        settings = self.settings
        conns = list(self._connections)
        subscriptions = sum(len(c.subs) for c in conns)
        streams = []
        for name, board in self.streams.items():
            hot = redis_view.get("streams", {}).get(name)
            first_ms = _ms(hot["first_id"]) if hot else None
            last_ms = _ms(hot["last_id"]) if hot else None
            served = name == settings.serve.stream
            streams.append(
                {
                    "name": name,
                    "served": served,
                    "subscribers": subscriptions if served else None,
                    **board.to_json(),
                    "redis": hot,
                    "coverage": coverage(
                        (self._lake or {}).get(name, Archived()),
                        first_ms=first_ms,
                        last_ms=last_ms,
                        now_ms=now_ms,
                        hot_retention_s=settings.lake.hot_retention_s,
                    ),
                }
            )
        return {
            "version": __version__,
            "now_ms": now_ms,
            "started_ms": self.started_ms,
            "served_stream": settings.serve.stream,
            "connections": len(conns),
            "subscriptions": subscriptions,
            "redis": {**redis_view, "up": bool(redis_view.get("up")) and self.tail_up},
            "lake": {
                "uri": settings.lake.uri,
                "error": self._lake_error,
                "read_age_s": round(time.monotonic() - self._lake_at, 1)
                if self._lake is not None
                else None,
            },
            "hot_retention_s": settings.lake.hot_retention_s,
            "archive_cron": settings.lake.archive_cron,
            "streams": streams,
        }


def _ms(entry_id: str | None) -> int | None:
    return None if entry_id is None else parse_entry_id(entry_id)[0]


# --- aiohttp wiring --------------------------------------------------------------

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
    blocking read and the snapshots) and its tail task live in a cleanup
    context of ``app``.
    """
    board = StatusBoard(settings, connections)
    app[BOARD] = board
    app[_TOKEN] = settings.serve.token
    app[_STATIC] = _load_static()

    async def tail_ctx(app: web.Application) -> AsyncIterator[None]:
        client = connect(
            settings.redis.url, Role.TAIL, block_s=TAIL_BLOCK_MS / 1000, max_connections=2
        )
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
