"""Catch-up from the lake: canonical blocks sent in order, read one page ahead, with no gap.

Phase 2 of resumption (:mod:`pipeline.chain.history.resumption`): the lake's
canonical blocks from a position up to where the Redis tail starts, read
through the plan's :class:`~pipeline.chain.planning.History`, encoded a turn
at a time (:mod:`pipeline.chain.history.turns`) and shared between catch-ups
reading at the same time (:mod:`pipeline.chain.history.shared`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterator

import pyarrow as pa

from pipeline.blockcodec import KeyTest
from pipeline.chain.forkchoice import Sender
from pipeline.chain.history.lakepages import (
    ENCODE_BYTES,
    ENCODE_ROWS,
    HISTORY_GAP,
    close_pages,
    drop_read,
    page_emits,
    rows_emits,
    rows_within,
)
from pipeline.chain.history.resolve import Locator
from pipeline.chain.history.shared import SharedResults, shape_of
from pipeline.chain.history.turns import Turn, Turns
from pipeline.chain.planning import BlockSink, Emit, History, Seam
from pipeline.errors import ResumptionError


class _PagesAhead:
    """Lake pages read in a worker thread one page ahead, handed out ``ENCODE_ROWS`` rows
    (or ``ENCODE_BYTES`` of payloads) at a time."""

    def __init__(self, pages: Iterator[pa.Table]) -> None:
        self._pages = pages
        self._read = functools.partial(
            asyncio.get_running_loop().run_in_executor, None, next, pages, None
        )
        self._table: pa.Table | None = None
        #: The read of the next page (None once the pages ran out).
        self._ahead: asyncio.Future[pa.Table | None] | None = None

    def start(self) -> None:
        """Start reading the first page."""
        self._ahead = self._read()

    async def next_rows(self) -> pa.Table | None:
        """The next rows to encode (at most ``ENCODE_ROWS`` and ``ENCODE_BYTES``); None once
        the pages ran out."""
        table = self._table
        if table is None or table.num_rows == 0:
            assert self._ahead is not None  # None only once the pages ran out
            table = self._table = await self._ahead
            if table is None:
                self._ahead = None
                return None
            self._ahead = self._read()
        n = rows_within(table, ENCODE_ROWS, ENCODE_BYTES)
        self._table = table.slice(n)
        return table.slice(0, n)

    def close(self) -> None:
        """Drop the read in flight, if any, and close the pages."""
        if self._ahead is not None:
            drop_read(self._ahead)
        close_pages(self._pages)


def _in_order(emits: list[Emit], pos: int, sender: Sender) -> list[Emit]:
    """The blocks of ``emits`` to send, noted by ``sender``; they must follow ``pos`` with no gap.

    A slice that does not start at ``pos``, has a hole, or reaches below what was
    sent goes block by block through the sender: blocks sent already are dropped,
    and the first that replaces sent ones carries the reorg's depth (a catch-up
    planned again below the subscriber's head: the sink must announce it, or a
    cardinal subscriber holds the new branch for ever, history checker seed 1156).
    A gap left after that raises :class:`ResumptionError`.
    """
    expected = pos if sender.sent else emits[0].num
    if emits[0].num == expected and emits[-1].num - expected + 1 == len(emits):
        if emits[0].num > sender.head:
            sender.extend(emits)
            return emits
        return sender.accepted(emits)
    emits = sender.accepted(emits)
    if emits and (emits[0].num != expected or emits[-1].num - expected + 1 != len(emits)):
        raise ResumptionError(
            f"history gap in the lake after block {expected - 1}",
            public=HISTORY_GAP,
        )
    return emits


class LakeCatchup:
    """Sends the lake's canonical blocks to one subscriber at a time; one per server."""

    def __init__(self, locator: Locator, turns: Turns, shared: SharedResults) -> None:
        self._locator = locator
        self._turns = turns
        self._shared = shared
        #: Catch-ups reading the lake now: the shared results are filled while two or more
        #: do, and read while they hold anything (the last one still reads what the others
        #: encoded ahead of it: a catch-up behind another is the one that gains).
        self._reading = 0

    async def send(
        self,
        history: History,
        pos: int,
        stop: int | None,
        keep: KeyTest | None,
        sink: BlockSink,
        sender: Sender,
        *,
        prefetched: tuple[Iterator[pa.Table], list[Emit]] | None = None,
    ) -> int:
        """Send the canonical blocks from ``pos`` (below ``stop``) into ``sink``; the next position.

        ``prefetched``: the pages already opened at ``pos`` and their first
        blocks (the plan's). :class:`ResumptionError` when the lake has a hole.
        """
        if prefetched is not None:
            pages, first = prefetched
        else:
            pages, first = self._locator.history_pages(history, pos, stop), None
        # The Arrow read (parquet, in C++) runs in a thread; the page is encoded here, in
        # slices of ENCODE_ROWS. Encoding in the thread as well made the decoding thread and
        # the writer (one send per frame) trade the GIL at every frame:
        # catchup_blocks_per_s of make bench B=resume, about 13% lower over six interleaved runs.
        # The next page is read while this one is encoded (one page ahead, no more): a
        # file's read then overlaps the encoding instead of stalling the catch-up.
        ahead = _PagesAhead(pages)
        shape = shape_of(keep)
        self._reading += 1
        try:
            ahead.start()
            while True:
                if first is not None:
                    emits, first = first, None
                else:
                    rows = await ahead.next_rows()
                    if rows is None:
                        return pos
                    async with Turn(self._turns):
                        fill = self._reading > 1
                        shared = self._shared if fill or len(self._shared) else None
                        emits = page_emits(rows, keep, shared, shape, fill=fill)
                pos = await _put(emits, pos, sink, sender)
        finally:
            self._reading -= 1
            if self._reading == 0:
                self._shared.clear()  # nobody reads: an idle server keeps none of it
            ahead.close()

    async def send_seam(
        self, seam: Seam, pos: int, keep: KeyTest | None, sink: BlockSink, sender: Sender
    ) -> int:
        """Send the seam's blocks from ``pos`` (those the lake does not mark canonical yet,
        read by hash: :mod:`pipeline.chain.history.seam`); the next position."""
        rows = seam.rows_from(pos)
        if not rows:
            return pos
        async with Turn(self._turns):
            emits = rows_emits(rows, keep)
        return await _put(emits, pos, sink, sender)


async def _put(emits: list[Emit], pos: int, sink: BlockSink, sender: Sender) -> int:
    """Put ``emits`` (read from ``pos`` up) into ``sink`` in order; the next position. Blocks
    sent before are dropped and count as passed; none at all: every block of the slice was
    skipped (see :func:`~pipeline.chain.history.lakepages.page_emits`)."""
    if not emits:
        return pos
    last = emits[-1].num
    emits = _in_order(emits, pos, sender)
    if emits:
        await sink.put(emits)
    return max(pos, last + 1)


__all__ = ["LakeCatchup"]
