"""``/healthz``'s ``head``: the newest block this server knows of, from whichever source knows it.

The live hub knows it once a block was published since the server started.
Before that (no producer writing, a server just restarted) the newest entry of
the Redis stream says it; when Redis holds no block of the chain (trimmed to
nothing, emptied, or down) the lake's canonical head does. ``null`` only when
none of them holds a block. Before, ``head`` was the hub's alone and read
``null`` for a server in front of a lake of 1,600 blocks (issue 33, 7).

The lake is read at most every :data:`LAKE_EVERY_S` seconds (a health check
polled every second costs the store little), in a worker thread, one read at
a time; a lake that cannot be read gives no head (``/healthz`` says
``"lake": "down"`` on its own).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from aiohttp import web
from redis.exceptions import RedisError

from pipeline import keys
from pipeline.blockcodec import ENTRY_FIELD
from pipeline.chain.history.tailread import FilteredReads
from pipeline.chain.planning import History
from pipeline.chain.produce.producer import WebsocketHub
from pipeline.chain.serve.streamboard import peek_header
from pipeline.errors import SluiceError
from pipeline.runtime import health

#: Seconds a lake head read is reused.
LAKE_EVERY_S = 5.0


class HeadFinder:
    """The head ``/healthz`` reports for one chain stream: see the module docstring."""

    def __init__(
        self,
        *,
        stream: str,
        hub: WebsocketHub,
        redis: aioredis.Redis | None,
        history: Callable[[], History | None] | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stream = stream
        self._key = keys.stream(stream)
        self._hub = hub
        self._redis = redis
        self._history = history
        self._clock = clock
        self._lake: tuple[float, int | None] | None = None
        self._reading = threading.Lock()
        #: Reads of the lake's head so far.
        self.lake_reads = 0

    async def head(self) -> int | None:
        """The newest block's number: live, else Redis's newest entry, else the lake's head."""
        last = self._hub.last
        if last is not None:
            return last.num
        newest = await self._redis_head()
        if newest is not None:
            return newest
        return await asyncio.to_thread(self._lake_head)

    async def _redis_head(self) -> int | None:
        """The number of the stream's newest entry, when it is a block (None: no such entry,
        or Redis did not answer in time)."""
        if self._redis is None:
            return None
        reads = FilteredReads(self._redis, self._key)  # an oversized entry never leaves Redis
        try:
            async with asyncio.timeout(health.CHECK_TIMEOUT_S):
                _length, _first, newest = await reads.ends()
                if newest is None:
                    return None
                entries, _more = await reads.page(newest, newest, 1)
        except (RedisError, OSError, TimeoutError):
            return None
        for _entry_id, fields in entries:
            data = (fields or {}).get(ENTRY_FIELD)
            try:
                return peek_header(data)[0] if isinstance(data, bytes) else None
            except ValueError:
                return None
        return None

    def _lake_head(self) -> int | None:
        """The lake's canonical head, read at most every :data:`LAKE_EVERY_S` seconds."""
        if self._history is None:
            return None
        with self._reading:
            now = self._clock()
            if self._lake is not None and now - self._lake[0] < LAKE_EVERY_S:
                return self._lake[1]
            found = self._read_lake()
            self._lake = (now, found)
            return found

    def _read_lake(self) -> int | None:
        from pipeline.lake.storage.store import store_errors

        assert self._history is not None
        self.lake_reads += 1
        unreadable: tuple[type[BaseException], ...] = (SluiceError, *store_errors())
        try:
            reader: Any = self._history()
            head = getattr(reader, "head", None)
            row = head(self._stream) if head is not None else None
        except unreadable:
            return None
        return int(row.num) if row is not None else None


#: The server's head finder (made with its Redis client, in ``_redis_ctx``).
HEAD = web.AppKey("head", HeadFinder)

__all__ = ["HEAD", "LAKE_EVERY_S", "HeadFinder"]
