"""Where a subscription starts, and single canonical blocks: the read side of resumption.

:class:`Locator` resolves a client's (number, hash) to a
:class:`~pipeline.chain.planning.Plan` (see :mod:`pipeline.chain.history.resumption`,
phase 1) and reads one canonical block for ``getBlock``. It reads the Redis
tail through the shared :class:`~pipeline.chain.history.tail.SharedTail` index and a
:class:`~pipeline.chain.planning.TailReads` adapter, and the lake through a
:class:`~pipeline.chain.planning.History`; it never reads the whole tail.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from pipeline.blockcodec import ENTRY_FIELD, MAX_BLOCK_NUM, KeyTest, decode_raw
from pipeline.chain.cardinal import encode_results
from pipeline.chain.history.lakepages import (
    FIRST_PAGE,
    close_pages,
    next_page,
    refresh_history,
    short_first,
)
from pipeline.chain.history.seam import LAKE_WALK, seam_of
from pipeline.chain.history.tail import SharedTail
from pipeline.chain.planning import History, Plan, Reason, Seam, TailReads, rewind_start
from pipeline.chain.tailindex import TailIndex
from pipeline.errors import BadParams, ResumptionError

log = logging.getLogger(__name__)

#: Refreshes a plan tries before it is made on the index as it is (each waits up to 2 s).
FRESH_ATTEMPTS = 10


class Locator:
    """Resolve and block reads over one chain stream (shared by every call of a server)."""

    def __init__(
        self,
        *,
        stream: str,
        tail: SharedTail,
        entries: TailReads,
        history_factory: Callable[[], History | None] | None,
        reorg_threshold: int,
        batch_rows: int,
    ) -> None:
        self._stream = stream
        self._tail = tail
        self._entries = entries
        self._history_factory = history_factory
        self._threshold = reorg_threshold
        self._batch_rows = batch_rows
        #: the last seam found, by (tail's first height and hash, lake version, reader)
        self._seam: tuple[tuple[Any, ...], Seam | None] | None = None

    async def scan_tail(self) -> TailIndex:
        """The shared tail index, brought up to date; it may change at the caller's next await."""
        await self._tail.refresh()
        return self._tail.index

    async def warm(self) -> None:
        """Index the Redis tail now (a server calls it at start so no client pays for it)."""
        await self._tail.refresh()

    def open_history(self) -> History | None:
        if self._history_factory is None:
            return None
        history: History | None = self._history_factory()
        return history

    async def resolve(
        self, num: int, hash: bytes, keep: KeyTest | None, *, refresh: bool = True
    ) -> Plan:
        """Where to start for a client at (``num``, ``hash``); ``keep`` as for :meth:`TieredResumption.stream`.

        Reads the shared tail index (refreshed first), never the whole tail;
        the plan holds a snapshot of the tail's chain from its start up.
        ``refresh=False``: the index as it is, refreshed only when the block
        is not found canonical there (the caller knows the index holds what
        the live feed published; a newer entry is then replayed in order).
        """
        if num < 0:
            raise ResumptionError("block number must be non-negative")
        if num > MAX_BLOCK_NUM:
            raise BadParams(f"block number: at most {hex(MAX_BLOCK_NUM)}")
        if not refresh:
            async with self._tail.reading() as tail:
                plan = await self._resolve(tail, num, hash, keep)
                if plan.reason is Reason.MATCH:
                    plan.tail = self._tail.snapshot(plan.start)
                    return plan
        await self._fresh_index()
        async with self._tail.reading() as tail:
            plan = await self._resolve(tail, num, hash, keep)
            plan.tail = self._tail.snapshot(plan.start)
        return plan

    async def _fresh_index(self) -> None:
        """Refresh the tail index, again while readers hold it (a refresh waits for them a
        while, then gives up). A plan made on a stale index lacked a deep reorg's new
        branch and resumed its subscriber past it (history checker seed 1079, catch-ups
        holding the index through their lake walks). After :data:`FRESH_ATTEMPTS` the
        plan is made on the index as it is: the replay after it still reads what is newer."""
        for _ in range(FRESH_ATTEMPTS):
            if await self._tail.refresh():
                return
        log.warning("tail index still busy after %d refreshes: planning on it", FRESH_ATTEMPTS)

    async def _resolve(self, tail: TailIndex, num: int, hash: bytes, keep: KeyTest | None) -> Plan:
        fresh = getattr(self._history_factory, "fresh", None)  # a SharedHistory's, no I/O
        history = fresh() if fresh is not None else None
        if history is None:
            history = await asyncio.to_thread(self.open_history)
        want = hash.hex()
        lo = tail.lo
        in_tail = tail.chain.get(num)
        seam = None
        if history is not None and not (in_tail is not None and in_tail[0] == want):
            seam = await self._seam_for(tail, history)
        stop = lo if seam is None else seam.lo  # the lake's flags hold below it
        if in_tail is None and history is not None and (stop is None or num < stop):
            # Check the hash on the first page the stream will send anyway: one lake read, not two.
            pages = self.history_pages(history, num, stop)
            first = await asyncio.to_thread(next_page, pages, keep)
            if not (first and first[0].num == num):
                # A shared reader may be a little behind the lake: look again at the latest version.
                await refresh_history(history)
                close_pages(pages)
                pages = self.history_pages(history, num, stop)
                first = await asyncio.to_thread(next_page, pages, keep)
            if first and first[0].num == num and first[0].hash == want:
                return Plan(
                    start=num,
                    tail=tail,
                    history=history,
                    reason=Reason.MATCH,
                    prefetched=(pages, first),
                    seam=seam,
                )
            close_pages(pages)
            canonical = first[0].hash if first and first[0].num == num else None
        else:
            canonical = await self._canonical_hash(tail, history, num, seam)
        if canonical == want:
            return Plan(start=num, tail=tail, history=history, reason=Reason.MATCH, seam=seam)
        fork = await self._fork_point(tail, history, want, seam)
        if fork is not None:
            start, reason = fork
            return Plan(start=start, tail=tail, history=history, reason=reason, seam=seam)
        return Plan(
            start=rewind_start(num, self._threshold),
            tail=tail,
            history=history,
            reason=Reason.REWIND,
            seam=seam,
        )

    async def _seam_for(self, tail: TailIndex, history: History) -> Seam | None:
        """:func:`~pipeline.chain.history.seam.seam_of`, kept while the tail's first block
        and the lake's version stay the same (one lake read per change, not per subscribe)."""
        lo = tail.lo
        if lo is None:
            return None
        key = (lo, tail.chain[lo][0], getattr(history, "version", None), id(history))
        cached = self._seam
        if cached is not None and cached[0] == key:
            return cached[1]
        seam = await asyncio.to_thread(seam_of, history, self._stream, tail)
        if seam is not None:
            log.info(
                "stream %s: the lake does not mark %d..%d canonical yet, below the tail's "
                "first block %d: sent from the lake by hash",
                self._stream, seam.lo, lo - 1, lo,
            )  # fmt: skip
        self._seam = (key, seam)
        return seam

    def history_pages(self, history: History, start: int, stop: int | None) -> Iterator[pa.Table]:
        """Lake pages from ``start``; the first one short, so the first block goes out soon."""
        pages = history.iter_canonical_arrow(self._stream, start, stop, batch_rows=self._batch_rows)
        return short_first(pages, FIRST_PAGE)

    async def _canonical_hash(
        self, tail: TailIndex, history: History | None, num: int, seam: Seam | None
    ) -> str | None:
        hit = tail.chain.get(num)
        if hit is not None:
            return hit[0]
        if seam is not None and num >= seam.lo and (tail.lo is None or num < tail.lo):
            return seam.hash_at(num)
        if history is None or (tail.chain and num > tail.hi):
            # Nothing above the tail's head is canonical, whatever the lake last marked:
            # a shorter, heavier branch in Redis replaced it (the lake is marked later).
            return None
        row = await asyncio.to_thread(history.canonical_at, self._stream, num)
        return None if row is None else bytes(row.hash).hex()

    async def _lookup_fresh(
        self,
        tail: TailIndex,
        history: History | None,
        h: str,
        fresh: list[bool],
        seam: Seam | None,
    ) -> tuple[int, str, bool] | None:
        """:meth:`_lookup`; a hash found nowhere is looked up again once the shared lake
        reader was moved to the latest version (``fresh``: whether it was, once per walk).

        The reader may be a little behind the lake: a walk down a replaced branch whose
        lower blocks an archive had just committed (and trim taken out of Redis) found
        nothing, so the subscriber was rewound by the threshold from its own height
        instead of from the fork point, and a cardinal consumer kept the replaced blocks
        below it (history checker seed 1071)."""
        found = await self._lookup(tail, history, h, seam)
        if found is None and history is not None and not fresh[0]:
            fresh[0] = True
            await refresh_history(history)
            found = await self._lookup(tail, history, h, seam)
        return found

    async def _lookup(
        self, tail: TailIndex, history: History | None, h: str, seam: Seam | None
    ) -> tuple[int, str, bool] | None:
        """(num, parent, canonical) of a block hash, from the tail first, then the lake."""
        seen = tail.seen.get(h)
        if seen is not None:
            num, parent = seen[0], seen[1]
            in_chain = tail.chain.get(num)
            if in_chain is not None:
                return num, parent, in_chain[0] == h
            canonical = await self._canonical_hash(tail, history, num, seam)
            return num, parent, canonical == h
        if history is None:
            return None
        row = await asyncio.to_thread(history.find_hash, self._stream, bytes.fromhex(h))
        if row is None:
            return None
        canonical = await self._canonical_hash(tail, history, row.num, seam)
        return row.num, bytes(row.parent).hex(), canonical == h

    async def _fork_point(
        self, tail: TailIndex, history: History | None, want: str, seam: Seam | None
    ) -> tuple[int, Reason] | None:
        fresh = [False]
        found = await self._lookup_fresh(tail, history, want, fresh, seam)
        if found is None:
            return None
        num, parent, canonical = found
        if canonical:
            return num, Reason.HASH
        # Down the replaced branch to the chain, however deep: through the tail's index
        # in memory, then the lake (at most LAKE_WALK of its lookups).
        lake_steps = 0
        while num > 0:
            in_tail = parent in tail.seen
            if not in_tail:
                lake_steps += 1
                if lake_steps > LAKE_WALK:
                    return None
            found = await self._lookup_fresh(tail, history, parent, fresh, seam)
            if found is None or found[0] != num - 1:
                return None
            num, parent, canonical = found
            if canonical:
                return num + 1, Reason.FORK
        return None

    async def get_block(self, num: int, keep: KeyTest | None = None) -> list[str] | None:
        """The canonical block at ``num`` as its JSON results, or None when unknown.

        One lookup in the shared tail index and one XRANGE of that entry (or
        one lake read), whatever the length of the tail. ``keep`` as for
        :meth:`TieredResumption.stream` (a key filter or a dialect's encoding).
        """
        found = await self.get_block_raw(num)
        return None if found is None else encode_results(*found, keep)

    async def get_block_raw(self, num: int) -> tuple[dict[str, Any], int, str, str] | None:
        """(decoded map, num, hash hex, parent hex) of the canonical block at ``num``, or None."""
        if not 0 <= num <= MAX_BLOCK_NUM:
            raise BadParams(f"block number: 0 to {hex(MAX_BLOCK_NUM)}")
        tail = await self.scan_tail()
        hit = tail.chain.get(num)
        if hit is not None:
            h, parent, entry_id = hit
            entries = await self._entries.between(entry_id, entry_id)
            if entries:
                raw = decode_raw(entries[0][1][ENTRY_FIELD])
                return raw, num, h, parent
        history = await asyncio.to_thread(self.open_history)
        if history is None:
            return None
        seam = (
            await self._seam_for(tail, history) if tail.lo is not None and num < tail.lo else None
        )
        if seam is not None and seam.hash_at(num) is not None:
            n, h, p, payload = seam.rows_from(num)[0]
            return decode_raw(payload), n, h, p
        row = await asyncio.to_thread(history.canonical_at, self._stream, num)
        if row is None:
            return None
        return decode_raw(row.payload), num, row.hash.hex(), row.parent.hex()


__all__ = ["Locator"]
