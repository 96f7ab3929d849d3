"""The Redis tail of a chain stream: the shared index, and entry reads behind :class:`TailReads`.

:class:`SharedTail` keeps one :class:`~pipeline.chain.tailindex.TailIndex` per
server, brought up to date incrementally; :class:`RedisTail` is the adapter
resumption reads entries through. Every await on Redis is followed by
:func:`~pipeline.redisio.conn.checkpoint` (redis-py may swallow a cancellation).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError

from pipeline.chain.history.entries import Refusals
from pipeline.chain.history.tailread import FilteredReads
from pipeline.chain.planning import Entries
from pipeline.chain.tailindex import TailIndex, index_entry
from pipeline.redisio.conn import checkpoint, parse_entry_id

log = logging.getLogger(__name__)

#: Entries per XRANGE page (index refreshes, tail reads, replay).
PAGE = 1000


#: Refused entries a read steps around (more in one read: it reads through them).
SKIP_AT_MOST = 16


class RedisTail:
    """:class:`~pipeline.chain.planning.TailReads` over one Redis stream key.

    Entries are read through :class:`~pipeline.chain.history.tailread.FilteredReads`:
    an oversized one never leaves Redis (it is refused and comes back with no
    fields). With ``refused``, reads also leave out the entries already refused
    (:class:`~pipeline.chain.history.entries.Refusals`): the ranges around them are
    read instead, so a hostile entry is not fetched again by every catch-up.
    """

    __slots__ = ("_reads", "_redis", "_refused")

    def __init__(self, redis: aioredis.Redis, key: str, refused: Refusals | None = None) -> None:
        self._redis = redis
        self._reads = FilteredReads(redis, key, refused)
        self._refused = refused

    def _skips(self, after: bytes, upto: bytes | None = None) -> list[bytes]:
        if self._refused is None:
            return []
        skips = self._refused.within(after, upto)
        return skips if len(skips) <= SKIP_AT_MOST else []

    async def between(self, first: bytes, last: bytes) -> Entries:
        skips = [s for s in self._skips(first, last) if s != last]
        if not skips:
            return await self._reads.range(first, last)
        # the ranges around the skipped entries in one round trip
        bounds: list[tuple[bytes, bytes]] = []
        lo = first
        for skip in skips:
            bounds.append((lo, b"(" + skip))
            lo = b"(" + skip
        bounds.append((lo, last))
        pipe = self._redis.pipeline(transaction=False)
        for lo, hi in bounds:
            self._reads.queue(pipe, lo, hi, PAGE)
        replies = await pipe.execute(raise_on_error=False)
        checkpoint()
        out: Entries = []
        for (lo, hi), reply in zip(bounds, replies, strict=True):
            if isinstance(reply, Exception):  # (NOSCRIPT: range() loads the script)
                out += await self._reads.range(lo, hi)
                continue
            entries, more = self._reads.parse(reply, PAGE)
            out += entries
            if more or len(entries) == PAGE:
                out += await self._reads.range(b"(" + entries[-1][0], hi)
        return out

    async def after(self, last_id: bytes, count: int) -> Entries:
        lo = b"(" + last_id
        out: Entries = []
        for skip in [*self._skips(last_id), None]:
            hi = b"+" if skip is None else b"(" + skip
            out += await self._reads.range(lo, hi, count - len(out))
            if skip is None or len(out) >= count:
                return out
            lo = b"(" + skip
        return out


class SharedTail:
    """One :class:`TailIndex` of a Redis chain stream, shared by every call of a server.

    :meth:`refresh` reads only the entries after the last one indexed (pages
    of :data:`PAGE`), drops entries trimmed from Redis, and starts over when the
    stream was recreated. Readers (:meth:`reading`) see an index that does not
    change under them: a refresh waits for them (at most ``writer_wait_s``,
    else it leaves the index as it is for the next call) and new readers wait
    for a pending refresh. Memory is bounded by ``max_entries`` (oldest
    entries leave the index first; they are then served from the lake).
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        key: str,
        *,
        max_entries: int = 1_000_000,
        writer_wait_s: float = 2.0,
        refused: Callable[[bytes, Exception], None] | None = None,
    ) -> None:
        self._redis = redis
        self._refused = refused
        #: the height check shared with the other readers (a Refusals' admit), if any
        self._admit: Callable[[bytes, int, str, str], bool] | None = getattr(refused, "admit", None)
        self._reads = FilteredReads(redis, key, refused)
        self._key = key
        self._max = max_entries
        self._writer_wait_s = writer_wait_s
        self.index = TailIndex()
        #: (entry id, num, hash) in production order, to drop what Redis trimmed.
        self._order: deque[tuple[tuple[int, int], int, str]] = deque()
        self._lock = asyncio.Lock()
        self._arrivals = 0
        self._fresh_as_of = 0
        self._readers = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._gate = asyncio.Event()
        self._gate.set()

    def __len__(self) -> int:
        return len(self._order)

    @contextlib.asynccontextmanager
    async def reading(self) -> AsyncIterator[TailIndex]:
        """The index, unchanged until the block exits."""
        while not self._gate.is_set():
            await self._gate.wait()
        self._readers += 1
        self._idle.clear()
        try:
            yield self.index
        finally:
            self._readers -= 1
            if not self._readers:
                self._idle.set()

    async def refresh(self) -> bool:
        """Index what was added since the last refresh (one round trip when nothing was).

        Calls that arrive while a refresh runs share the next one: a refresh
        covers every call that arrived before it started. False: skipped (readers
        held the index too long), the index may lack what was added before the call.
        """
        self._arrivals += 1
        me = self._arrivals
        async with self._lock:
            if self._fresh_as_of >= me:
                return True
            mark = self._arrivals
            if await self._refresh():
                self._fresh_as_of = mark  # (a skipped refresh leaves the next caller to retry)
                return True
            return False

    async def _refresh(self) -> bool:
        """Bring the index up to date; False when readers held it too long (nothing applied)."""
        while True:
            last = self.index.last_id
            pipe = self._redis.pipeline(transaction=False)
            self._reads.queue_ends(pipe)  # ids only: the first or newest entry may be hostile
            self._reads.queue(pipe, b"(" + last, b"+", PAGE)
            replies = await pipe.execute(raise_on_error=False)
            checkpoint()
            if any(isinstance(r, NoScriptError) for r in replies):  # a restarted server
                await self._reads.load()
                continue
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
            _length, first, newest = self._reads.parse_ends(replies[0])
            entries, more = self._reads.parse(replies[1], PAGE)
            if not await self._exclusive():
                return False
            try:
                if first is None or newest is None or parse_entry_id(newest) < parse_entry_id(last):
                    if self._order or last != b"0-0":
                        self._reset()  # emptied or recreated (ids went back): start over
                        if newest is not None:
                            continue
                    return True
                self._drop_before(parse_entry_id(first))
                for entry_id, fields in entries:
                    added = index_entry(self.index, entry_id, fields, self._refused, self._admit)
                    num, hash = added if added is not None else (-1, "")
                    self._order.append((parse_entry_id(entry_id), num, hash))
                if len(self._order) > self._max:
                    log.warning(
                        "tail index over %d entries: the oldest are served from the lake", self._max
                    )
                    self._drop_before(self._order[len(self._order) - self._max][0])
            finally:
                self._gate.set()
            if len(entries) < PAGE and not more:
                return True

    async def _exclusive(self) -> bool:
        """Close the gate and wait until no reader holds the index; False (gate open) on timeout."""
        self._gate.clear()
        try:
            async with asyncio.timeout(self._writer_wait_s):
                while self._readers:
                    await self._idle.wait()
        except TimeoutError:
            self._gate.set()
            log.warning("tail index refresh skipped: readers held it for %ss", self._writer_wait_s)
            return False
        except BaseException:
            self._gate.set()  # cancelled while waiting: never leave readers locked out
            raise
        return True

    def _reset(self) -> None:
        self.index = TailIndex()
        self._order.clear()

    def _drop_before(self, first: tuple[int, int]) -> None:
        chain, seen = self.index.chain, self.index.seen
        order = self._order
        while order and order[0][0] < first:
            entry_key, num, hash = order.popleft()
            hit = chain.get(num)
            if hit is not None and parse_entry_id(hit[2]) == entry_key:
                del chain[num]
                seen.pop(hash, None)
            elif hash and (hit is None or hit[0] != hash):
                seen.pop(hash, None)  # a block reorged away (a later entry may repeat a hash)

    def snapshot(self, start: int) -> TailIndex:
        """What a plan streaming from ``start`` needs: the chain from there up (plus ``lo``)."""
        index = self.index
        lo = index.lo
        if lo is None or start <= lo:
            chain = dict(index.chain)
        else:
            chain = {n: index.chain[n] for n in range(start, index.hi + 1) if n in index.chain}
            chain[lo] = index.chain[lo]
        return TailIndex(chain=chain, last_id=index.last_id, hi=index.hi)


__all__ = ["PAGE", "SKIP_AT_MOST", "RedisTail", "SharedTail"]
