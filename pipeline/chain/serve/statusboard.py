"""What the status page of ``sluice serve`` reports: one :class:`StatusBoard` per server.

Theory of operation: one :class:`StatusBoard` per server gathers three views
of every chain stream (the served stream and ``chain_streams``):

- the chain as Redis holds it: a background tail (one filtered read per stream,
  :class:`~pipeline.chain.history.tailread.FilteredReads`, at most one every
  :data:`TAIL_INTERVAL_S`: an entry over ``MAX_ENTRY_BYTES`` never leaves Redis
  and counts as invalid) peeks at the ``num``/``hash``/``parent`` of each new entry,
  keeps the head,
  the last :data:`~pipeline.chain.serve.streamboard.RECENT_BLOCKS` blocks and the last
  :data:`~pipeline.chain.serve.streamboard.RECENT_REORGS` reorgs (bounded deques,
  :class:`~pipeline.chain.serve.streamboard.StreamBoard`), and counts reorgs since the
  server started (the blocks seeded at start count too);
- the lake's coverage: ``archive_log`` read with delta-rs (never a JVM), at
  most once per :data:`LAKE_TTL_S`, in a worker thread, stale-while-refresh so
  a slow lake never holds a page up; its intervals are merged there, exactly as
  the safe trim merges them (:func:`pipeline.intervals.merge_intervals`), so a
  snapshot only looks the oldest Redis entry up in the merged runs;
- the Redis hot window (length, first and last entry ids, read as ids alone),
  the trim point (the oldest entry still in Redis) and how far the next safe
  trim could go.

``/status.json`` is built at most once per :data:`SNAPSHOT_TTL_S` and shared
by every viewer, so any number of pages polling every second cost one Redis
round trip per stream per second and one ``archive_log`` read per
:data:`LAKE_TTL_S`. Nothing is kept per viewer. The page polls; it holds no
connection open. The routes and the board's lifecycle are :mod:`pipeline.chain.serve.status`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any, Protocol, cast

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError

from pipeline import __version__
from pipeline.chain.history.tailread import FilteredReads
from pipeline.chain.serve.coverage import Archived, Interval, coverage, summarize
from pipeline.chain.serve.streamboard import RECENT_BLOCKS, StreamBoard
from pipeline.redisio.conn import (
    UNAVAILABLE,
    checkpoint,
    parse_entry_id,
)
from pipeline.runtime.snapshot import SharedSnapshot
from pipeline.settings import LakeSettings, Settings

log = logging.getLogger(__name__)

#: Every viewer within this window gets the same snapshot.
SNAPSHOT_TTL_S = 1.0
#: ``archive_log`` is read at most this often (and at most 10% of the time when reads are slow).
LAKE_TTL_S = 5.0
#: How long the first snapshot waits for the first ``archive_log`` read.
LAKE_FIRST_WAIT_S = 3.0
#: Redis part of a snapshot: give up after this long and report Redis down.
REDIS_TIMEOUT_S = 2.0
#: Entries of one stream read per pass of the tail.
TAIL_COUNT = 512
#: After a pass that found entries (fewer than ``TAIL_COUNT``), the tail waits this long
#: before the next, which takes all that came meanwhile: one round trip per block cost
#: 5-6% of the server's CPU at 100 blocks/s (``make bench B=resume``); after a pass that
#: found none, it waits as long (no Redis command blocks without sending what it waited
#: for: ``XREAD BLOCK`` sent every hostile entry whole). Well inside what the page shows
#: at once (:data:`SNAPSHOT_TTL_S`).
TAIL_INTERVAL_S = 0.25

#: What a lost, slow or refusing Redis raises (ResponseError included: reported, retried).
_REDIS_ERRORS: tuple[type[BaseException], ...] = (TimeoutError, aioredis.RedisError, *UNAVAILABLE)


class ConnectionView(Protocol):
    """What the board reads of a server connection: its open subscriptions."""

    @property
    def subs(self) -> Mapping[str, Any]: ...


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
        connections: Collection[ConnectionView],
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
        #: Told each Redis error of the tail and the snapshots (serve counts them by kind).
        self.on_redis_error: Callable[[BaseException], None] | None = None
        self._reads_of: tuple[aioredis.Redis, dict[str, FilteredReads]] | None = None

    # --- tail --------------------------------------------------------------------

    async def tail(self, client: aioredis.Redis) -> None:
        """Follow every stream until cancelled; reconnect with a capped backoff on Redis errors."""
        delay = 0.05
        while True:
            try:
                await self._tail_once(client)
            except _REDIS_ERRORS as exc:
                checkpoint(exc)
                self._redis_failed(exc)
                if self.tail_up or delay == 0.05:
                    log.warning("status tail: redis error %r; retrying", exc)
                self.tail_up = False
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
            else:
                delay = 0.05

    def _redis_failed(self, exc: BaseException) -> None:
        if self.on_redis_error is not None:
            self.on_redis_error(exc)

    def _reads(self, client: aioredis.Redis) -> dict[str, FilteredReads]:
        """Each stream's filtered reads on ``client`` (made again for another client)."""
        if self._reads_of is None or self._reads_of[0] is not client:
            self._reads_of = (
                client,
                {name: FilteredReads(client, b.key) for name, b in self.streams.items()},
            )
        return self._reads_of[1]

    async def _tail_once(self, client: aioredis.Redis) -> None:
        reads = self._reads(client)
        for name, board in self.streams.items():
            if board.last_id is None:  # the last RECENT_BLOCKS entries first
                _length, _first, start = await reads[name].ends(RECENT_BLOCKS)
                for entry_id, fields in await reads[name].range(start or b"-", b"+"):
                    board.see(entry_id, fields)
                if board.last_id is None:
                    board.last_id = b"0-0"
        self.tail_up = True
        seen = 0
        for name, board in self.streams.items():
            entries, _more = await reads[name].page(
                b"(" + cast(bytes, board.last_id), b"+", TAIL_COUNT
            )
            for entry_id, fields in entries:
                board.see(entry_id, fields)
            seen += len(entries)
        if not seen:
            await asyncio.sleep(TAIL_INTERVAL_S)
        elif seen < TAIL_COUNT:
            await self._pause()

    async def _pause(self) -> None:
        """Between two reads that find entries: :data:`TAIL_INTERVAL_S`."""
        await asyncio.sleep(TAIL_INTERVAL_S)

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
                replies = await self._ends(client)
            checkpoint()
        except _REDIS_ERRORS as exc:
            checkpoint(exc)
            self._redis_failed(exc)
            return {"up": False, "error": f"redis unavailable: {exc!r}"[:300]}
        streams: dict[str, Any] = {}
        for board, reply in zip(self.streams.values(), replies, strict=True):
            if isinstance(reply, Exception):  # not a stream: reported as empty
                streams[board.name] = {"length": 0, "first_id": None, "last_id": None}
                continue
            length, first, last = FilteredReads.parse_ends(reply)
            streams[board.name] = {
                "length": length,
                "first_id": first.decode() if first else None,
                "last_id": last.decode() if last else None,
            }
        return {"up": True, "streams": streams}

    async def _ends(self, client: aioredis.Redis) -> list[Any]:
        """Each stream's :data:`~pipeline.chain.history.tailread.ENDS` reply (ids only: an
        entry at either end may be hostile), in one round trip; an error as its reply."""
        reads = self._reads(client)
        while True:
            pipe = client.pipeline(transaction=False)
            for read in reads.values():
                read.queue_ends(pipe)
            replies: list[Any] = await pipe.execute(raise_on_error=False)
            if not any(isinstance(r, NoScriptError) for r in replies):
                return replies
            await next(iter(reads.values())).load()  # a restarted server: once for all

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


__all__ = [
    "LAKE_FIRST_WAIT_S",
    "LAKE_TTL_S",
    "REDIS_TIMEOUT_S",
    "SNAPSHOT_TTL_S",
    "TAIL_COUNT",
    "TAIL_INTERVAL_S",
    "ArchiveLog",
    "ConnectionView",
    "StatusBoard",
]
